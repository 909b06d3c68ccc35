#!/usr/bin/python3
"""A burst on a new prefix finds the worker computing it, through `kvrouter serve` and real
mockers whose engines run slowly (--speedup 0.01: a 4,096-token prefill takes about 9 s), so the
first request is provably still prefilling, its blocks unreported by any KV event, while the
second is routed.
  - credit on (the default router_inflight_credit_weight 1): /v1/query shows the first request's
    worker with the prompt's 256 blocks predicted (none on the device yet); the second request
    goes there (predicted_blocks 256 in its answer) although the other worker carries less load;
    kvr_inflight_credited_total counts it; once the engine has prefilled and its events report
    the blocks, they are device blocks, nothing is predicted any more (never counted twice), and
    the credit is counted confirmed (kvr_inflight_settled_total);
  - credit off (weight 0): the same second request goes to the less loaded worker, nothing is
    credited;
  - a weight outside [0, 1] is refused at start, naming the setting.
Every wait polls an observable condition under a bound.
Usage: test_inflight.py <path to kvrouter>.
"""
import json
import random
import subprocess
import sys
import threading

from kvr_harness import Child, check, eventually, run_scenarios, with_free_ports

KVR = sys.argv[1]
BS = 16
RNG = random.Random(11)


def mocker(name):
    def start(ev):
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}"}
        return Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "m",
                      "--block-size", str(BS), "--speedup", "0.01", "--kv-events-config",
                      json.dumps(cfg)], f"mocker {name}")
    (ev,), m = with_free_ports(start, 1)
    m.spec = f"url={m.url},events=tcp://127.0.0.1:{ev}"
    return m


def serve(a, b, *extra):
    # the step-wait term off: at speedup 0.01 a running step is 100x longer than an engine's,
    # which would price every busy worker out of reach whatever it holds
    args = [KVR, "serve", "--http-port", "0", "--block-size", str(BS), "--log-level", "info",
            "--seed", "7", "--router-step-wait-weight", "0",
            "--worker", f"id=1,{a.spec}", "--worker", f"id=2,{b.spec}"]
    return Child(args + [str(x) for x in extra], "router")


def scores(r, toks):
    st, q = r.call("POST", "/v1/query", {"tokens": toks})
    assert st == 200, (st, q)
    return {s["worker_id"]: s for s in q["scores"]}


def subscribed(*ms):
    return all(eventually(lambda: (m.metric("kvr_mocker_kv_event_subscribers") or 0) >= 1)
               for m in ms)


def burst(weight):
    """Worker 2 carries a 1,024-token booking; a 4,096-token completion prefills on worker 1;
    then the same prompt is routed. Returns (router, second route's answer, prompt, the
    first request's thread and its result) with the router still running."""
    a, b = mocker("a"), mocker("b")
    r = serve(a, b, "--router-inflight-credit-weight", weight)
    check(f"weight {weight}: the router subscribed to both engines", subscribed(a, b))
    filler = [RNG.randrange(1, 30000) for _ in range(1024)]
    st, f = r.call("POST", "/v1/route", {"tokens": filler, "pinned_worker": {"worker_id": 2, "dp_rank": 0}})
    check(f"weight {weight}: worker 2 booked with another prompt", st == 200 and
          f["worker_id"] == 2, (st, f))
    toks = [RNG.randrange(1, 30000) for _ in range(256 * BS + 5)]
    first = {}

    def send():
        first["answer"] = r.call_h("POST", "/v1/completions",
                                   {"model": "m", "prompt": toks, "max_tokens": 1},
                                   headers={"x-worker-instance-id": "1"}, timeout=120)
    t = threading.Thread(target=send)
    t.start()
    booked = eventually(lambda: r.metric("kvr_requests_in_flight") == 2, timeout=10)
    check(f"weight {weight}: the first request is in flight on worker 1", booked)
    return r, a, b, toks, t, first


def scenario_credit_on():
    r, a, b, toks, t, first = burst("1")
    s = scores(r, toks)
    check("on: /v1/query shows the prefix in flight on worker 1 (predicted, not device)",
          s[1]["predicted_blocks"] == 256 and s[1]["device_blocks"] == 0 and
          s[2]["predicted_blocks"] == 0, s)
    st, sec = r.call("POST", "/v1/route", {"tokens": toks})
    check("on: the second request goes where its prefix is being computed",
          st == 200 and sec["worker_id"] == 1 and sec["predicted_blocks"] == 256 and
          sec["cached_tokens"] == 256 * BS, (st, sec))
    check("on: counted as credited (256 blocks)",
          r.metric("kvr_inflight_credited_total") == 1 and
          r.metric("kvr_inflight_credited_blocks_total") == 256 and
          r.metric("kvr_inflight_watched") == 1,
          (r.metric("kvr_inflight_credited_total"), r.metric("kvr_inflight_watched")))
    check("on: still prefilling: no KV event has reported the prompt",
          "answer" not in first and scores(r, toks)[1]["device_blocks"] == 0)
    t.join(timeout=120)
    st, _, _ = first.get("answer", (None, None, None))
    check("on: the first request completes", st == 200, st)
    reported = eventually(lambda: scores(r, toks)[1]["device_blocks"] == 256, timeout=15)
    s = scores(r, toks)
    check("on: once its events report the blocks they are device blocks, none predicted",
          reported and s[1]["predicted_blocks"] == 0, s)
    confirmed = eventually(
        lambda: r.metric("kvr_inflight_settled_total", outcome="confirmed") == 1, timeout=10)
    check("on: the credit is counted confirmed, none expired",
          confirmed and r.metric("kvr_inflight_settled_total", outcome="expired") == 0 and
          r.metric("kvr_inflight_watched") == 0,
          (r.metric("kvr_inflight_settled_total", outcome="confirmed"),
           r.metric("kvr_inflight_settled_total", outcome="expired")))
    for c in (r, a, b):
        c.stop()


def scenario_credit_off():
    r, a, b, toks, t, first = burst("0")
    st, sec = r.call("POST", "/v1/route", {"tokens": toks})
    check("off: the second request goes to the less loaded worker, nothing credited",
          st == 200 and sec["worker_id"] == 2 and sec["predicted_blocks"] == 0 and
          r.metric("kvr_inflight_credited_total") == 0, (st, sec))
    check("off: the first was still prefilling when it was routed", "answer" not in first)
    t.join(timeout=120)
    for c in (r, a, b):
        c.stop()


def scenario_bad_weight():
    for val in ("1.5", "-0.1", "lots"):
        p = subprocess.run([KVR, "serve", "--http-port", "0", "--router-inflight-credit-weight",
                            val], capture_output=True, text=True, timeout=20)
        check(f"weight {val}: refused at start, naming the setting",
              p.returncode != 0 and "--router-inflight-credit-weight" in p.stderr,
              (p.returncode, p.stderr[-400:]))


if __name__ == "__main__":
    run_scenarios([("credit_on", scenario_credit_on), ("credit_off", scenario_credit_off),
                   ("bad_weight", scenario_bad_weight)], 11)
