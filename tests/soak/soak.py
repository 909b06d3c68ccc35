#!/usr/bin/python3
"""Soak: `kvrouter serve` in front of real `kvrouter mocker` engines for a bounded time, with
churn, watching the router's memory, file descriptors, in-flight load and index size.

The churn, all at once:
  - client threads send OpenAI completions through the router's front end, streaming and not:
    prompts of 64-1024 tokens, half of them extending one of a pool of shared prefixes that is
    replaced as it goes (many short-lived prefixes), the rest fresh;
  - a share of the streaming clients hang up after the first chunk (a cancellation);
  - every few seconds one engine is killed (SIGKILL) and restarted on the same ports (a new
    process: its event numbering starts over, the router fences, readmits and resyncs it);
  - the router's index budget (--index-max-pairs) is far below what the engines cache, so it
    evicts all the time.
Every second it samples the router's RSS and open fds (/proc), its in-flight requests and
per-rank booked load (/metrics), and its index pairs. It fails (exit 1, the check named) if
the router dies; if RSS after warm-up grows past the bound (see rss_bound); if fds after the
drain do not come back to the idle level (see fd_bound); if the in-flight load does not return to 0
within a bound once the clients stop; if the index ever holds more pairs than its budget or
never reached it; if a client waits past its timeout (a hang); or if too few requests succeed.

Waits are bounded polls of observable conditions; the only sleeps pace the sampler, the
clients' think time and the chaos schedule. Usage:
  soak.py KVROUTER [--seconds 60] [--workers 3] [--clients 4] [--seed N] [--report FILE.tsv]
"""
import argparse
import http.client
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from kvr_harness import (Child, check, eventually, finish, free_ports, kill_children,  # noqa: E402
                         proc_kib)

BS = 16
BUDGET = 20000           # index pairs: the engines cache ~3 x 16384 blocks
CLIENT_TIMEOUT = 60.0    # a request still unanswered after this is a hang
RSS_SLACK_KIB = 6144     # growth allowed after warm-up: 6 MiB ...
RSS_SLACK_FRAC = 0.10    # ... or 10% of the warm-up peak, whichever is larger


def proc_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Engine:
    """One mocker on fixed ports, so a restart comes back where the router expects it."""

    def __init__(self, kvr, wid, speedup):
        self.kvr, self.wid, self.speedup = kvr, wid, speedup
        self.http = free_ports()
        self.ev, self.rp = free_ports(), free_ports()
        self.child = None
        self.kills = 0

    def start(self):
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": f"tcp://*:{self.ev}", "replay_endpoint": f"tcp://*:{self.rp}"}
        for _ in range(50):  # the old process's ports may take a moment to be free again
            try:
                self.child = Child([self.kvr, "mocker", "--host", "127.0.0.1", "--port",
                                    self.http, "--model", "m", "--block-size", BS,
                                    "--num-gpu-blocks", 16384, "--speedup", self.speedup,
                                    "--max-num-seqs", 64, "--seed", self.wid,
                                    "--kv-events-config", json.dumps(cfg)],
                                   f"mocker {self.wid}")
                return
            except RuntimeError:
                time.sleep(0.1)
        raise RuntimeError(f"mocker {self.wid} could not restart on port {self.http}")

    def spec(self):
        return (f"id={self.wid},url=http://127.0.0.1:{self.http},"
                f"events=tcp://127.0.0.1:{self.ev},replay=tcp://127.0.0.1:{self.rp}")

    def kill(self):
        self.child.kill()
        self.kills += 1


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes = {}

    def add(self, what):
        with self.lock:
            self.outcomes[what] = self.outcomes.get(what, 0) + 1


def one_request(port, body, cancel, stats):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            r.read()
            stats.add(f"http_{r.status}")
            return
        if cancel:
            r.fp.readline()  # the first chunk, then hang up
            stats.add("cancelled")
            return
        data = r.read()
        if body["stream"] and b"data: [DONE]" not in data:
            stats.add("stream_error")  # an error event after the first byte (worker killed)
        else:
            stats.add("ok")
    except socket.timeout:
        stats.add("hang")
    except (OSError, http.client.HTTPException):
        stats.add("conn_error")
    finally:
        conn.close()


def client(port, stop, stats, seed, prefixes):
    rng = random.Random(seed)
    while not stop.is_set():
        n = rng.randrange(4, 64) * BS
        if rng.random() < 0.5:
            with prefixes["lock"]:
                pool = prefixes["pool"]
                k = rng.randrange(len(pool))
                base = pool[k]
                if rng.random() < 0.05:  # prefixes are short-lived
                    pool[k] = [rng.randrange(1, 30000) for _ in range(rng.randrange(4, 32) * BS)]
            prompt = base + [rng.randrange(1, 30000) for _ in range(max(BS, n - len(base)))]
        else:
            prompt = [rng.randrange(1, 30000) for _ in range(n)]
        stream = rng.random() < 0.7
        cancel = stream and rng.random() < 0.15
        body = {"model": "m", "prompt": prompt, "max_tokens": rng.randrange(2, 24),
                "stream": stream}
        one_request(port, body, cancel, stats)


def chaos(engines, stop, period, rng):
    """Kills one engine and restarts it, every `period` seconds."""
    while not stop.wait(period):
        e = rng.choice(engines)
        e.kill()
        if stop.wait(1.0):  # down for a second: requests to it fail and it is fenced
            e.start()
            return
        e.start()


def in_flight(r):
    total = 0.0
    for name in ("kvr_requests_in_flight", "kvr_frontend_in_flight",
                 "kvr_worker_active_requests", "kvr_worker_active_blocks",
                 "kvr_worker_active_prefill_tokens"):
        total += r.metric(name) or 0.0
    return total


def rss_bound(samples, warm):
    """Warm-up is the first `warm` samples; the peak after it may exceed the warm-up peak by
    RSS_SLACK_KIB or RSS_SLACK_FRAC, whichever is larger. Memory that only grows (a leak of a
    few hundred bytes per request at this rate) passes the bound within the run."""
    base = max(s["rss_kib"] for s in samples[:warm])
    return base, base + max(RSS_SLACK_KIB, int(base * RSS_SLACK_FRAC))


def fd_bound(base, workers, clients):
    """The fds the router may hold once idle again: what it held before any traffic (listener,
    ZeroMQ, engines' event sockets), plus per worker the keep-alive upstream connections its
    pool may keep (at most one per client: a client has one request in flight at a time), its
    /v1/models connection and a health probe in flight, plus 8.
    Closed client connections are released by the HTTP guard's 100 ms sweep, so at ~500
    connections/s a single sample right after the clients stop can see ~50 closed but not yet
    released; the check polls until the level is reached, and a leak never reaches it."""
    return base + workers * (clients + 2) + 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvrouter")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seed", type=int,
                    default=int(os.environ.get("KVR_TEST_SEED", int(time.time()) % 100000)))
    ap.add_argument("--chaos-period", type=float, default=8.0)
    ap.add_argument("--report", help="a TSV of the samples")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    engines = [Engine(a.kvrouter, w + 1, 20) for w in range(a.workers)]
    for e in engines:
        e.start()
    args = [a.kvrouter, "serve", "--http-port", "0", "--block-size", BS, "--log-level", "error",
            "--index-max-pairs", BUDGET, "--health-interval-ms", 500]
    for e in engines:
        args += ["--worker", e.spec()]
    r = Child(args, "router")
    stats = Stats()
    stop = threading.Event()
    prefixes = {"lock": threading.Lock(),
                "pool": [[rng.randrange(1, 30000) for _ in range(rng.randrange(4, 32) * BS)]
                         for _ in range(40)]}
    threads = [threading.Thread(target=client, args=(r.port, stop, stats, a.seed * 100 + i,
                                                     prefixes), daemon=True)
               for i in range(a.clients)]
    threads.append(threading.Thread(target=chaos, args=(engines, stop, a.chaos_period,
                                                        random.Random(a.seed + 1)), daemon=True))
    samples = []
    fds_idle = proc_fds(r.proc.pid)  # before any traffic
    t0 = time.monotonic()
    print(f"soak: {a.seconds:.0f} s, {a.workers} engines, {a.clients} clients, seed {a.seed}",
          flush=True)
    try:
        for t in threads:
            t.start()
        while time.monotonic() - t0 < a.seconds:
            time.sleep(1.0)  # the sampling period
            if r.proc.poll() is not None:
                break
            samples.append({"t": round(time.monotonic() - t0, 1),
                            "rss_kib": proc_kib(r.proc.pid), "fds": proc_fds(r.proc.pid),
                            "in_flight": r.metric("kvr_frontend_in_flight") or 0,
                            "pairs": r.metric("kvr_index_pairs") or 0,
                            "ok": stats.outcomes.get("ok", 0)})
        stop.set()
        for t in threads:
            t.join(CLIENT_TIMEOUT + 10)
        alive = r.proc.poll() is None
        check("router alive through the soak", alive, r.proc.returncode)
        if not alive or len(samples) < 6:
            check("enough samples", False, len(samples))
            finish()
        for e in engines:  # every engine up for the drain
            if e.child.proc.poll() is not None:
                e.start()
        drained = eventually(lambda: in_flight(r) == 0, 30, 0.2)
        check("in-flight load returns to 0 after the drain", drained, in_flight(r))
        warm = max(3, len(samples) // 4)
        base, bound = rss_bound(samples, warm)
        peak = max(s["rss_kib"] for s in samples[warm:])
        check(f"RSS after warm-up stays within {bound} KiB (warm-up peak {base} KiB)",
              peak <= bound, [s["rss_kib"] for s in samples])
        fds_max = fd_bound(fds_idle, a.workers, a.clients)
        fds_end = eventually(lambda: (lambda n: n if n <= fds_max else 0)(proc_fds(r.proc.pid)),
                             10, 0.05) or proc_fds(r.proc.pid)
        check(f"no fd leak: fds after the drain come back to <= {fds_max} (idle {fds_idle})",
              fds_end <= fds_max, (fds_end, [s["fds"] for s in samples]))
        check(f"index within its budget of {BUDGET} pairs",
              max(s["pairs"] for s in samples) <= BUDGET, [s["pairs"] for s in samples])
        check("index reached its budget (evictions)",
              (r.metric("kvr_index_evicted_pairs_total") or 0) > 0,
              r.metric("kvr_index_evicted_pairs_total"))
        out = stats.outcomes
        total = sum(out.values())
        check("no client waited past its timeout (a hang)", out.get("hang", 0) == 0, out)
        ok_share = (out.get("ok", 0) + out.get("cancelled", 0)) / max(1, total)
        check("at least 80% of requests succeed through the kills", ok_share >= 0.8, out)
        kills = sum(e.kills for e in engines)
        # the schedule is one kill per chaos period plus the restart's own time, which a busy
        # machine stretches: the check is that the churn kept going, not its exact count
        check("engines were killed and restarted all along",
              kills >= max(1, int(a.seconds // a.chaos_period) // 2), kills)
        print(f"soak: {total} requests {dict(sorted(out.items()))}, {kills} engine kills; "
              f"RSS KiB first {samples[0]['rss_kib']} warm-up peak {base} last "
              f"{samples[-1]['rss_kib']} max {max(s['rss_kib'] for s in samples)} "
              f"(bound {bound}); fds idle {fds_idle} after drain {fds_end} (bound {fds_max}); pairs max "
              f"{max(s['pairs'] for s in samples)} of {BUDGET}", flush=True)
        if a.report:
            with open(a.report, "w") as f:
                f.write("\t".join(samples[0]) + "\n")
                for s in samples:
                    f.write("\t".join(str(v) for v in s.values()) + "\n")
        r.stop()
    finally:
        stop.set()
        for e in engines:
            if e.child and not e.child.stopped:
                e.child.stop()
        kill_children()
    finish()


if __name__ == "__main__":
    main()
