#!/usr/bin/python3
"""Router replicas over a real nats-server (started here on a free loopback port, JetStream on,
a temporary store, killed at the end): replica sync of active load, the snapshot a late replica
joins with, a peer that dies, a NATS outage while requests flow, and bad input on every subject
and bucket. Usage: test_replicas.py <path to kvrouter>.
"""
import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from kvr_harness import (Child, NatsServer, check, eventually, finish, kill_children,
                         free_ports, with_free_ports)

KVR = sys.argv[1]
BS = 16
WORKERS = ["--worker", "id=1", "--worker", "id=2", "--worker", "id=3"]
TTL_MS = 1500


def replica(nats, *extra):
    return Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--nats-url", nats.url,
                  "--router-replica-sync", "true", "--nats-presence-ttl-ms", TTL_MS,
                  "--log-level", "info"] + WORKERS + [str(a) for a in extra], "replica")


def tokens(seed, n=256):
    return [(seed * 7919 + i) % 50000 for i in range(n)]


def loads(r, seed=999):
    """{worker_id: active_requests} as r sees it."""
    st, body = r.call("POST", "/v1/loads", {"tokens": tokens(seed, 32)})
    if st != 200:
        return {}
    return {w["worker_id"]: w["active_requests"] for w in body["loads"]}


def route(r, rid, seed, **kw):
    body = {"tokens": tokens(seed), "request_id": rid}
    body.update(kw)
    st, res = r.call("POST", "/v1/route", body)
    check(f"route {rid} answered 200", st == 200, (st, res))
    return res


def free(r, rid):
    st, _ = r.call("DELETE", f"/v1/requests/{rid}")
    return st


def ready(r):
    return r.call("GET", "/ready")[0] == 200


def peers(r):
    st, body = r.call("GET", "/v1/routers")
    return [p["router_id"] for p in body["routers"]] if st == 200 else []


def sync_figures(r):
    """What a replica's sync counted, for a failure's message."""
    return {f"{n}{l}": v for n, l, v in r.metrics()
            if n.startswith("kvr_sync_") and not n.startswith("kvr_sync_lag") and v}


def scenario_sync(nats):
    """A booking on A shows in B's loads; B avoids the worker A loaded; A's free frees it on B;
    a first token on A ends its prefill tokens on B."""
    a, b = replica(nats), replica(nats)
    try:
        check("both replicas ready", eventually(lambda: ready(a) and ready(b), 15))
        check("each lists the other in /v1/routers",
              eventually(lambda: len(peers(a)) == 1 and len(peers(b)) == 1, 10),
              (peers(a), peers(b)))
        res = route(a, "s-1", 1)
        w = res["worker_id"]
        check("a booking on A shows in B's loads",
              eventually(lambda: loads(b).get(w) == 1, 5), loads(b))
        # B's next decisions avoid the worker A loaded (three workers, two more requests)
        picks = {route(b, f"s-b{i}", 100 + i)["worker_id"] for i in range(2)}
        check("B spreads around the worker loaded through A", w not in picks, (w, picks))
        _, before = b.call("POST", "/v1/loads", {"tokens": tokens(7, 32)})
        pre = next(x for x in before["loads"] if x["worker_id"] == w)
        st, _ = a.call("POST", "/v1/requests/s-1/first_token")
        check("first token on A answered", st == 200, st)

        def prefill_gone():
            _, now = b.call("POST", "/v1/loads", {"tokens": tokens(7, 32)})
            cur = next(x for x in now["loads"] if x["worker_id"] == w)
            return cur["potential_prefill_tokens"] < pre["potential_prefill_tokens"]
        check("A's first token ends the prefill load on B", eventually(prefill_gone, 5))
        check("free on A answered 200", free(a, "s-1") == 200)
        check("A's free frees it on B", eventually(lambda: loads(b).get(w) == 0, 5), loads(b))
        for i in range(2):
            free(b, f"s-b{i}")
        check("B's frees reach A", eventually(lambda: sum(loads(a).values()) == 0, 5), loads(a))
        check("B counts A's events as applied",
              (b.metric("kvr_sync_applied_events_total", kind="add") or 0) >= 1 and
              (b.metric("kvr_sync_applied_events_total", kind="free") or 0) >= 1)
        lag = b.metric("kvr_sync_lag_seconds_count")
        check("B measures the sync lag", lag is not None and lag >= 1, lag)
        _, w_b = b.call("GET", "/v1/workers")
        check("/v1/workers says nats: connected", w_b.get("nats") == "connected", w_b.get("nats"))
    finally:
        a.stop()
        b.stop()


def scenario_late_joiner(nats):
    """A replica started after requests were booked gets them from a peer's snapshot."""
    a = replica(nats)
    try:
        check("A ready", eventually(lambda: ready(a), 15))
        booked = {}
        for i in range(20):
            booked[f"late-{i}"] = route(a, f"late-{i}", 200 + i)["worker_id"]
        c = replica(nats)
        check("the late replica is ready once joined", eventually(lambda: ready(c), 15))
        want = {w: sum(1 for x in booked.values() if x == w) for w in (1, 2, 3)}
        check("the late replica counts the requests already in flight",
              eventually(lambda: loads(c) == want, 5), (loads(c), want))
        check("it joined by a snapshot", (c.metric("kvr_sync_snapshot_entries_total") or 0) == 20,
              c.metric("kvr_sync_snapshot_entries_total"))
        for rid in booked:
            free(a, rid)
        check("A's frees reach the late replica",
              eventually(lambda: sum(loads(c).values()) == 0, 5), loads(c))
        c.stop()
    finally:
        a.stop()


def scenario_peer_dies(nats):
    """A replica killed without cleanup: the others free its requests once its presence
    expires (nats_presence_ttl_ms)."""
    a, b = replica(nats), replica(nats)
    try:
        check("both ready", eventually(lambda: ready(a) and ready(b), 15))
        for i in range(5):
            route(a, f"dead-{i}", 300 + i)
        check("B sees A's five", eventually(lambda: sum(loads(b).values()) == 5, 5), loads(b))
        a.kill()
        t0 = time.monotonic()
        check("B frees the dead replica's requests",
              eventually(lambda: sum(loads(b).values()) == 0, 15), loads(b))
        took = time.monotonic() - t0
        check("... after its presence TTL, not at once", took >= TTL_MS / 1000 * 0.5, took)
        check("B no longer lists it", eventually(lambda: peers(b) == [], 5), peers(b))
        check("B counts them as freed for a gone peer",
              b.metric("kvr_sync_peer_requests_freed_total", why="peer_gone") == 5)
    finally:
        b.stop()


def scenario_nats_outage(nats):
    """nats-server killed for 10 s while both replicas route: no request fails; the loss shows
    in /metrics, /health and /v1/workers; once NATS is back the replicas reconverge."""
    a, b = replica(nats), replica(nats)
    failures, done = [], [0]
    stop = threading.Event()

    def client(r, tag):
        i = 0
        while not stop.is_set():
            rid = f"{tag}-{i}"
            try:  # a client that dies is a failure to see, not a silent stop
                st, body = r.call("POST", "/v1/route", {"tokens": tokens(i, 64),
                                                        "request_id": rid})
                if st != 200:
                    failures.append((rid, st, body))
                elif free(r, rid) != 200:
                    failures.append((rid, "free"))
            except OSError as e:
                failures.append((rid, repr(e)))
                return
            done[0] += 1
            i += 1
    try:
        check("both ready", eventually(lambda: ready(a) and ready(b), 15))
        threads = [threading.Thread(target=client, args=(r, t)) for r, t in ((a, "oa"), (b, "ob"))]
        for t in threads:
            t.start()
        nats.kill()
        check("A shows nats disconnected in /health",
              eventually(lambda: "nats: disconnected" in a.call("GET", "/health")[1], 10),
              a.call("GET", "/health"))
        _, wk = b.call("GET", "/v1/workers")
        check("B's /v1/workers says nats disconnected",
              eventually(lambda: b.call("GET", "/v1/workers")[1].get("nats") == "disconnected",
                         10))
        check("/metrics counts the disconnect", (a.metric("kvr_nats_disconnects_total") or 0) >= 1
              and a.metric("kvr_nats_connected") == 0)
        n0 = done[0]
        time.sleep(10)  # the outage itself (what is measured is that requests kept flowing)
        check("requests kept flowing during the outage", done[0] > n0 + 20, (n0, done[0]))
        # a request booked on A during the outage, still in flight when NATS returns
        route(a, "outage-held", 4242)
        nats.start()
        check("A reconnects", eventually(lambda: a.metric("kvr_nats_connected") == 1, 20))
        check("B reconnects", eventually(lambda: b.metric("kvr_nats_connected") == 1, 20))
        stop.set()
        for t in threads:
            t.join(timeout=30)
        check("no request failed because of the outage", failures == [], failures[:5])
        check("the replicas reconverge: B sees the request A holds",
              eventually(lambda: sum(loads(b).values()) == 1, 10), (loads(b), sync_figures(b)))
        check("A frees it", free(a, "outage-held") == 200)
        check("... and B with it", eventually(lambda: sum(loads(b).values()) == 0, 10),
              (loads(b), sync_figures(b)))
        check("they list each other again",
              eventually(lambda: len(peers(a)) == 1 and len(peers(b)) == 1, 10))
    finally:
        stop.set()
        a.stop()
        b.stop()


def discovering(nats, *extra):
    return Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--nats-url", nats.url,
                  "--discovery", "nats", "--nats-presence-ttl-ms", TTL_MS, "--min-initial-workers",
                  0, "--log-level", "info"] + [str(a) for a in extra], "discovering replica")


def mocker(nats, worker_id, ports=None):
    """A mocker registering itself as worker_id (KV events on fixed free ports, so a restart
    comes back on the same ones). Returns (child, ports)."""
    def start(ev, replay, http):
        return Child([KVR, "mocker", "--host", "127.0.0.1", "--port", http, "--speedup", "100",
                      "--block-size", BS, "--nats-url", nats.url, "--worker-id", worker_id,
                      "--nats-presence-ttl-ms", TTL_MS, "--kv-events-config",
                      json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                  "endpoint": f"tcp://*:{ev}",
                                  "replay_endpoint": f"tcp://*:{replay}"})], "mocker")
    if ports is not None:
        return start(*ports), ports
    ports, m = with_free_ports(start, 1, 1, 1)
    return m, tuple(ports)


def worker_ids(r):
    st, body = r.call("GET", "/v1/workers")
    return sorted(w["worker_id"] for w in body["workers"]) if st == 200 else None


def chat(r):
    st, body = r.call("POST", "/v1/chat/completions", {
        "model": "kvrouter-mocker", "max_tokens": 4,
        "messages": [{"role": "user", "content": "tell me about routers"}]})
    return st


def scenario_discovery(nats):
    """Workers registered through discovery receive traffic on every replica; one killed
    without cleanup is dropped within its TTL and comes back when restarted; `kvrouter
    register` does the same for an engine that knows nothing of NATS; bad entries are counted."""
    a, b = discovering(nats), discovering(nats, "--worker", "id=1")
    m, ports = mocker(nats, 7)
    try:
        check("both replicas register the mocker",
              eventually(lambda: worker_ids(a) == [7] and worker_ids(b) == [1, 7], 10),
              (worker_ids(a), worker_ids(b)))
        check("a chat through A is served by it", chat(a) == 200)
        served = m.metric("vllm:request_success_total") or 0
        check("... the mocker served it", served >= 1, served)
        m.kill()
        t0 = time.monotonic()
        check("a mocker killed without cleanup is dropped by both replicas",
              eventually(lambda: worker_ids(a) == [] and worker_ids(b) == [1], 15),
              (worker_ids(a), worker_ids(b)))
        took = time.monotonic() - t0
        check("... after its TTL, not before", took >= TTL_MS / 1000 * 0.5, took)
        check("A answers 503 with no worker", chat(a) == 503)
        m, _ = mocker(nats, 7, ports)
        check("restarted, it is back on both",
              eventually(lambda: worker_ids(a) == [7] and worker_ids(b) == [1, 7], 10),
              (worker_ids(a), worker_ids(b)))
        check("and receives traffic again", eventually(lambda: chat(a) == 200, 10))
        check("the expiry is counted",
              a.metric("kvr_discovery_events_total", kind="expired") == 1)
        # an engine without NATS, registered by the sidecar
        plain = Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--speedup", "100"],
                      "plain mocker")
        reg = subprocess.Popen([KVR, "register", "--nats-url", nats.url, "--nats-presence-ttl-ms",
                                str(TTL_MS), "--worker", f"id=8,url={plain.url}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL)
        line = reg.stdout.readline().decode()
        check("register says what it registered", "registered worker 8" in line, line)
        check("the sidecar's worker appears",
              eventually(lambda: worker_ids(a) == [7, 8], 10), worker_ids(a))
        reg.send_signal(signal.SIGTERM)
        check("register exits 0 on SIGTERM", reg.wait(timeout=15) == 0, reg.stderr.read())
        check("its entry deleted, the worker goes",
              eventually(lambda: worker_ids(a) == [7], 5), worker_ids(a))
        check("... by the delete, not by expiry",
              a.metric("kvr_discovery_events_total", kind="deleted") == 1 and
              a.metric("kvr_discovery_events_total", kind="expired") == 1,
              (a.metric("kvr_discovery_events_total", kind="deleted"),
               a.metric("kvr_discovery_events_total", kind="expired")))
        plain.stop()
        # bad entries: not an id, undecodable, id mismatch, a block-size mismatch in a model,
        # a worker registered by --worker
        for key, val in (("abc", b"{}"), ("12", b"[1,2"), ("13", b'{"worker_id": 14}'),
                         ("15", json.dumps({"worker_id": 15, "model": "kvrouter-mocker",
                                            "block_size": 32}).encode()),
                         ("1", b'{"worker_id": 1}')):
            nats.publish(f"$KV.kvrouter_workers.{key}", val)
        check("bad entries are counted on A",
              eventually(lambda: (a.metric("kvr_discovery_refused_total") or 0) >= 4, 5),
              a.metric("kvr_discovery_refused_total"))
        check("the static worker's entry is a conflict on B",
              eventually(lambda: (b.metric("kvr_discovery_conflicts_total") or 0) >= 1, 5))
        check("none of the bad ones was registered (entry 1 is a plain worker on A)",
              eventually(lambda: worker_ids(a) == [1, 7], 5) and worker_ids(b) == [1, 7],
              (worker_ids(a), worker_ids(b)))
        check("B keeps its static worker", 1 in worker_ids(b))
    finally:
        m.stop()
        a.stop()
        b.stop()


def plain_mocker(buffer_steps):
    """A mocker (no NATS) whose engine keeps only buffer_steps batches for replay."""
    def start(ev, replay):
        return Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--speedup", "100",
                      "--block-size", BS, "--kv-events-config",
                      json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                  "endpoint": f"tcp://*:{ev}", "replay_endpoint": f"tcp://*:{replay}",
                                  "buffer_steps": buffer_steps})], "mocker")
    (ev, replay), m = with_free_ports(start, 1, 1)
    m.spec = f"id=4,url={m.url},events=tcp://127.0.0.1:{ev},replay=tcp://127.0.0.1:{replay}"
    return m


def dump(r):
    st, body = r.call("GET", "/v1/dump")
    return json.dumps(body, sort_keys=True) if st == 200 else None


def scenario_late_index(nats):
    """A replica started late loads the index from a peer (found in <ns>_routers, or named by
    --peers): its /v1/dump equals the peer's, although the engine's replay buffer no longer
    holds the early events (a router started cold lacks them)."""
    m = plain_mocker(4)
    a = Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--nats-url", nats.url,
               "--router-replica-sync", "true", "--worker", m.spec], "replica A")
    late = cold = named = None
    try:
        check("A ready", eventually(lambda: ready(a), 15))
        for i in range(30):
            st, _ = a.call("POST", "/v1/completions", {
                "model": "kvrouter-mocker", "max_tokens": 2,
                "prompt": f"document {i}: " + "a long shared preamble of many words " * 6})
            check(f"completion {i} answered", st == 200, st)

        seen = []

        def quiet_dump():  # the same dump on five polls in a row: events are quiet
            seen.append(dump(a))
            return seen[-1] if len(seen) >= 5 and len(set(seen[-5:])) == 1 else None
        a_dump = eventually(quiet_dump, 10, interval=0.05)
        check("A's index is quiet", a_dump is not None)
        late = Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--nats-url", nats.url,
                      "--router-replica-sync", "true", "--worker", m.spec], "late replica")
        check("the late replica is ready", eventually(lambda: ready(late), 15))
        check("its index equals A's (loaded from A)",
              eventually(lambda: dump(late) == a_dump, 10),
              (len(dump(late) or ""), len(a_dump)))
        check("its /health says where the index came from",
              "index: peer " + a.url in late.call("GET", "/health")[1], late.call("GET", "/health"))
        named = Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--peers", a.url,
                       "--worker", m.spec], "replica with --peers")
        check("--peers loads it too", eventually(lambda: dump(named) == a_dump, 10))
        cold = Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--worker", m.spec],
                     "cold router")
        check("a cold router cannot rebuild it from the engine's replay buffer",
              eventually(lambda: dump(cold) is not None, 5) and dump(cold) != a_dump and
              len(dump(cold)) < len(a_dump), (len(dump(cold) or ""), len(a_dump)))
        _, wk = cold.call("GET", "/v1/workers")
        check("... and says it started cold", wk.get("index_origin", "").startswith("cold"),
              wk.get("index_origin"))
    finally:
        for r in (late, named, cold, a, m):
            if r is not None:
                r.stop()


def scenario_started_together(nats):
    """Three replicas started at the same instant (after a fleet ran before them, so the
    buckets exist): none waits on another for an index the other cannot send yet; each serves
    at once (cold) and they find each other."""
    old = replica(nats)
    check("together: a fleet ran before", eventually(lambda: ready(old), 15))
    old.stop()
    procs = [subprocess.Popen([KVR, "serve", "--http-port", "0", "--block-size", str(BS),
                               "--nats-url", nats.url, "--router-replica-sync", "true",
                               "--nats-presence-ttl-ms", str(TTL_MS), "--log-level", "warn"] +
                              WORKERS + ["--worker", "id=9,events=tcp://127.0.0.1:1"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL, text=True) for _ in range(3)]
    try:
        t0 = time.monotonic()
        lines = [p.stdout.readline() for p in procs]  # each prints it once serving
        took = time.monotonic() - t0
        check("together: all three serve within 10 s (not after a peer's 30 s timeout)",
              all(x.startswith("listening ") for x in lines) and took < 10, (took, lines))
        import http.client

        def n_peers(line):
            host, port = line.split()[1].rsplit(":", 1)
            c = http.client.HTTPConnection(host, int(port), timeout=10)
            c.request("GET", "/v1/routers")
            body = json.loads(c.getresponse().read())
            c.close()
            return len(body["routers"])
        check("together: they find each other",
              eventually(lambda: all(n_peers(x) == 2 for x in lines), 10))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def scenario_restarted_together(nats):
    """Two replicas on fixed ports, killed, then started again together on the same ports
    (a pasted quickstart run twice): each finds the other's stale presence entry (and its own),
    whose url now points at a router that is itself looking for a snapshot. Neither may wait on
    the other: each serves at once, a router still loading answers a peer's snapshot request
    503, and both are ready, cold, within seconds (before, both hung 30 s)."""
    ports = [free_ports(1) for _ in range(2)]

    def start(port):
        return Child([KVR, "serve", "--http-port", port, "--block-size", BS, "--nats-url",
                      nats.url, "--nats-presence-ttl-ms", "60000", "--log-level", "info"] + WORKERS,
                     f"replica :{port}")
    first = [start(p) for p in ports]
    check("restarted: both listed", eventually(lambda: all(
        len(r.call("GET", "/v1/routers")[1]["routers"]) == 1 for r in first), 10))
    for r in first:
        r.kill()  # their presence entries stay (60 s)
    second, errs = [None, None], []

    def go(i):
        try:
            second[i] = start(ports[i])
        except Exception as e:  # noqa: BLE001 (reported below)
            errs.append(e)
    t0 = time.monotonic()
    ths = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    try:
        check("restarted: both start", not errs and all(second), errs)
        if errs or not all(second):
            return

        def origin(r):
            return r.call("GET", "/v1/workers", timeout=10)[1].get("index_origin", "")
        # ready: cold, or loaded from the other once that one was ready itself
        check("restarted: both ready within 10 s, waiting on nobody",
              eventually(lambda: all(origin(r).startswith(("cold: only events", "peer "))
                                     for r in second), 10) and time.monotonic() - t0 < 15,
              [origin(r) for r in second])
        check("restarted: a router loading its own index answers a peer 503 at once",
              any("answered 503 (it is loading its own index)" in r.stderr() for r in second),
              [r.stderr()[-1500:] for r in second])
    finally:
        for r in second:
            if r is not None:
                r.stop()


def sync_header(msg_type, router_id, seq, n_events, flags=0):
    return b"KVRS" + struct.pack("<BBHQQQII", 1, msg_type, flags, router_id, seq, 0, n_events, 0)


def sync_add(rid, origin, worker_id, isl=32):
    return (struct.pack("<BBH", 1, 0, len(rid)) + rid +
            struct.pack("<QQIIQQII", origin, worker_id, 0, 16, isl, 0, 0, 0))


def sync_free(rid):
    return struct.pack("<BBH", 3, 0, len(rid)) + rid


class FakeResponder:
    """A stranger on the bus playing a peer router: subscribed to snapshot requests with NATS's
    text protocol, it answers the first one as the test says."""

    def __init__(self, nats):
        self.sock = socket.create_connection(("127.0.0.1", nats.port), timeout=15)
        self.f = self.sock.makefile("rb")
        self.f.readline()  # INFO
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\n'
                          b"SUB kvrouter.sync.snapshot 1\r\nPING\r\n")
        self.expect_pong()

    def expect_pong(self):
        while True:
            line = self.f.readline()
            if line.startswith(b"PONG") or not line:
                return line.startswith(b"PONG")
            if line.startswith(b"PING"):
                self.sock.sendall(b"PONG\r\n")

    def next_request(self, sent_after=0.0):
        """The reply subject of the next snapshot request sent (its header's wall clock) at or
        after the time sent_after (time.time()'s): older ones are skipped. None when none
        comes within the socket's timeout (the connection is then of no more use: later calls
        return None at once)."""
        while self.f is not None:
            try:
                line = self.f.readline()
            except socket.timeout:
                self.f = None
                return None
            if not line:
                raise RuntimeError("nats closed the connection")
            if line.startswith(b"PING"):
                self.sock.sendall(b"PONG\r\n")
            elif line.startswith(b"MSG "):
                parts = line.split()
                body = self.f.read(int(parts[-1]) + 2)
                sent_us = struct.unpack_from("<Q", body, 24)[0] if len(body) >= 34 else 0
                if sent_us >= int(sent_after * 1e6):
                    return parts[3].decode()

    def publish(self, subject, payload):
        self.sock.sendall(f"PUB {subject} {len(payload)}\r\n".encode() + payload + b"\r\n")

    def close(self):
        self.sock.close()


def scenario_snapshot_covers_held(nats):
    """A joining replica holds the batches peers publish while it waits for its snapshot. Those
    the responder published before answering are in its snapshot already: an add among them
    whose free was lost (a NATS outage) must not come back after the snapshot and stay booked
    forever; the responder's later batches apply, their numbers following on without a loss."""
    fake_id = 0x5EED
    fake = FakeResponder(nats)
    b = None
    try:
        # the fake never writes a presence entry: a long TTL keeps it a peer through the test
        b = Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--nats-url", nats.url,
                   "--router-replica-sync", "true", "--nats-presence-ttl-ms", 120000,
                   "--log-level", "info"] + WORKERS, "replica")
        reply = fake.next_request()
        # published before the answer: the add reaches B (held); its free never does
        fake.publish("kvrouter.active_sequences",
                     sync_header(1, fake_id, 1, 1) + sync_add(b"lost-free", fake_id, 2))
        fake.publish(reply, sync_header(3, fake_id, 0, 0, flags=1))  # the snapshot: empty
        fake.sock.sendall(b"PING\r\n")
        check("nats-server took the responder's messages", fake.expect_pong())
        check("B joins with the snapshot", eventually(lambda: ready(b), 10), b.stderr()[-800:])
        check("the add held before the snapshot is not applied over it",
              sum(loads(b).values()) == 0, loads(b))
        check("the join's log line says so",
              eventually(lambda: "1 of them the responder's, in its snapshot already" in
                         b.stderr(), 5), b.stderr()[-800:])
        # batch 2 never comes: counted lost only if the held batch's number 1 was taken (a
        # peer first heard at 3 would start there, nothing lost)
        fake.publish("kvrouter.active_sequences",
                     sync_header(1, fake_id, 3, 1) + sync_add(b"after", fake_id, 3))
        check("a batch after the snapshot applies",
              eventually(lambda: loads(b).get(3) == 1, 5), loads(b))
        fake.publish("kvrouter.active_sequences", sync_header(1, fake_id, 4, 1) +
                     sync_free(b"after"))
        check("... and its free", eventually(lambda: sum(loads(b).values()) == 0, 5), loads(b))
        check("the held batch's number was taken: the missing batch 2 is counted lost",
              b.metric("kvr_sync_lost_batches_total") == 1,
              b.metric("kvr_sync_lost_batches_total"))
    finally:
        fake.close()
        if b is not None:
            b.stop()


def scenario_join_asked_again(nats):
    """A replica back on NATS before its peers asks for a snapshot nobody answers. A peer heard
    from afterwards is asked again, and its answer replaces what the replica knew from before
    the outage: a free lost in it goes, a booking made during it comes. Asked again at most
    three times in a row, then the replica stops asking until its next connection."""
    fake_id = 0xA5A5
    events = "kvrouter.active_sequences"
    fake = FakeResponder(nats)
    b = None

    def outage():
        fake.close()
        nats.kill()
        nats.start()
        return FakeResponder(nats)

    def asks():
        return b.metric("kvr_sync_snapshot_requests_total") or 0

    def timeouts():
        return b.metric("kvr_sync_snapshot_timeouts_total") or 0

    try:
        # the fake never writes a presence entry: a long TTL keeps it a peer through the test
        b = Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--nats-url", nats.url,
                   "--router-replica-sync", "true", "--nats-presence-ttl-ms", 120000,
                   "--log-level", "info"] + WORKERS, "replica")
        fake.publish(fake.next_request(), sync_header(3, fake_id, 0, 0, flags=1))
        check("asked again: B joins with the fake's (empty) snapshot",
              eventually(lambda: ready(b), 10), b.stderr()[-800:])
        fake.publish(events, sync_header(1, fake_id, 1, 1) + sync_add(b"freed-in-outage",
                                                                       fake_id, 1))
        check("asked again: B counts the fake's booking",
              eventually(lambda: loads(b).get(1) == 1, 5), loads(b))

        # the outage: the fake frees its booking and books another; neither reaches B
        fake = outage()
        check("asked again: B reconnects",
              eventually(lambda: b.metric("kvr_nats_connected") == 1, 20))
        # B's join is not answered (the fake may have subscribed after B asked)
        check("asked again: B's join times out, counted",
              eventually(lambda: timeouts() == 1, 10), sync_figures(b))
        check("asked again: B still counts the booking freed in the outage",
              loads(b).get(1) == 1, loads(b))
        before, t = asks(), time.time()
        fake.publish(events, sync_header(1, fake_id, 2, 1) + sync_add(b"after", fake_id, 3))
        reply = fake.next_request(sent_after=t)
        check("asked again: the fake's next batch brings a new snapshot request",
              reply is not None and eventually(lambda: asks() == before + 1, 5),
              sync_figures(b))
        fake.publish(reply, sync_header(3, fake_id, 0, 2, flags=1) +
                     sync_add(b"booked-in-outage", fake_id, 2) + sync_add(b"after", fake_id, 3))
        check("asked again: the answer replaces B's view of the fake's bookings",
              eventually(lambda: loads(b) == {1: 0, 2: 1, 3: 1}, 5),
              (loads(b), sync_figures(b)))
        check("asked again: the join's log line says so",
              "asking again (1 of 3)" in b.stderr(), b.stderr()[-1500:])

        # a second outage, after which the fake never answers: three more requests, no fourth
        fake = outage()
        check("bounded: B reconnects",
              eventually(lambda: b.metric("kvr_nats_connected") == 1, 20))
        check("bounded: B's join times out",
              eventually(lambda: timeouts() == 2, 10), sync_figures(b))
        seq = 3
        for k in range(1, 4):
            before, t = asks(), time.time()
            fake.publish(events, sync_header(1, fake_id, seq, 0))
            seq += 1
            reply = fake.next_request(sent_after=t)
            check(f"bounded: asked again ({k} of 3)",
                  reply is not None and eventually(lambda: asks() == before + 1, 5),
                  sync_figures(b))
            check(f"bounded: ... and timed out ({k} of 3)",
                  eventually(lambda: timeouts() == 2 + k, 10), sync_figures(b))
        before = asks()
        fake.publish(events, sync_header(1, fake_id, seq, 1) + sync_add(b"last", fake_id, 1))
        check("bounded: the fourth batch applies", eventually(lambda: loads(b).get(1) == 1, 5),
              loads(b))
        check("bounded: ... without another snapshot request", asks() == before,
              sync_figures(b))
    finally:
        fake.close()
        if b is not None:
            b.stop()


def scenario_bad_input(nats):
    """Malformed, truncated and oversized messages on the sync subjects, presence entries that
    are not a router's: counted, logged, never a crash; the replica keeps working."""
    a = replica(nats)
    try:
        check("ready", eventually(lambda: ready(a), 15))
        add = (struct.pack("<BBH", 1, 0, 3) + b"bad" +
               struct.pack("<QQIIQQII", 77, 1, 0, 16, 32, 0, 0, 1000))  # 1000 hashes announced
        bad = [b"", b"garbage", b"KVRS" + b"\x00" * 36, sync_header(1, 77, 1, 1) + add,
               sync_header(9, 77, 1, 0), sync_header(1, 77, 1, 5), sync_header(1, 0, 1, 0),
               b"\xff" * 900000]
        for m in bad:
            check("a bad message is accepted by nats-server", nats.publish(
                "kvrouter.active_sequences", m))
        nats.publish("kvrouter.sync.snapshot", b"not a request", reply="kvrouter.x")
        nats.publish("kvrouter.sync.snapshot", sync_header(2, 77, 0, 0))  # no reply subject
        nats.publish("kvrouter.sync.reply.0000000000000001", b"junk")
        # presence entries that are not routers' (a KV put is a publish on $KV.<bucket>.<key>)
        nats.publish("$KV.kvrouter_routers.not-an-id", b"{}")
        nats.publish("$KV.kvrouter_routers.00000000000000aa", b"[not json")
        want = len(bad) + 2
        check("every bad sync message is counted",
              eventually(lambda: (a.metric("kvr_sync_bad_messages_total") or 0) >= want, 5),
              a.metric("kvr_sync_bad_messages_total"))
        check("bad presence entries are counted",
              eventually(lambda: (a.metric("kvr_replicas_bad_entries_total") or 0) >= 2, 5),
              a.metric("kvr_replicas_bad_entries_total"))
        check("nothing was half-applied", sum(loads(a).values()) == 0, loads(a))
        check("an add for a worker it does not know is counted, not applied",
              nats.publish("kvrouter.active_sequences",
                           sync_header(1, 78, 1, 1) + struct.pack("<BBH", 1, 0, 3) + b"unk" +
                           struct.pack("<QQIIQQII", 78, 99, 0, 16, 32, 0, 0, 0)))
        check("... counted", eventually(lambda: a.metric("kvr_sync_unknown_worker_total") == 1, 5))
        route(a, "still-works", 5)
        check("the replica still routes", sum(loads(a).values()) == 1)
        err = a.stderr()
        check("the refusals are logged, rate-limited",
              "sync: message on kvrouter.active_sequences refused" in err and
              err.count("refused:") < 10, err[-1500:])
    finally:
        a.stop()


def main():
    nats = NatsServer()
    try:
        scenario_sync(nats)
        scenario_late_joiner(nats)
        scenario_late_index(nats)
        scenario_started_together(nats)
        scenario_restarted_together(nats)
        scenario_peer_dies(nats)
        scenario_bad_input(nats)
        scenario_snapshot_covers_held(nats)
        scenario_join_asked_again(nats)
        scenario_discovery(nats)
        scenario_nats_outage(nats)
    finally:
        kill_children()
        nats.stop()
    finish()


if __name__ == "__main__":
    main()
