#!/usr/bin/python3
"""Soak under attack: two `kvrouter serve` replicas (replica sync and discovery on NATS, default
budgets) on a real nats-server, while strangers on the same NATS server forge everything they
can, for a bounded time. The replicas' own clients must be served throughout and the replicas'
memory must stay bounded.

The attackers, all at once, from raw NATS connections (no client library):
  - adds: batches of forged bookings, up to 512 hashes each, in the name of made-up routers and
    of the live replicas, with their origin set to a live replica as often as not;
  - frees and first tokens for the ids the replicas' clients are using;
  - presence: deletes of the live replicas' entries, entries naming other hosts;
  - discovery: other values for the registered worker, new workers naming other hosts (the
    replicas run with --allowed-worker-hosts, as docs/security.md recommends with discovery:
    anyone who can write <ns>_workers could otherwise add a worker);
  - snapshot requests, many a second.
The clients: each replica gets POST /v1/route bookings that are then freed, one at a time per
client thread. Every second the replicas' RSS (/proc) is sampled.

It fails (exit 1, the check named) if a replica dies or stops being ready; if any client call
is refused or fails (a 429 would mean forged bookings crowded out local ones); if a booking
made on one replica is freed by a forged free (its peer's and its own view must agree); or if
RSS after warm-up grows past the bound of the peer budgets (see RSS_BOUND_KIB). Usage:
  nats_forgery.py KVROUTER [--seconds 600] [--report FILE.tsv]
"""
import argparse
import http.client
import json
import os
import random
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from kvr_harness import (Child, NatsServer, check, eventually, finish,  # noqa: E402
                         kill_children, proc_kib)

BS = 16
WORKERS = ["--worker", "id=1", "--worker", "id=2", "--worker", "id=3"]
# What the default budgets allow a flood to hold: 262,144 peer requests (~330 bytes each) of at
# most 4,194,304 blocks in all (~128 bytes each, measured: 8,388,608 blocks took 1,022 MiB):
# about 600 MiB at worst, plus the process's own ~30 MiB.
RSS_BOUND_KIB = 700 * 1024
WARMUP_S = 20


class RawNats:
    """One raw protocol connection that publishes without waiting (a flood)."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.f = self.s.makefile("rb")
        self.f.readline()  # INFO
        self.s.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n')
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):  # answer the server's PINGs, drop the rest
        try:
            for line in self.f:
                if line.startswith(b"PING"):
                    self.s.sendall(b"PONG\r\n")
        except (OSError, ValueError):
            pass

    def pub(self, subject, payload, reply=None, headers=None):
        rp = (reply + " ") if reply else ""
        if headers is None:
            self.s.sendall(f"PUB {subject} {rp}{len(payload)}\r\n".encode() + payload + b"\r\n")
            return
        hdr = ("NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) +
               "\r\n").encode()
        self.s.sendall(f"HPUB {subject} {rp}{len(hdr)} {len(hdr) + len(payload)}\r\n".encode() +
                       hdr + payload + b"\r\n")


def sync_msg(msg_type, router_id, seq, events):
    return (b"KVRS" + struct.pack("<BBHQQQII", 1, msg_type, 0, router_id, seq,
                                  int(time.time() * 1e6), len(events), 0) + b"".join(events))


def ev_add(rid, origin, rng):
    rid = rid.encode()
    n = rng.choice((0, 4, 64, 512))
    isl = rng.choice((n * BS, n * BS + 7, 2 ** 64 - 1 if rng.random() < 0.05 else n * BS))
    return (struct.pack("<BBH", 1, 0, len(rid)) + rid +
            struct.pack("<QQIIQQII", origin, rng.randrange(1, 4), 0, BS, isl, 0, 0, n) +
            struct.pack(f"<{n}Q", *(rng.getrandbits(64) for _ in range(n))))


def ev_end(kind, rid):
    rid = rid.encode()
    return struct.pack("<BBH", kind, 0, len(rid)) + rid


def call(r, method, path, body=None):
    conn = http.client.HTTPConnection(r.host, r.port, timeout=30)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Attack:
    def __init__(self, nats, ids, stop, seed):
        self.nats, self.ids, self.stop, self.rng = nats, ids, stop, random.Random(seed)
        self.sent = {"adds": 0, "ends": 0, "presence": 0, "workers": 0, "snapshots": 0}
        self.client_ids = []  # ids the clients are using, to free them from outside

    def run(self):
        conn = RawNats(self.nats.port)
        seqs = {}
        k = 0
        while not self.stop.is_set():
            k += 1
            rng = self.rng
            router = rng.choice(self.ids + [rng.getrandbits(64) | 1 for _ in range(2)])
            origin = rng.choice((router, rng.choice(self.ids)))
            seqs[router] = seqs.get(router, 0) + 1
            evs = [ev_add(f"forged-{k}-{i}", origin, rng) for i in range(200)]
            conn.pub("kvrouter.active_sequences", sync_msg(1, router, seqs[router], evs))
            self.sent["adds"] += len(evs)
            ids = list(self.client_ids[-64:])
            if ids:
                evs = [ev_end(rng.choice((2, 3)), i) for i in ids]
                conn.pub("kvrouter.active_sequences",
                         sync_msg(1, rng.choice(self.ids), rng.getrandbits(32), evs))
                self.sent["ends"] += len(evs)
            if k % 10 == 0:
                victim = rng.choice(self.ids)
                conn.pub(f"$KV.kvrouter_routers.{victim:016x}", b"",
                         headers={"KV-Operation": "DEL"})
                fake = rng.getrandbits(64) | 1
                conn.pub(f"$KV.kvrouter_routers.{fake:016x}", json.dumps(
                    {"router_id": f"{fake:016x}", "url": "http://127.0.0.2:9"}).encode())
                self.sent["presence"] += 2
                conn.pub("$KV.kvrouter_workers.7", json.dumps(
                    {"worker_id": 7, "url": "http://127.0.0.2:9"}).encode())
                wid = rng.randrange(1000, 10**6)
                conn.pub(f"$KV.kvrouter_workers.{wid}", json.dumps(
                    {"worker_id": wid, "url": "http://127.0.0.2:9"}).encode())
                self.sent["workers"] += 2
            if k % 5 == 0:
                rid = rng.getrandbits(64) | 1
                conn.pub("kvrouter.sync.snapshot", sync_msg(2, rid, 0, []),
                         reply=f"kvrouter.sync.reply.{rid:016x}")
                self.sent["snapshots"] += 1
            time.sleep(0.01)  # pacing: ~20,000 forged adds a second


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvrouter")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--report")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("KVR_TEST_SEED", "1")))
    a = ap.parse_args()
    kvr = a.kvrouter
    nats = NatsServer()
    reps, reg = [], None
    stop = threading.Event()
    try:
        for i in range(2):
            reps.append(Child([kvr, "serve", "--http-port", "0", "--block-size", BS,
                               "--nats-url", nats.url, "--router-replica-sync", "true",
                               "--discovery", "nats", "--allowed-worker-hosts", "127.0.0.1",
                               "--log-level", "warn"] + WORKERS,
                              f"replica {i}"))
        check("replicas ready", eventually(lambda: all(call(r, "GET", "/ready")[0] == 200
                                                       for r in reps), 20))
        import subprocess
        reg = subprocess.Popen([kvr, "register", "--nats-url", nats.url, "--worker",
                                "id=7,url=http://127.0.0.1:9", "--log-level", "warn"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ids = [int(json.loads(call(r, "GET", "/v1/routers")[1])["self"], 16) for r in reps]
        atk = Attack(nats, ids, stop, a.seed)
        threading.Thread(target=atk.run, daemon=True).start()
        failures, served = [], [0]
        lock = threading.Lock()

        def client(r, n):
            rng = random.Random(a.seed * 100 + n)
            j = 0
            while not stop.is_set():
                j += 1
                rid = f"c{n}-{j}"
                with lock:
                    atk.client_ids.append(rid)
                    del atk.client_ids[:-256]
                toks = [rng.randrange(1, 30000) for _ in range(256)]
                st, body = call(r, "POST", "/v1/route", {"tokens": toks, "request_id": rid})
                st2, _ = call(r, "DELETE", f"/v1/requests/{rid}") if st == 200 else (0, b"")
                with lock:
                    if st != 200 or st2 != 200:
                        failures.append((n, rid, st, st2, body[:200]))
                    else:
                        served[0] += 1
        for n in range(4):
            threading.Thread(target=client, args=(reps[n % 2], n), daemon=True).start()
        t0 = time.monotonic()
        rows, peak_warm, peak = [], [0, 0], [0, 0]
        dead = None
        while time.monotonic() - t0 < a.seconds:
            time.sleep(1)  # the sampler's pace
            t = time.monotonic() - t0
            rss = []
            for i, r in enumerate(reps):
                if r.proc.poll() is not None:
                    dead = f"replica {i} exited {r.proc.returncode}"
                    break
                rss.append(proc_kib(r.proc.pid))
                peak[i] = max(peak[i], rss[i])
                if t < WARMUP_S:
                    peak_warm[i] = max(peak_warm[i], rss[i])
            if dead:
                break
            ready = [call(r, "GET", "/ready")[0] for r in reps]
            rows.append((round(t), *rss, *ready, served[0], len(failures), atk.sent["adds"]))
        stop.set()
        check("no replica died", dead is None, dead)
        check("both replicas ready at every sample", all(x[3] == 200 and x[4] == 200
                                                         for x in rows),
              [x for x in rows if x[3] != 200 or x[4] != 200][:5])
        check("every local booking and free served (none refused, none freed by a forgery)",
              not failures and served[0] > 0, (served[0], failures[:5]))
        check(f"RSS stayed under {RSS_BOUND_KIB // 1024} MiB", max(peak) < RSS_BOUND_KIB,
              peak)
        metrics = {}
        for i, r in enumerate(reps):
            text = call(r, "GET", "/metrics")[1].decode()
            for line in text.splitlines():
                for name in ("kvr_requests_in_flight_peers", "kvr_requests_in_flight_peer_blocks",
                             "kvr_sync_peer_budget_full_total", "kvr_sync_peer_limited_total",
                             "kvr_sync_unowned_events_total", "kvr_sync_forged_origin_total",
                             "kvr_sync_out_of_range_total",
                             "kvr_sync_snapshot_requests_refused_total",
                             "kvr_replicas_deletes_disowned_total",
                             "kvr_discovery_changes_refused_total"):
                    if line.startswith(name + " "):
                        metrics.setdefault(name, []).append(float(line.split()[1]))
        print(f"nats_forgery: {a.seconds:.0f} s, {served[0]} local bookings served and freed, "
              f"{len(failures)} failed; forged: {atk.sent}")
        print(f"nats_forgery: RSS peak (MiB) warm-up {[p // 1024 for p in peak_warm]}, "
              f"whole run {[p // 1024 for p in peak]}, last {[x // 1024 for x in rows[-1][1:3]]}"
              if rows else "nats_forgery: no sample")
        for k, v in sorted(metrics.items()):
            print(f"nats_forgery: {k} {v}")
        if a.report:
            with open(a.report, "w") as f:
                f.write("t_s\trss_kib_0\trss_kib_1\tready_0\tready_1\tserved\tfailed\tforged_adds\n")
                for x in rows:
                    f.write("\t".join(str(v) for v in x) + "\n")
    finally:
        stop.set()
        if reg is not None:
            reg.terminate()
            reg.wait(timeout=10)
        for r in reps:
            r.stop()
        kill_children()
        nats.stop()
    finish()


if __name__ == "__main__":
    main()
