#!/usr/bin/python3
"""How far `kvrouter serve` trails an engine that loses KV-event batches often.

A `kvrouter mocker` drops every Nth event batch (--kv-events-drop-every N: numbered and
buffered for replay, never sent live), so the router sees a gap at every Nth batch, holds the
live batches that follow, asks the replay socket for the missing one and applies the held
batches once the answer is in. This tool sends requests one at a time; after each answer it
polls the router's GET /v1/workers (about every millisecond) until the rank says `exact` with
last_seq = the engine's newest batch, and reports that lag: the time a router's state and
index trail the engine after a step. A second phase sends a burst of concurrent requests and
reports the time from the engine going idle to the router's rank being exact again.

usage: gap_lag.py KVROUTER [--requests N] [--drop-every N] [--burst N] [--mocker KVROUTER2]
Measures only; prints one table. Not a test: the suite's assertions live in test_mocker.py.
"""
import argparse
import json
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import kvr_harness  # noqa: E402
from kvr_harness import eventually, free_ports  # noqa: E402
import http.client  # noqa: E402
import subprocess  # noqa: E402


class Proc:
    def __init__(self, args):
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = kvr_harness.read_line(self.p, 20)
        self.port = int(line.strip().rsplit(":", 1)[-1].split()[0]) if line else 0
        self.conn = None

    def call(self, method, path, body=None, timeout=30):
        for attempt in range(2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
                data = json.dumps(body) if body is not None else None
                self.conn.request(method, path, body=data,
                                  headers={"Content-Type": "application/json"})
                r = self.conn.getresponse()
                raw = r.read()
                return r.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode())
            except (OSError, http.client.HTTPException):
                self.conn = None
                if attempt:
                    raise
        return 0, None

    def metric(self, name):
        st, text = self.call("GET", "/metrics")
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()


def numbered(m):
    return int((m.metric("kvr_mocker_kv_event_batches_published_total") or 0)
               + (m.metric("kvr_mocker_kv_event_batches_dropped_total") or 0))


def rank(r):
    st, ws = r.call("GET", "/v1/workers")
    return ws["workers"][0]["ranks"][0] if st == 200 else {}


def wait_caught_up(r, m, bound=5.0):
    """Seconds until the router's rank is exact at the engine's newest batch, or None."""
    want = numbered(m) - 1
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound:
        rk = rank(r)
        if rk.get("index_state") == "exact" and rk.get("last_seq", -1) >= want:
            return time.monotonic() - t0
        time.sleep(0.0005)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvrouter")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--drop-every", type=int, default=4)
    ap.add_argument("--burst", type=int, default=40)
    ap.add_argument("--mocker", help="another kvrouter binary for the engine (default: KVROUTER)")
    a = ap.parse_args()
    port, rport = free_ports(), free_ports()
    cfg = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{rport}"})
    m = Proc([a.mocker or a.kvrouter, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "m",
              "--speedup", "50", "--block-size", "4", "--num-gpu-blocks", "256",
              "--kv-events-config", cfg, "--kv-events-drop-every", str(a.drop_every)])
    r = Proc([a.kvrouter, "serve", "--http-port", "0", "--block-size", "4", "--log-level",
              "error", "--worker",
              f"id=1,events=tcp://127.0.0.1:{port},replay=tcp://127.0.0.1:{rport}"])
    rng = random.Random(7)
    try:
        # the router's subscription reaches the engine: a request's blocks become visible
        p = [rng.randrange(1, 30000) for _ in range(40)]
        eventually(lambda: m.call("POST", "/v1/completions",
                                  {"model": "m", "prompt": p, "max_tokens": 1})[0] == 200
                   and eventually(lambda: rank(r).get("batches", 0) > 0, 0.5), 20)
        lags, lost = [], 0
        for _ in range(a.requests):
            prompt = [rng.randrange(1, 30000) for _ in range(rng.randrange(8, 80))]
            st, _ = m.call("POST", "/v1/completions",
                           {"model": "m", "prompt": prompt, "max_tokens": 3})
            if numbered(m) % a.drop_every == 0:
                continue  # the newest batch was dropped: nobody can see that gap yet
            lag = wait_caught_up(r, m)
            if lag is None:
                lost += 1
            else:
                lags.append(lag * 1000)
        # a burst of concurrent requests, then the engine goes idle
        def one():
            pr = [rng.randrange(1, 30000) for _ in range(rng.randrange(8, 80))]
            m2 = Proc.__new__(Proc)
            m2.port, m2.conn = m.port, None
            m2.call("POST", "/v1/completions", {"model": "m", "prompt": pr, "max_tokens": 6})
        ts = [threading.Thread(target=one) for _ in range(a.burst)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        while numbered(m) % a.drop_every == 0:
            m.call("POST", "/v1/completions", {"model": "m", "prompt": [5, 6, 7, 8, 9],
                                               "max_tokens": 1})
        burst_lag = wait_caught_up(r, m)
        rk = rank(r)
        lags.sort()
        q = lambda f: lags[min(len(lags) - 1, int(f * len(lags)))] if lags else float("nan")
        print(f"requests {a.requests}, drop every {a.drop_every}: router gaps {rk.get('gaps')}, "
              f"replayed {rk.get('replayed')}, lost {rk.get('gaps_lost')}")
        print(f"lag after one request (ms): n {len(lags)}  p50 {q(0.5):.1f}  p90 {q(0.9):.1f}  "
              f"max {lags[-1] if lags else float('nan'):.1f}  mean "
              f"{statistics.mean(lags) if lags else float('nan'):.1f}  not caught up in 5 s: {lost}")
        print(f"lag after a burst of {a.burst} concurrent requests (ms): "
              f"{burst_lag * 1000 if burst_lag is not None else float('nan'):.1f}")
    finally:
        r.stop()
        m.stop()


if __name__ == "__main__":
    main()
