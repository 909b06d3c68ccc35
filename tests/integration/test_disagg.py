#!/usr/bin/python3
"""Disaggregated prefill/decode, end to end: clients -> `kvrouter serve` -> `kvrouter mocker`s in
the prefill and decode roles, on loopback, in both wire conventions.

pull (vLLM's kv_transfer_params): completions and chat, streaming and not, answer the same
tokens an aggregated engine gives; the answer names both workers; a repeated prompt goes to the
prefill worker holding it (whose prefix cache hits); the decode worker's index entries appear
after the transfer; pre-routed legs (headers, nvext) and their validation; POST /v1/route with
"disagg" (query only, then booked and freed); a client leaving during the prefill and during
the decode frees the router's load, the prefill worker's held KV and both engines' blocks; a
prefill answer with garbage kv_transfer_params (the decode worker recomputes, counted) and a
decode worker that cannot reach its prefill worker (a clean 500, counted on both sides, the
held KV freed by its timeout). Every prefill worker killed: served aggregated (counted,
/v1/workers says unavailable) or, with enforce_disagg, 503 naming the reason; a restarted prefill
worker makes the pool active again. bootstrap (SGLang's rooms): the same answers, the prefill
call in the background, everything freed after. Conditional disaggregation (isl): a prompt the
decode pool already holds is served there without a remote prefill.
Every child must exit 0 on SIGTERM with no sanitizer report (the suite also runs under ASan).
Usage: test_disagg.py <path to kvrouter>.
"""
import json
import os
import random
import socket
import sys
import threading
import time

from kvr_harness import (Child, check, eventually, free_ports, raw_request, read_events,
                         read_line, run_scenarios, stream, with_free_ports)

KVR = sys.argv[1]
SEED = int(os.environ.get("KVR_TEST_SEED", str(int(time.time()) % 100000)))
rng = random.Random(SEED)
BS = 16


def mocker(*extra, role="both", what="mocker", events=True):
    args = [KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "m",
            "--block-size", str(BS), "--role", role] + [str(a) for a in extra]
    if not events:
        m = Child(args, what)
        m.events = None
        return m

    def start(ev):
        return Child(args + ["--kv-events-config", json.dumps(
            {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}"})],
            what)
    (ev,), m = with_free_ports(start, 1)
    m.events = f"tcp://127.0.0.1:{ev}"
    m.boot = None
    if "bootstrap" in [str(a) for a in extra] and role == "prefill":
        line = read_line(m.proc)
        check(f"{what}: prints its bootstrap port", line.startswith("bootstrap "), line)
        m.boot = int(line.split()[1].rsplit(":", 1)[1])
    return m


def router(workers, *extra, what="router"):
    args = [KVR, "serve", "--http-port", "0", "--block-size", str(BS), "--log-level", "warn"]
    for w in workers:
        args += ["--worker", w]
    return Child(args + [str(a) for a in extra], what)


def spec(wid, m, role):
    s = f"id={wid},url={m.url},role={role}"
    if m.events:
        s += f",events={m.events}"
    if getattr(m, "boot", None):
        s += f",bootstrap_port={m.boot}"
    return s


def toks(n):
    return [rng.randrange(1000, 30000) for _ in range(n)]




def text_of(ep, body):
    c = body["choices"][0]
    return c["message"]["content"] if ep == "chat" else c["text"]


def stream_text(ep, chunks):
    out = ""
    for c in chunks:
        for ch in c.get("choices", []):
            out += (ch.get("delta", {}).get("content") or "") if ep == "chat" else ch.get("text", "")
    return out


def subscribed(m):
    return eventually(lambda: (m.metric("kvr_mocker_kv_event_subscribers") or 0) >= 1, 10)


def held(ms):
    return sum(m.metric("kvr_mocker_kv_held_requests") or 0 for m in ms)


def active_blocks(ms):
    return sum(m.metric("kvr_mocker_blocks_active") or 0 for m in ms)


def idle(r, ps, ds):
    return (r.metric("kvr_requests_in_flight") == 0 and r.metric("kvr_frontend_in_flight") == 0
            and held(ps) == 0 and active_blocks(ps + ds) == 0)




def body_for(ep, prompt, **kw):
    if ep == "chat":
        return dict({"model": "m", "messages": [{"role": "user", "content": prompt}]}, **kw)
    return dict({"model": "m", "prompt": prompt}, **kw)


def reference(agg, ep, prompt, n):
    """What an aggregated engine answers (the same seed, so the same tokens)."""
    st, b = agg.call("POST", "/v1/chat/completions" if ep == "chat" else "/v1/completions",
                     body_for(ep, prompt, max_tokens=n))
    return text_of(ep, b) if st == 200 else None


# ------------------------------------------------------------------------------------------

def answers(r, agg, ps, ds, conv):
    """Completions and chat, streamed and not: the aggregated engine's tokens, both workers
    named, the mode counted, nothing left held."""
    pids = {1, 2} if len(ps) == 2 else {1}
    dids = {3, 4}
    n0 = r.metric("kvr_disagg_requests_total", mode=conv) or 0
    done = 0
    for ep, path in (("completions", "/v1/completions"), ("chat", "/v1/chat/completions")):
        prompt = " ".join(f"w{rng.randrange(10**6)}" for _ in range(40))
        want = reference(agg, ep, prompt, 6)
        st, b, h = r.call_h("POST", path, body_for(ep, prompt, max_tokens=6,
                                                   nvext={"extra_fields": ["worker_id"]}))
        check(f"{conv} {ep}: 200", st == 200, (st, b))
        if st != 200:
            continue
        done += 1
        check(f"{conv} {ep}: the aggregated engine's tokens", text_of(ep, b) == want,
              (text_of(ep, b), want))
        wid = b.get("nvext", {}).get("worker_id", {})
        check(f"{conv} {ep}: nvext names a prefill and a decode worker",
              wid.get("prefill_worker_id") in pids and wid.get("decode_worker_id") in dids, wid)
        check(f"{conv} {ep}: headers name both",
              int(h.get("x-kvrouter-prefill-worker-id", -1)) == wid.get("prefill_worker_id")
              and int(h.get("x-kvrouter-worker-id", -1)) == wid.get("decode_worker_id"),
              dict(h))
        check(f"{conv} {ep}: usage counts the prompt and 6 tokens",
              b["usage"]["completion_tokens"] == 6 and b["usage"]["prompt_tokens"] > 40,
              b.get("usage"))
        st, h, chunks, problems = stream(r, path, body_for(ep, prompt, max_tokens=6))
        check(f"{conv} {ep} (stream): well-formed SSE", st == 200 and not problems,
              (st, problems))
        check(f"{conv} {ep} (stream): the same tokens", stream_text(ep, chunks) == want,
              (stream_text(ep, chunks), want))
        done += st == 200
    check(f"{conv}: every answer counted as {conv}",
          eventually(lambda: (r.metric("kvr_disagg_requests_total", mode=conv) or 0) - n0 == done,
                     5), (r.metric("kvr_disagg_requests_total", mode=conv), n0, done))
    check(f"{conv}: prefill answers handed on",
          (r.metric("kvr_disagg_prefill_total", outcome="ok") or 0) >= done)
    check(f"{conv}: the decode workers read the KV",
          sum(m.metric("kvr_mocker_kv_transfers_total") or 0 for m in ds) >= done)
    check(f"{conv}: the decode engines admitted it loaded (no prefill)",
          sum(m.metric("kvr_mocker_kv_loaded_requests_total") or 0 for m in ds) >= done)
    check(f"{conv}: everything freed (router, held KV, blocks)",
          eventually(lambda: idle(r, ps, ds), 10),
          (r.metric("kvr_requests_in_flight"), held(ps), active_blocks(ps + ds)))


def affinity(r, ps, ds):
    """A repeated prompt goes to the prefill worker holding it; the decode worker's index
    entries appear after the transfer."""
    prompt = toks(BS * 12)
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": prompt,
                                                     "max_tokens": 2})
    check("affinity: first 200", st == 200, b)
    pf = int(h.get("x-kvrouter-prefill-worker-id", -1))
    dw = int(h.get("x-kvrouter-worker-id", -1))
    pm = ps[pf - 1] if 1 <= pf <= len(ps) else None
    hits0 = pm.metric("vllm:prefix_cache_hits_total") if pm else 0
    # the router learns the prefill worker's blocks from its events, then the repeat goes there

    def seen(wid):
        st, q = r.call("POST", "/v1/query", {"tokens": prompt})
        ranks = q.get("scores", []) if isinstance(q, dict) else []
        return any(x.get("worker_id") == wid and x.get("device_blocks", 0) >= 12 for x in ranks)
    check("affinity: the prefill worker's blocks reach the index", eventually(lambda: seen(pf), 10))
    check("affinity: the decode worker's transferred blocks reach the index",
          eventually(lambda: seen(dw), 10))
    for i in range(3):
        st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": prompt,
                                                         "max_tokens": 2})
        check(f"affinity: repeat {i} goes to prefill worker {pf}",
              st == 200 and int(h.get("x-kvrouter-prefill-worker-id", -1)) == pf,
              (st, dict(h)))
    check("affinity: its prefix cache hit", pm is not None and
          pm.metric("vllm:prefix_cache_hits_total") >= hits0 + 3 * 11 * BS,
          (pm.metric("vllm:prefix_cache_hits_total") if pm else None, hits0))


def prerouted(r, ps, ds):
    prompt = toks(80)
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": prompt,
                                                     "max_tokens": 2},
                        {"x-prefill-instance-id": "2", "x-decode-instance-id": "3"})
    check("pre-routed (headers): the named legs",
          st == 200 and h.get("x-kvrouter-prefill-worker-id") == "2"
          and h.get("x-kvrouter-worker-id") == "3", (st, dict(h)))
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": prompt,
                                                     "max_tokens": 2,
                                                     "nvext": {"prefill_worker_id": 1,
                                                               "decode_worker_id": 4}})
    check("pre-routed (nvext): the named legs",
          st == 200 and h.get("x-kvrouter-prefill-worker-id") == "1"
          and h.get("x-kvrouter-worker-id") == "4", (st, dict(h)))
    st, b = r.call("POST", "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 2},
                   {"x-prefill-instance-id": "3"})
    check("pre-routed: a decode worker named as prefill is 400 naming it",
          st == 400 and "x-prefill-instance-id" in json.dumps(b), (st, b))
    st, b = r.call("POST", "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 2},
                   {"x-prefill-instance-id": "x"})
    check("pre-routed: a malformed id is 400", st == 400, (st, b))


def query_only(r, ps, ds):
    prompt = toks(64)
    in0 = r.metric("kvr_requests_in_flight")
    st, b = r.call("POST", "/v1/route", {"tokens": prompt, "disagg": True,
                                         "update_state": False})
    check("query-only: both choices", st == 200 and b.get("disagg") is True
          and b.get("prefill_worker_id") in (1, 2) and b.get("worker_id") in (3, 4), (st, b))
    check("query-only: nothing booked", r.metric("kvr_requests_in_flight") == in0)
    st, b = r.call("POST", "/v1/route", {"tokens": prompt, "disagg": True,
                                         "request_id": "dq-1"})
    check("booked: both legs in flight", st == 200 and b.get("prefill_request_id") ==
          "dq-1-prefill" and r.metric("kvr_requests_in_flight") == in0 + 2, (st, b))
    for rid in ("dq-1", "dq-1-prefill"):
        st, _ = r.call("DELETE", f"/v1/requests/{rid}")
        check(f"booked: {rid} freed", st in (200, 204), st)
    check("booked: nothing left", r.metric("kvr_requests_in_flight") == in0)


def disconnects(r, ps, ds):
    # before the prefill (or wherever the close finds it): sent and dropped at once
    for _ in range(5):
        raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(512),
                                           "max_tokens": 50, "stream": True}).close()
    check("leave at once: everything freed", eventually(lambda: idle(r, ps, ds), 10),
          (r.metric("kvr_requests_in_flight"), held(ps), active_blocks(ps + ds)))
    # during the decode: the stream is running
    s = raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(64), "max_tokens": 20000,
                                           "stream": True})
    got = read_events(s, 3, limit_s=10)
    check("leave during decode: tokens arrived", got.count(b"data: ") >= 3, got[:200])
    s.close()
    check("leave during decode: everything freed", eventually(lambda: idle(r, ps, ds), 10),
          (r.metric("kvr_requests_in_flight"), held(ps), active_blocks(ps + ds)))
    # during the prefill: a long prompt on the slow prefill worker (pinned), left mid-prefill
    running0 = ps[1].metric("vllm:num_requests_running")
    s = raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(6000), "max_tokens": 4,
                                           "nvext": {"prefill_worker_id": 2}})
    check("leave during prefill: the prefill runs",
          eventually(lambda: (ps[1].metric("vllm:num_requests_running") or 0) > running0, 10))
    s.close()
    check("leave during prefill: everything freed", eventually(lambda: idle(r, ps, ds), 10),
          (r.metric("kvr_requests_in_flight"), held(ps), active_blocks(ps + ds)))
    check("leave during prefill: the prefill ran out and its KV was released through a "
          "decode worker", (r.metric("kvr_disagg_orphan_releases_total", result="ok") or 0) >= 1
          and ps[1].metric("kvr_mocker_kv_holds_expired_total") == 0,
          (r.metric("kvr_disagg_orphan_releases_total", result="ok"),
           ps[1].metric("kvr_mocker_kv_holds_expired_total")))


def scenario_pull():
    ps = [mocker("--speedup", 20, role="prefill", what="prefill1"),
          mocker("--speedup", 0.5, role="prefill", what="prefill2")]
    ds = [mocker("--speedup", 20, role="decode", what=f"decode{i}") for i in (3, 4)]
    agg = mocker("--speedup", 50, role="both", what="aggregated", events=False)
    r = router([spec(1, ps[0], "prefill"), spec(2, ps[1], "prefill"),
                spec(3, ds[0], "decode"), spec(4, ds[1], "decode")],
               "--health-interval-ms", "60000")
    try:
        check("pull: every engine has the router's subscription",
              all(subscribed(m) for m in ps + ds))
        st, w = r.call("GET", "/v1/workers")
        roles = sorted((x["worker_id"], x["role"]) for x in w.get("workers", []))
        check("pull: /v1/workers shows the roles", roles == [(1, "prefill"), (2, "prefill"),
                                                             (3, "decode"), (4, "decode")], w)
        check("pull: the prefill pool is active", r.metric("kvr_disagg_state") == 1)
        answers(r, agg, ps, ds, "pull")
        affinity(r, ps, ds)
        prerouted(r, ps, ds)
        query_only(r, ps, ds)
        disconnects(r, ps, ds)
    finally:
        r.stop()
        for m in ps + ds + [agg]:
            m.stop()


def scenario_faults():
    """Garbage kv_transfer_params; a decode worker that cannot reach its prefill worker."""
    bad = mocker("--speedup", 20, "--kv-transfer-fault", "bad-params", role="prefill",
                 what="prefill-bad-params", events=False)
    far = mocker("--speedup", 20, "--kv-transfer-fault", "bad-port", "--kv-hold-timeout", "1",
                 role="prefill", what="prefill-bad-port", events=False)
    d = mocker("--speedup", 20, role="decode", what="decode", events=False)
    agg = mocker("--speedup", 50, role="both", what="aggregated", events=False)
    r = router([f"id=1,url={bad.url},role=prefill", f"id=2,url={far.url},role=prefill",
                f"id=3,url={d.url},role=decode"], "--health-interval-ms", "60000")
    try:
        prompt = " ".join(f"v{rng.randrange(10**6)}" for _ in range(30))
        want = reference(agg, "completions", prompt, 4)
        st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": prompt,
                                                         "max_tokens": 4},
                            {"x-prefill-instance-id": "1"})
        check("bad params: still answered (the decode worker recomputes)",
              st == 200 and text_of("completions", b) == want, (st, b, want))
        check("bad params: counted", r.metric("kvr_disagg_prefill_total",
                                              outcome="bad_params") == 1)
        check("bad params: the decode worker prefilled it itself",
              (d.metric("kvr_mocker_kv_transfers_total") or 0) == 0
              and (d.metric("vllm:prompt_tokens_total") or 0) > 0)
        st, b = r.call("POST", "/v1/completions", {"model": "m", "prompt": prompt,
                                                   "max_tokens": 4},
                       {"x-prefill-instance-id": "2"})
        check("unreachable prefill: a clean 500 in the OpenAI shape",
              st == 500 and isinstance(b, dict) and "KV transfer" in b["error"]["message"],
              (st, b))
        check("unreachable prefill: the decode worker counts the failure",
              d.metric("kvr_mocker_kv_transfer_failures_total") == 1)
        check("unreachable prefill: the router counts a 5xx",
              (r.metric("kvr_frontend_upstream_errors_total", kind="status_5xx") or 0) >= 1)
        check("unreachable prefill: the held KV is freed by its timeout",
              eventually(lambda: far.metric("kvr_mocker_kv_holds_expired_total") == 1
                         and held([far]) == 0, 10))
        check("faults: the router holds nothing", eventually(
            lambda: r.metric("kvr_requests_in_flight") == 0, 5))
    finally:
        r.stop()
        for m in (bad, far, d, agg):
            m.stop()


def scenario_retry():
    """A prefill worker that refuses connections: the prefill is retried on another prefill
    worker (chosen first because the live one is busy with a long prefill)."""
    p = mocker("--speedup", 0.5, role="prefill", what="prefill-slow", events=False)
    dead = free_ports(1)
    d = mocker("--speedup", 20, role="decode", what="decode", events=False)
    r = router([f"id=1,url={p.url},role=prefill", f"id=2,url=http://127.0.0.1:{dead},role=prefill",
                f"id=3,url={d.url},role=decode"], "--health-interval-ms", "60000")
    try:
        busy = raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(6000),
                                                  "max_tokens": 1},)
        check("retry: the live prefill worker is busy",
              eventually(lambda: (p.metric("vllm:num_requests_running") or 0) >= 1, 10))
        st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": toks(64),
                                                         "max_tokens": 2})
        check("retry: answered by the live prefill worker after the dead one refused",
              st == 200 and h.get("x-kvrouter-prefill-worker-id") == "1", (st, b, dict(h)))
        check("retry: counted as a retry after a refused connection",
              (r.metric("kvr_frontend_retries_total") or 0) >= 1
              and (r.metric("kvr_frontend_upstream_errors_total", kind="connect") or 0) >= 1,
              (r.metric("kvr_frontend_retries_total"),
               r.metric("kvr_frontend_upstream_errors_total", kind="connect")))
        check("retry: still disaggregated", r.metric("kvr_disagg_requests_total", mode="pull")
              >= 1 and (r.metric("kvr_disagg_bypass_total", reason="prefill_failed") or 0) == 0)
        busy.close()
        check("retry: the router holds nothing at the end", eventually(
            lambda: r.metric("kvr_requests_in_flight") == 0, 10))
    finally:
        r.stop()
        p.stop()
        d.stop()


def scenario_orphan():
    """A request prefilled whose decode leg cannot be placed (every decode worker busy: 429):
    the router asks a decode worker to read the held KV at once instead of leaving it held on
    the prefill worker until its timeout (30 s here)."""
    p = mocker("--speedup", 20, role="prefill", what="prefill", events=False)
    d = mocker("--speedup", 20, "--num-gpu-blocks", 1024, role="decode", what="decode",
               events=False)
    r = router([f"id=1,url={p.url},role=prefill", f"id=3,url={d.url},role=decode,num_blocks=1024"],
               "--active-decode-blocks-threshold", "0.001", "--health-interval-ms", "60000")
    try:
        s = raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(64),
                                               "max_tokens": 16000, "stream": True})
        got = read_events(s, 2, limit_s=10)
        check("orphan: a long decode holds the decode worker", got.count(b"data: ") >= 2,
              got[:300])
        st, b = r.call("POST", "/v1/completions", {"model": "m", "prompt": toks(64),
                                                   "max_tokens": 4})
        check("orphan: the decode pool is busy: 429", st == 429, (st, b))
        check("orphan: the prefill ran", (p.metric("kvr_mocker_kv_holds_total") or 0) == 2)
        check("orphan: a release call was made",
              eventually(lambda: r.metric("kvr_disagg_orphan_releases_total", result="ok") == 1,
                         10), r.metric("kvr_disagg_orphan_releases_total", result="ok"))
        check("orphan: the prefill worker's KV is freed by the read, not its timeout",
              held([p]) == 0 and p.metric("kvr_mocker_kv_reads_served_total") == 2
              and p.metric("kvr_mocker_kv_holds_expired_total") == 0)
        s.close()
        check("orphan: everything freed", eventually(lambda: idle(r, [p], [d]), 10),
              (r.metric("kvr_requests_in_flight"), held([p]), active_blocks([p, d])))
    finally:
        r.stop()
        p.stop()
        d.stop()


def scenario_unavailable():
    """Every prefill worker killed: aggregated (counted) or 503 with enforce; active again
    when one restarts on its address."""
    p = mocker("--speedup", 20, role="prefill", what="prefill")
    d = mocker("--speedup", 20, role="decode", what="decode")
    workers = [spec(1, p, "prefill"), spec(3, d, "decode")]
    common = ("--health-interval-ms", "100", "--health-failures", "1")
    r = router(workers, *common)
    e = router(workers, *common, "--enforce-disagg", "true", what="router-enforce")
    try:
        check("unavailable: subscribed", subscribed(p) and subscribed(d))
        st, b = r.call("POST", "/v1/completions", {"model": "m", "prompt": toks(40),
                                                   "max_tokens": 2})
        check("unavailable: disaggregated while the prefill worker lives",
              st == 200 and r.metric("kvr_disagg_requests_total", mode="pull") == 1, (st, b))
        port, ev = p.port, p.events
        p.kill()
        for x in (r, e):
            check(f"unavailable: {x.what} sees the pool unavailable",
                  eventually(lambda: x.metric("kvr_disagg_state") == 2, 10),
                  x.metric("kvr_disagg_state"))
        st, w = r.call("GET", "/v1/workers")
        check("unavailable: /v1/workers says so", w.get("disagg", {}).get("state") ==
              "unavailable", w.get("disagg"))
        st, b = r.call("POST", "/v1/completions", {"model": "m", "prompt": toks(40),
                                                   "max_tokens": 2})
        check("unavailable: served aggregated on the decode pool",
              st == 200 and r.metric("kvr_disagg_requests_total", mode="aggregated") == 1,
              (st, b))
        check("unavailable: counted as a bypass",
              r.metric("kvr_disagg_bypass_total", reason="unavailable") == 1)
        st, b = e.call("POST", "/v1/completions", {"model": "m", "prompt": toks(40),
                                                   "max_tokens": 2})
        check("enforce: 503 naming the reason", st == 503 and "enforce_disagg" in
              json.dumps(b), (st, b))
        check("enforce: counted", e.metric("kvr_disagg_refused_total") == 1)
        st, b = e.call("POST", "/v1/route", {"tokens": toks(40), "disagg": True})
        check("enforce: /v1/route disagg is 503 too", st == 503, (st, b))
        # the prefill worker comes back on its address
        p2 = Child([KVR, "mocker", "--host", "127.0.0.1", "--port", str(port), "--model", "m",
                    "--block-size", str(BS), "--role", "prefill", "--speedup", "20",
                    "--kv-events-config", json.dumps({"enable_kv_cache_events": True,
                                                      "publisher": "zmq",
                                                      "endpoint": "tcp://*:" +
                                                      ev.rsplit(":", 1)[1]})], "prefill-again")
        try:
            for x in (r, e):
                check(f"reactivated: {x.what} sees the pool active again",
                      eventually(lambda: x.metric("kvr_disagg_state") == 1, 10),
                      x.metric("kvr_disagg_state"))
            st, b = e.call("POST", "/v1/completions", {"model": "m", "prompt": toks(40),
                                                       "max_tokens": 2})
            check("reactivated: disaggregated again", st == 200 and
                  e.metric("kvr_disagg_requests_total", mode="pull") == 1, (st, b))
            check("reactivated: transitions counted (logged once each)", eventually(
                lambda: r.metric("kvr_disagg_state_transitions_total", to="unavailable") == 1
                and r.metric("kvr_disagg_state_transitions_total", to="active") == 2, 5),
                (r.metric("kvr_disagg_state_transitions_total", to="unavailable"),
                 r.metric("kvr_disagg_state_transitions_total", to="active")))
        finally:
            p2.stop()
    finally:
        r.stop()
        e.stop()
        d.stop()


def scenario_bootstrap():
    ps = [mocker("--speedup", 20, "--kv-transfer", "bootstrap", role="prefill",
                 what="bprefill1")]
    ds = [mocker("--speedup", 20, "--kv-transfer", "bootstrap", role="decode",
                 what=f"bdecode{i}") for i in (3, 4)]
    agg = mocker("--speedup", 50, role="both", what="aggregated", events=False)
    r = router([spec(1, ps[0], "prefill"), spec(3, ds[0], "decode"), spec(4, ds[1], "decode")],
               "--health-interval-ms", "60000")
    try:
        check("bootstrap: subscribed", all(subscribed(m) for m in ps + ds))
        st, w = r.call("GET", "/v1/workers")
        boot = [x.get("bootstrap_port") for x in w.get("workers", []) if x["worker_id"] == 1]
        check("bootstrap: /v1/workers shows the bootstrap port", boot == [ps[0].boot], boot)
        answers(r, agg, ps, ds, "bootstrap")
        check("bootstrap: the prefill worker served every room",
              ps[0].metric("kvr_mocker_kv_reads_served_total") ==
              ps[0].metric("kvr_mocker_kv_holds_total"))
        check("bootstrap: no read left waiting", ps[0].metric("kvr_mocker_kv_bootstrap_waiting")
              == 0)
        s = raw_request(r, "/v1/chat/completions", {"model": "m", "messages": [
            {"role": "user", "content": "stay a while " * 30}], "max_tokens": 20000,
            "stream": True})
        got = read_events(s, 3, limit_s=10)
        s.close()
        check("bootstrap: tokens arrived before leaving", got.count(b"data: ") >= 3, got[:200])
        check("bootstrap: a client leaving mid-stream frees everything",
              eventually(lambda: idle(r, ps, ds), 10),
              (r.metric("kvr_requests_in_flight"), held(ps), active_blocks(ps + ds)))
    finally:
        r.stop()
        for m in ps + ds + [agg]:
            m.stop()


def scenario_conditional():
    """disagg_policy isl: a prompt the decode pool holds is prefilled there, not remotely."""
    p = mocker("--speedup", 20, role="prefill", what="prefill")
    d = mocker("--speedup", 20, role="decode", what="decode")
    r = router([spec(1, p, "prefill"), spec(3, d, "decode")], "--disagg-policy", "isl",
               "--disagg-isl-threshold", "100000", "--health-interval-ms", "60000")
    try:
        check("conditional: subscribed", subscribed(p) and subscribed(d))
        prompt = toks(BS * 20)
        st, b = r.call("POST", "/v1/completions", {"model": "m", "prompt": prompt,
                                                   "max_tokens": 2})
        check("conditional: a new prompt is prefilled remotely",
              st == 200 and r.metric("kvr_disagg_requests_total", mode="pull") == 1, (st, b))

        def held_by_decode():
            st, q = r.call("POST", "/v1/query", {"tokens": prompt})
            ranks = q.get("scores", []) if isinstance(q, dict) else []
            return any(x.get("worker_id") == 3 and x.get("device_blocks", 0) >= 19
                       for x in ranks)
        check("conditional: the decode worker's copy is indexed", eventually(held_by_decode, 10))
        st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": prompt,
                                                         "max_tokens": 2})
        check("conditional: the repeat stays on the decode worker (isl bypass)",
              st == 200 and r.metric("kvr_disagg_bypass_total", reason="isl") == 1
              and r.metric("kvr_disagg_requests_total", mode="aggregated") == 1
              and h.get("x-kvrouter-worker-id") == "3", (st, dict(h)))
        check("conditional: its cached tokens say so",
              b["usage"]["prompt_tokens_details"]["cached_tokens"] >= 19 * BS, b.get("usage"))
    finally:
        r.stop()
        p.stop()
        d.stop()


class Trap:
    """A listener on a free loopback port that an engine must never be steered to."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def hit(self):
        """Whether a connection came in (accepted and closed at once)."""
        try:
            c, _ = self.sock.accept()
        except BlockingIOError:
            return False
        c.close()
        return True

    def close(self):
        self.sock.close()


def scenario_client_kvt():
    """A client's kv_transfer_params and bootstrap_* never reach an engine: on a fleet that
    serves aggregated (here: decode workers alone), in both conventions, on the verbatim path
    (token prompts, no nvext) and with the key spelt with escapes; stripped, counted. With
    frontend_trust_kv_transfer (a gateway that sets them itself) they go through."""
    trap = Trap()
    d = mocker("--speedup", 20, role="decode", what="decode")
    bd = mocker("--speedup", 20, "--kv-transfer", "bootstrap", role="decode", what="bdecode")
    r = router([spec(3, d, "decode")], "--health-interval-ms", "60000")
    rb = router([spec(4, bd, "decode")], "--health-interval-ms", "60000", what="router-boot")
    rt = router([spec(3, d, "decode")], "--health-interval-ms", "60000",
                "--frontend-trust-kv-transfer", "true", what="router-trusting")
    pull = {"do_remote_prefill": True, "do_remote_decode": False, "remote_host": "127.0.0.1",
            "remote_port": trap.port, "remote_request_id": "stolen", "remote_engine_id": "e0",
            "remote_block_ids": [1, 2, 3]}
    boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": trap.port, "bootstrap_room": 7}
    try:
        check("client kvt: subscribed", subscribed(d) and subscribed(bd))
        cases = [(r, "pull, token prompt", {"model": "m", "prompt": toks(40), "max_tokens": 2,
                                           "kv_transfer_params": pull}),
                 (r, "pull, chat", {"model": "m", "max_tokens": 2, "kv_transfer_params": pull,
                                    "messages": [{"role": "user", "content": "hello there"}]}),
                 (rb, "bootstrap, token prompt", dict({"model": "m", "prompt": toks(40),
                                                      "max_tokens": 2}, **boot)),
                 (rb, "bootstrap, text prompt", dict({"model": "m", "prompt": "x y z",
                                                     "max_tokens": 2}, **boot))]
        for i, (x, what, body) in enumerate(cases):
            st, b = x.call("POST", "/v1/chat/completions" if "messages" in body
                           else "/v1/completions", body, timeout=20)
            check(f"client kvt: {what}: served", st == 200, (st, b))
            check(f"client kvt: {what}: the engine never connected to the client's host",
                  not trap.hit())
            check(f"client kvt: {what}: stripped, counted", x.metric(
                "kvr_frontend_kv_transfer_stripped_total") == (i % 2) + 1)
        # a key spelt with escapes is the same key to the engine's JSON parser
        raw = ('{"model":"m","max_tokens":2,"prompt":%s,"kv\\u005ftransfer_params":%s}'
               % (json.dumps(toks(40)), json.dumps(pull)))
        st, b = r.call("POST", "/v1/completions", raw, timeout=20)
        check("client kvt: an escaped key is stripped too", st == 200 and not trap.hit(), (st, b))
        check("client kvt: the engine read no KV", d.metric("kvr_mocker_kv_transfers_total") in
              (0, None) and d.metric("kvr_mocker_kv_transfer_failures_total") in (0, None))
        # a trusted gateway's fields go through: the trap sees the engine (this proves the
        # checks above could fail)
        got = []
        t = threading.Thread(target=lambda: got.append(rt.call(
            "POST", "/v1/completions", {"model": "m", "prompt": toks(40), "max_tokens": 2,
                                        "kv_transfer_params": pull}, timeout=30)))
        t.start()
        check("client kvt: trusted: forwarded (the engine dialled the named host)",
              eventually(trap.hit, 10))
        t.join(40)
        check("client kvt: trusted: answered once the named host hung up", got and
              got[0][0] in (200, 500, 502), got)
        check("client kvt: trusted: not counted as stripped",
              rt.metric("kvr_frontend_kv_transfer_stripped_total") == 0)
    finally:
        for x in (r, rb, rt, d, bd):
            x.stop()
        trap.close()


def scenario_silent_prefill():
    """A prefill worker that accepts the call and never answers holds the client for
    frontend_prefill_timeout_ms, not the whole upstream timeout: then the request is served on
    the decode pool (counted)."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # accepts (the kernel's backlog) and never answers
    d = mocker("--speedup", 20, role="decode", what="decode")
    r = router([f"id=1,url=http://127.0.0.1:{hole.getsockname()[1]},role=prefill",
                spec(3, d, "decode")], "--health-interval-ms", "600000",
               "--frontend-prefill-timeout-ms", "500", "--frontend-max-retries", "0")
    try:
        t0 = time.monotonic()
        st, b = r.call("POST", "/v1/completions", {"model": "m", "prompt": toks(40),
                                                   "max_tokens": 2}, timeout=60)
        took = time.monotonic() - t0
        check("silent prefill: served on the decode pool", st == 200 and
              r.metric("kvr_disagg_bypass_total", reason="prefill_failed") == 1, (st, b))
        check("silent prefill: after the prefill deadline, not the upstream timeout",
              0.4 < took < 20, took)
    finally:
        r.stop()
        d.stop()
        hole.close()


def scenario_direct():
    """--router-mode direct with a prefill pool: a gateway names both legs' workers; a request
    naming only its decode worker is refused naming the prefill header (the reference's direct
    mode errs too), one naming both is served through them."""
    p = mocker("--speedup", 20, role="prefill", what="prefill(direct)", events=False)
    d = mocker("--speedup", 20, role="decode", what="decode(direct)", events=False)
    r = router([spec(1, p, "prefill"), spec(2, d, "decode")], "--router-mode", "direct",
               "--health-interval-ms", "60000", what="router(direct)")
    try:
        check("direct: the prefill pool is active",
              eventually(lambda: r.metric("kvr_disagg_state") == 1, 10))
        body = {"model": "m", "prompt": toks(64), "max_tokens": 2}
        st, b = r.call("POST", "/v1/completions", body, {"x-decode-instance-id": "2"})
        check("direct: without its prefill worker, 400 naming the header",
              st == 400 and "x-prefill-instance-id" in json.dumps(b), (st, b))
        st, b, h = r.call_h("POST", "/v1/completions", body,
                            {"x-prefill-instance-id": "1", "x-decode-instance-id": "2"})
        check("direct: with both named, served through them",
              st == 200 and h.get("x-kvrouter-prefill-worker-id") == "1"
              and h.get("x-kvrouter-worker-id") == "2", (st, b, dict(h)))
    finally:
        r.stop()
        p.stop()
        d.stop()


def main():
    run_scenarios((("direct", scenario_direct), ("client_kvt", scenario_client_kvt), ("silent_prefill", scenario_silent_prefill),
                   ("pull", scenario_pull), ("faults", scenario_faults), ("retry", scenario_retry),
                   ("orphan", scenario_orphan),
                   ("unavailable", scenario_unavailable), ("bootstrap", scenario_bootstrap),
                   ("conditional", scenario_conditional)), SEED)


if __name__ == "__main__":
    main()
