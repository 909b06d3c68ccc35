#!/usr/bin/python3
"""What a stranger on the NATS bus can and cannot do to router replicas. Every scenario runs a
real nats-server (started here on a free loopback port) and real `kvrouter serve` replicas; the
forgeries are published with NATS's raw text protocol (NatsServer.publish: no client library,
the test is just another client of the server), as any process that can reach the server could.

  forged entry    a <ns>_routers entry naming another host: a joining replica never asks it
                  (no token, no index) unless allowed_peer_hosts names the host; then only the
                  peer key is sent, never the admin key, and an answer that is not a snapshot
                  is refused after its first bytes
  flood           a million forged adds for a live replica's id: the replica keeps serving its
                  own clients (peers' bookings are bounded apart from local ones), its memory
                  stays bounded, /ready says so when every request would be refused
  forged frees    FREE and PREFILL_DONE for a local booking, from any router id: ignored; a
                  forged add with an origin other than the batch's router: refused
  snapshot storm  snapshot requests beyond the rate limit are refused, counted
Usage: test_nats_trust.py <path to kvrouter>.
"""
import base64
import json
import os
import struct
import subprocess
import sys
import shutil
import tempfile
import time

from kvr_harness import (Child, FloodHttp, NatsServer, check, eventually, finish,
                         kill_children, proc_kib)

KVR = sys.argv[1]
BS = 16
WORKERS = ["--worker", "id=1", "--worker", "id=2", "--worker", "id=3"]
TTL_MS = 1500
TMP = tempfile.mkdtemp(prefix="kvr-nats-trust-")


def secret(name, value):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(value + "\n")
    os.chmod(path, 0o600)
    return path


def replica(nats, *extra, what="replica", sync=True, ttl_ms=TTL_MS):
    return Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--nats-url", nats.url,
                  "--router-replica-sync", "true" if sync else "false",
                  "--nats-presence-ttl-ms", ttl_ms, "--log-level", "info"] + WORKERS +
                 [str(a) for a in extra], what)


def ready(r, headers=None):
    return r.call("GET", "/ready", headers=headers)[0] == 200


def tokens(seed, n=64):
    return [(seed * 7919 + i) % 50000 for i in range(n)]


def forge_entry(nats, router_id, url):
    """A presence entry in <ns>_routers, as any NATS client can write one."""
    return nats.publish(f"$KV.kvrouter_routers.{router_id:016x}", json.dumps(
        {"router_id": f"{router_id:016x}", "url": url, "admin_url": url}).encode())


def scenario_forged_entry(nats):
    """A forged <ns>_routers entry gets neither the admin key nor a chance to feed an index."""
    admin = secret("admin.key", "admin-secret-" + "a" * 20)
    peer = secret("peer.key", "peer-secret-" + "p" * 20)
    trap = FloodHttp(256 << 20, host="127.0.0.2", length=True)
    r1 = r2 = None
    try:
        first = replica(nats, what="first replica (makes the buckets)")
        check("forged entry: the first replica is ready", eventually(lambda: ready(first), 15))
        first.stop()
        check("forged entry: nats-server took it", forge_entry(nats, 0xbad1, trap.url))
        r1 = replica(nats, "--admin-key-file", admin, "--peer-key-file", peer,
                     what="joining replica", ttl_ms=30000)
        check("forged entry: the joining replica is ready (cold)",
              eventually(lambda: ready(r1), 15))
        check("forged entry: the forged host was never asked", trap.seen == [], trap.seen)
        check("forged entry: counted", r1.metric("kvr_replicas_peer_urls_refused_total") == 1,
              r1.metric("kvr_replicas_peer_urls_refused_total"))
        check("forged entry: logged, naming the setting",
              "allowed_peer_hosts" in r1.stderr(), r1.stderr()[-1500:])
        r1.stop()
        # the operator allows that host: asked with the peer key alone; junk refused at once
        check("forged entry: written again", forge_entry(nats, 0xbad2, trap.url))
        r2 = replica(nats, "--admin-key-file", admin, "--peer-key-file", peer,
                     "--allowed-peer-hosts", "127.0.0.2", what="replica allowing 127.0.0.2",
                     ttl_ms=30000)
        check("allowed host: ready", eventually(lambda: ready(r2), 15))
        auths = [a for _, a in trap.seen]
        check("allowed host: asked for its snapshot", ("/v1/index/snapshot" in
              [p for p, _ in trap.seen]), trap.seen)
        check("allowed host: sent the peer key, never the admin key",
              auths and all(a == "Bearer peer-secret-" + "p" * 20 for a in auths), auths)
        check("allowed host: junk refused after its first bytes (not 256 MiB read)",
              eventually(lambda: trap.sent < (64 << 20), 5), trap.sent)
        err = r2.stderr()
        check("allowed host: the refusal is logged", "does not start as expected" in err,
              err[-1500:])
    finally:
        for r in (r1, r2):
            if r is not None:
                r.stop()
        trap.close()


def sync_msg(msg_type, router_id, seq, events, flags=0):
    """A replica-sync message (wire format in src/wire/sync_msg.h)."""
    return (b"KVRS" + struct.pack("<BBHQQQII", 1, msg_type, flags, router_id, seq,
                                  int(time.time() * 1e6), len(events), 0) + b"".join(events))


def ev_add(rid, origin, worker=1, isl=64, n_seq=2, bs=BS, base=0):
    rid = rid.encode()
    return (struct.pack("<BBH", 1, 0, len(rid)) + rid +
            struct.pack("<QQIIQQII", origin, worker, 0, bs, isl, 0, 0, n_seq) +
            b"".join(struct.pack("<Q", base + i + 1) for i in range(n_seq)))


def ev_end(kind, rid):
    rid = rid.encode()
    return struct.pack("<BBH", kind, 0, len(rid)) + rid


def my_id(r):
    st, body = r.call("GET", "/v1/routers")
    return int(body["self"], 16)


def route(r, rid, seed):
    return r.call("POST", "/v1/route", {"tokens": tokens(seed), "request_id": rid})


def active(r):
    st, body = r.call("POST", "/v1/loads", {"tokens": tokens(999, 32)})
    return sum(w["active_requests"] for w in body["loads"]) if st == 200 else -1


def flood(nats, router_id, origin, n, start_seq=1, per_msg=4000, tag="f"):
    """n forged adds in router_id's batches (numbered on from start_seq); True when all in."""
    ok, seq = True, start_seq
    for first in range(0, n, per_msg):
        evs = [ev_add(f"{tag}{origin:x}-{i}", origin, worker=1 + i % 3, base=i * 8)
               for i in range(first, min(n, first + per_msg))]
        ok = nats.publish("kvrouter.active_sequences", sync_msg(1, router_id, seq, evs)) and ok
        seq += 1
    return ok


def scenario_flood(nats):
    """A million-add flood, scaled down with the budgets: the replica keeps serving its own
    clients, peers' bookings stop at their budgets, memory stays bounded; a replica whose
    own budget is full says so on /ready."""
    a = replica(nats, "--router-max-requests", 50, "--router-sync-max-peer-requests", 6000,
                "--router-sync-max-requests-per-peer", 4000, "--router-sync-max-peer-blocks",
                40000, what="flooded replica")
    b = replica(nats, what="live peer")
    try:
        check("flood: both ready", eventually(lambda: ready(a) and ready(b), 15))
        b_id = my_id(b)
        rss0 = proc_kib(a.proc.pid)
        check("flood: published in a live peer's name and in a stranger's",
              flood(nats, b_id, b_id, 5000, start_seq=10**6) and
              flood(nats, 0xf00d, 0xf00d, 5000))
        check("flood: the peer budget holds (6000), one origin at most 4000",
              eventually(lambda: a.metric("kvr_requests_in_flight_peers") == 6000, 20),
              a.metric("kvr_requests_in_flight_peers"))
        check("flood: refusals counted", (a.metric("kvr_sync_peer_limited_total") or 0) >= 1000
              and (a.metric("kvr_sync_peer_budget_full_total") or 0) >= 1,
              (a.metric("kvr_sync_peer_limited_total"),
               a.metric("kvr_sync_peer_budget_full_total")))
        for i in range(50):  # the whole local budget is still there
            st, res = route(a, f"local-{i}", i)
            if st != 200:
                break
        check("flood: all 50 local requests admitted", st == 200, (i, st, res))
        check("flood: /ready says every request would be refused",
              (lambda x: x[0] == 503 and "router_max_requests" in json.dumps(x[1]))(
                  a.call("GET", "/ready")), a.call("GET", "/ready"))
        st, res = route(a, "local-50", 50)
        check("flood: the 51st is refused 429 (its own budget)", st == 429, (st, res))
        for i in range(50):
            a.call("DELETE", f"/v1/requests/local-{i}")
        check("flood: ready again once they end", eventually(lambda: ready(a), 5))
        check("flood: big adds bounded by their blocks (40000)",
              flood(nats, 0xb10c, 0xb10c, 100, per_msg=10, tag="big") and eventually(
                  lambda: (a.metric("kvr_requests_in_flight_peer_blocks") or 0) <= 40000, 5))
        rss1 = proc_kib(a.proc.pid)
        check("flood: memory bounded (RSS grew < 64 MiB)", rss1 - rss0 < 65536, (rss0, rss1))
        check("flood: the live peer is unharmed", ready(b) and route(b, "b-1", 1)[0] == 200)
    finally:
        a.stop()
        b.stop()


def scenario_forged_frees(nats):
    """Frees and first tokens from NATS end only the publishing router's own requests; an add
    in another router's name, or with impossible numbers, is refused; all counted."""
    a = replica(nats, what="replica")
    try:
        check("frees: ready", eventually(lambda: ready(a), 15))
        check("frees: a lone replica's join refuses nothing (NATS's no-responders status)",
              "not a snapshot" not in a.stderr() and
              (a.metric("kvr_sync_bad_messages_total") or 0) == 0, a.stderr()[-600:])
        a_id = my_id(a)
        check("frees: a local booking", route(a, "mine", 7)[0] == 200 and active(a) == 1)
        for rid in (0x77, a_id):  # a stranger's id, and the replica's own
            nats.publish("kvrouter.active_sequences",
                         sync_msg(1, rid, 1, [ev_end(3, "mine"), ev_end(2, "mine")]))
        check("frees: counted as not theirs",
              eventually(lambda: (a.metric("kvr_sync_unowned_events_total") or 0) >= 2, 5),
              a.metric("kvr_sync_unowned_events_total"))
        check("frees: the local booking is still there", active(a) == 1, active(a))
        nats.publish("kvrouter.active_sequences",
                     sync_msg(1, 0x88, 1, [ev_add("theirs", 0x99)]))
        check("frees: an add in another router's name is refused",
              eventually(lambda: a.metric("kvr_sync_forged_origin_total") == 1, 5) and
              active(a) == 1, (a.metric("kvr_sync_forged_origin_total"), active(a)))
        nats.publish("kvrouter.active_sequences", sync_msg(1, 0x88, 2, [
            ev_add("huge-isl", 0x88, isl=2**64 - 1), ev_add("bs0-too-many", 0x88, isl=32, n_seq=3),
            ev_add("bs-huge", 0x88, bs=2**31)]))
        check("frees: out-of-range adds refused",
              eventually(lambda: a.metric("kvr_sync_out_of_range_total") == 3, 5) and
              active(a) == 1, (a.metric("kvr_sync_out_of_range_total"), active(a)))
        nats.publish("kvrouter.active_sequences", sync_msg(1, 0x88, 3, [ev_add("ok", 0x88)]))
        check("frees: a well-formed peer add is applied", eventually(lambda: active(a) == 2, 5))
        nats.publish("kvrouter.active_sequences", sync_msg(1, 0x77, 4, [ev_end(3, "ok")]))
        check("frees: another router cannot end it",
              eventually(lambda: (a.metric("kvr_sync_unowned_events_total") or 0) >= 3, 5) and
              active(a) == 2)
        nats.publish("kvrouter.active_sequences", sync_msg(1, 0x88, 4, [ev_end(3, "ok")]))
        check("frees: its own router can", eventually(lambda: active(a) == 1, 5))
    finally:
        a.stop()


def routers_of(r):
    st, body = r.call("GET", "/v1/routers")
    return [p["router_id"] for p in body.get("routers", [])] if st == 200 else []


def scenario_forged_presence(nats):
    """A forged delete of a live replica's presence entry frees nothing (it still refreshes
    its entry: restored, counted); its real stop still frees its requests."""
    a = replica(nats, what="replica A")
    b = replica(nats, what="replica B")
    try:
        check("presence: ready", eventually(lambda: ready(a) and ready(b), 15))
        b_hex = f"{my_id(b):016x}"
        check("presence: A sees B", eventually(lambda: b_hex in routers_of(a), 10))
        check("presence: B's booking shows on A", route(b, "b-req", 3)[0] == 200 and
              eventually(lambda: active(a) == 1, 10))
        check("presence: a forged delete is accepted by nats-server",
              nats.publish(f"$KV.kvrouter_routers.{b_hex}", b"",
                           headers={"KV-Operation": "DEL"}))
        check("presence: A sees B refresh after the delete (restored, counted)", eventually(
            lambda: (a.metric("kvr_replicas_deletes_disowned_total") or 0) >= 1, 10),
            a.metric("kvr_replicas_deletes_disowned_total"))
        check("presence: B's request still counts on A, B still listed",
              active(a) == 1 and b_hex in routers_of(a), (active(a), routers_of(a)))
        b.stop()
        check("presence: B's real stop frees its request on A",
              eventually(lambda: active(a) == 0 and b_hex not in routers_of(a), 10),
              (active(a), routers_of(a)))
    finally:
        a.stop()
        b.stop()


def scenario_worker_hijack(nats):
    """A forged <ns>_workers value for a registered worker changes nothing (counted); the
    worker's own entry keeps it alive."""
    trap = FloodHttp(0, host="127.0.0.2")
    # long TTLs: the worker's own refresh (every third of it) must not undo a forgery the test
    # should see
    a = replica(nats, "--discovery", "nats", what="replica with discovery", ttl_ms=60000)
    reg = None
    try:
        check("hijack: ready", eventually(lambda: ready(a), 15))
        reg = subprocess.Popen([KVR, "register", "--nats-url", nats.url, "--worker",
                                "id=77,url=http://127.0.0.1:9", "--nats-presence-ttl-ms",
                                "60000"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

        def url77():
            for w in a.call("GET", "/v1/workers")[1].get("workers", []):
                if w["worker_id"] == 77:
                    return w.get("url")
            return None
        check("hijack: the worker is discovered", eventually(lambda: url77() is not None, 10))
        check("hijack: a forged value is accepted by nats-server",
              nats.publish("$KV.kvrouter_workers.77", json.dumps(
                  {"worker_id": 77, "url": trap.url}).encode()))
        check("hijack: the forged value reached the replica (refused, counted)", eventually(
            lambda: (a.metric("kvr_discovery_changes_refused_total") or 0) >= 1 or
            url77() != "http://127.0.0.1:9", 10), a.metric("kvr_discovery_changes_refused_total"))
        check("hijack: the worker keeps its url", url77() == "http://127.0.0.1:9", url77())
    finally:
        if reg is not None:
            reg.terminate()
            reg.wait(timeout=10)
        a.stop()
        trap.close()


def scenario_peer_table(nats):
    """256 router ids made up in sync batches fill the peer table; a real replica that comes
    next (it writes a presence entry) still gets in."""
    a = replica(nats, what="replica A", ttl_ms=60000)  # the made-up ones stay for the test
    c = None
    try:
        check("table: ready", eventually(lambda: ready(a), 15))
        for i in range(256):
            nats.publish("kvrouter.active_sequences", sync_msg(1, 0xabc000 + i, 1, []))
        check("table: the made-up routers fill it", eventually(
            lambda: len(routers_of(a)) == 256, 10), len(routers_of(a)))
        c = replica(nats, what="replica C")
        c_hex = f"{my_id(c):016x}"
        check("table: the real replica gets in", eventually(lambda: c_hex in routers_of(a), 10),
              len(routers_of(a)))
        check("table: a made-up one made room (counted)",
              (a.metric("kvr_replicas_evicted_total") or 0) >= 1)
    finally:
        a.stop()
        if c is not None:
            c.stop()


def scenario_snapshot_storm(nats):
    """Snapshot requests beyond the rate limit are refused and counted; the loop stays free."""
    a = replica(nats, what="replica")
    try:
        check("storm: ready", eventually(lambda: ready(a), 15))
        for i in range(40):
            nats.publish("kvrouter.sync.snapshot", sync_msg(2, 0x5000 + i, 0, []),
                         reply=f"kvrouter.sync.reply.{0x5000 + i:016x}")
        check("storm: at most 8 (+1 a 2 s) served, the rest refused",
              eventually(lambda: (a.metric("kvr_sync_snapshot_requests_refused_total") or 0) >= 28,
                         10) and (a.metric("kvr_sync_snapshots_served_total") or 0) <= 12,
              (a.metric("kvr_sync_snapshots_served_total"),
               a.metric("kvr_sync_snapshot_requests_refused_total")))
        check("storm: still serving", ready(a) and route(a, "after", 3)[0] == 200)
    finally:
        a.stop()


# ---- NATS with authentication, per-role permissions and TLS ----

def _crc16(data):
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
    return crc


def _b32(raw):
    return base64.b32encode(raw).decode().rstrip("=")


class NKeyUser:
    """An nkey user made here (ed25519 from python3-cryptography, NATS's encoding)."""

    def __init__(self):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives import serialization as ser
        self.key = Ed25519PrivateKey.generate()
        raw = self.key.private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw,
                                     ser.NoEncryption())
        pub = self.key.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
        user, seed = 20 << 3, 18 << 3
        s = bytes([seed | user >> 5, (user & 31) << 3]) + raw
        self.seed = _b32(s + struct.pack("<H", _crc16(s)))
        p = bytes([user]) + pub
        self.public = _b32(p + struct.pack("<H", _crc16(p)))

    def file(self, name):
        return secret(name, f"{self.seed}\n{self.public}")

    def connect_line(self, info):
        nonce = json.loads(info[5:])["nonce"].encode()
        sig = base64.urlsafe_b64encode(self.key.sign(nonce)).decode().rstrip("=")
        return json.dumps({"nkey": self.public, "sig": sig, "verbose": False,
                           "pedantic": False}).encode()


def raw_publish(port, subject, payload, user=None):
    """Publishes as a stranger (raw protocol), as user when given; the server's answer lines."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        f = sock.makefile("rb")
        info = f.readline().decode()
        conn = user.connect_line(info) if user else b'{"verbose":false,"pedantic":false}'
        sock.sendall(b"CONNECT " + conn + b"\r\nPUB " + subject.encode() + b" " +
                     str(len(payload)).encode() + b"\r\n" + payload + b"\r\nPING\r\n")
        out = []
        while True:
            line = f.readline().decode(errors="replace").strip()
            out.append(line)
            if not line or line.startswith("PONG") or "Authorization Violation" in line:
                return out


ROLES_CONF = """
listen: 127.0.0.1:{port}
jetstream { store_dir: "{store}" }
authorization {
  users = [
    { nkey: ROUTER, permissions: {
        publish: ["kvrouter.>", "$KV.kvrouter_routers.>", "$JS.API.INFO",
                  "$JS.API.STREAM.NAMES", "$JS.API.STREAM.INFO.KV_kvrouter_routers",
                  "$JS.API.STREAM.INFO.KV_kvrouter_workers",
                  "$JS.API.STREAM.CREATE.KV_kvrouter_routers",
                  "$JS.API.STREAM.CREATE.KV_kvrouter_workers",
                  "$JS.API.CONSUMER.*.KV_kvrouter_routers.>",
                  "$JS.API.CONSUMER.*.KV_kvrouter_workers.>",
                  "$JS.API.CONSUMER.*.KV_kvrouter_routers",
                  "$JS.API.CONSUMER.*.KV_kvrouter_workers",
                  "$JS.API.DIRECT.GET.KV_kvrouter_routers.>",
                  "$JS.API.DIRECT.GET.KV_kvrouter_workers.>", "_INBOX.>"],
        subscribe: ["kvrouter.>", "_INBOX.>", "$KV.kvrouter_routers.>",
                    "$KV.kvrouter_workers.>"] } }
    { nkey: WORKER, permissions: {
        publish: ["$KV.kvrouter_workers.>", "$JS.API.INFO",
                  "$JS.API.STREAM.INFO.KV_kvrouter_workers",
                  "$JS.API.STREAM.CREATE.KV_kvrouter_workers"],
        subscribe: ["_INBOX.>"] } }
  ]
}
"""


def scenario_roles():
    """The recommended server set-up: every client authenticated (nkeys), routers and workers
    with their own publish and subscribe permissions. Replicas sync and discover workers with
    it; a stranger cannot connect; a worker's identity cannot publish a sync batch."""
    router_u, worker_u = NKeyUser(), NKeyUser()
    nats = NatsServer(ROLES_CONF.replace("ROUTER", router_u.public)
                      .replace("WORKER", worker_u.public))
    rkey, wkey = router_u.file("router.nk"), worker_u.file("worker.nk")
    a = b = m = None
    try:
        a = replica(nats, "--nats-nkey-file", rkey, "--discovery", "nats", what="replica A")
        b = replica(nats, "--nats-nkey-file", rkey, "--discovery", "nats", what="replica B")
        check("roles: both replicas ready with their nkey",
              eventually(lambda: ready(a) and ready(b), 20),
              (a.call("GET", "/ready"), a.stderr()[-1500:]))
        check("roles: they see each other", eventually(
            lambda: len(a.call("GET", "/v1/routers")[1].get("routers", [])) == 1, 10))
        check("roles: a booking on A shows on B", route(a, "r1", 1)[0] == 200 and
              eventually(lambda: active(b) == 1, 10), active(b))
        m = Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--block-size", BS,
                   "--nats-url", nats.url, "--nats-nkey-file", wkey, "--worker-id", "42"],
                  "mocker with the worker's nkey")
        check("roles: a worker registers with its own identity", eventually(
            lambda: any(w["worker_id"] == 42 for w in a.call("GET", "/v1/workers")[1]
                        .get("workers", [])), 15))
        got = raw_publish(nats.port, "kvrouter.active_sequences",
                          sync_msg(1, 0x66, 1, [ev_end(3, "r1")]), user=worker_u)
        check("roles: the worker's identity may not publish a sync batch",
              any("Permissions Violation" in x for x in got), got)
        got = raw_publish(nats.port, "kvrouter.active_sequences",
                          sync_msg(1, 0x66, 1, [ev_end(3, "r1")]))
        check("roles: a stranger cannot even connect",
              any("Authorization Violation" in x for x in got), got)
        check("roles: the booking stands", active(a) == 1 and active(b) == 1)
        bad = subprocess.Popen([KVR, "serve", "--http-port", "0", "--nats-url", nats.url,
                                "--router-replica-sync", "true", "--log-level", "info"] +
                               WORKERS, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True)
        try:
            out, err = bad.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            bad.kill()
            out, err = bad.communicate()
        check("roles: a replica without credentials stops at start, saying why",
              bad.returncode != 0 and "Authorization Violation" in err, (bad.returncode,
                                                                          err[-800:]))
    except RuntimeError:  # a process that did not start: the server's side of it too
        print(nats.server_log()[-3000:], file=sys.stderr)
        raise
    finally:
        for x in (a, b, m):
            if x is not None:
                x.stop()
        nats.stop()


def make_certs():
    """A CA, a server certificate for 127.0.0.1 and a client certificate (openssl CLI)."""
    d = os.path.join(TMP, "pki")
    os.makedirs(d, exist_ok=True)

    def run(*a):
        subprocess.run(["openssl"] + list(a), check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=kvrouter test CA")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"),
                      ("client", "extendedKeyUsage=clientAuth")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}")
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return {k: os.path.join(d, k) for k in ("ca.pem", "server.pem", "server.key", "client.pem",
                                             "client.key")}


def start_fails(args):
    p = subprocess.run([KVR, "serve", "--http-port", "0"] + [str(a) for a in args] + WORKERS,
                       capture_output=True, text=True, timeout=30)
    return p.returncode != 0, p.stderr[-600:]


def scenario_tls():
    """NATS over TLS with client certificates: replicas with the CA and their certificate sync;
    one without TLS, or without a client certificate, is refused at start with the reason."""
    c = make_certs()
    nats = NatsServer(f"""
listen: 127.0.0.1:{{port}}
jetstream {{ store_dir: "{{store}}" }}
tls {{ cert_file: "{c['server.pem']}", key_file: "{c['server.key']}",
       ca_file: "{c['ca.pem']}", verify: true, timeout: 2 }}
""")
    tls = ["--nats-tls-ca", c["ca.pem"], "--nats-tls-cert", c["client.pem"], "--nats-tls-key",
           c["client.key"]]
    a = b = None
    try:
        a = replica(nats, *tls, what="TLS replica A")
        b = replica(nats, *tls, what="TLS replica B")
        check("tls: both ready", eventually(lambda: ready(a) and ready(b), 20),
              a.stderr()[-800:])
        check("tls: a booking on A shows on B", route(a, "t1", 1)[0] == 200 and
              eventually(lambda: active(b) == 1, 10), active(b))
        failed, err = start_fails(["--nats-url", nats.url, "--router-replica-sync", "true"])
        check("tls: a replica without TLS is refused at start, saying why",
              failed and "refused this process" in err, err)
        failed, err = start_fails(["--nats-url", nats.url, "--router-replica-sync", "true",
                                   "--nats-tls-ca", c["ca.pem"]])
        check("tls: a replica without a client certificate is refused at start",
              failed and "refused this process" in err, err)
    finally:
        for x in (a, b):
            if x is not None:
                x.stop()
        nats.stop()


def scenario_bad_auth_settings():
    """Credentials settings are checked at start, the setting named; a secret in the url is
    warned about."""
    nats = NatsServer()
    tok = secret("nats.token", "tok-" + "t" * 20)
    half = secret("half.nk", "SU" + "A" * 56)
    try:
        for args, want in (
                (["--nats-token-file", tok, "--nats-nkey-file", half], "give one"),
                (["--nats-nkey-file", half], "holds no public key"),
                (["--nats-token-file", os.path.join(TMP, "absent")], "--nats-token-file"),
                (["--nats-tls-cert", tok], "--nats-tls-key")):
            p = subprocess.run([KVR, "serve", "--http-port", "0", "--nats-url", nats.url] +
                               args + WORKERS, capture_output=True, text=True, timeout=30)
            check(f"bad auth settings: {args[0]}... refused at start naming it",
                  p.returncode != 0 and want in p.stderr, (p.returncode, p.stderr[-500:]))
        r = Child([KVR, "serve", "--http-port", "0", "--nats-url",
                   nats.url.replace("nats://", "nats://user:hunter2@"), "--log-level", "info"] +
                  WORKERS, "router with a password in its url")
        check("bad auth settings: a password in the url is warned about", eventually(
            lambda: "carries credentials" in r.stderr(), 5), r.stderr()[-500:])
        r.stop()
    finally:
        nats.stop()


def main():
    try:
        scenario_bad_auth_settings()
        scenario_roles()
        scenario_tls()
        nats = NatsServer()
        try:
            scenario_forged_entry(nats)
            scenario_forged_frees(nats)
            scenario_flood(nats)
            scenario_snapshot_storm(nats)
            scenario_forged_presence(nats)
            scenario_worker_hijack(nats)
            scenario_peer_table(nats)
        finally:
            kill_children()
            nats.stop()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)  # its keys and certificates go with the test
    finish()


if __name__ == "__main__":
    main()
