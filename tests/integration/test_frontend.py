#!/usr/bin/python3
"""`kvrouter serve`'s OpenAI front end, end to end: clients -> router -> `kvrouter mocker`s.

Everything runs on loopback (--port 0 / --http-port 0, KV-event ports picked free): three
mockers publishing KV events and a router in kv mode in front of them, plus small setups for the
queue, the other router modes and dead workers. Checked: completions and chat, streaming (SSE
framing, [DONE], the usage chunk) and not, as OpenAI clients parse them; /v1/models; a repeated
prompt goes back to the worker holding it and reports cached tokens; nvext.extra_fields
["worker_id"]; pinned routing by header and by nvext; text prompts through /tokenize (the
worker runs the ids the router hashed; the cache hits on a repeat); a client that leaves
mid-stream or before its answer frees the router's load and the mocker's blocks; a killed
worker: requests still succeed elsewhere and it gets fenced; 503 when every worker is dead;
429 when the queue is full; errors in the OpenAI shape. Every child must exit 0 on SIGTERM
with no sanitizer report on stderr (the suite also runs under ASan).
Usage: test_frontend.py <path to kvrouter>.
"""
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from kvr_harness import (RESULTS as results, Child, check, eventually, free_ports, raw_request,
                         read_events, run_scenarios, sse_events, stream, with_free_ports)

KVR = sys.argv[1]
SEED = int(os.environ.get("KVR_TEST_SEED", str(int(time.time()) % 100000)))
rng = random.Random(SEED)
BS = 16
def mocker(*extra, events=True, what="mocker", dp=1):
    args = [KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "m",
            "--block-size", str(BS), "--data-parallel-size", str(dp)] + [str(a) for a in extra]
    if not events:
        m = Child(args, what)
        m.events = None
        return m

    def start(ev):
        return Child(args + ["--kv-events-config", json.dumps(
            {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}"})],
            what)
    (ev,), m = with_free_ports(start, dp)
    m.events = f"tcp://127.0.0.1:{ev}"
    return m


def router(workers, *extra, what="router"):
    args = [KVR, "serve", "--http-port", "0", "--block-size", str(BS), "--log-level", "warn"]
    for w in workers:
        args += ["--worker", w]
    return Child(args + [str(a) for a in extra], what)


def spec(wid, m, events=True):
    s = f"id={wid},url={m.url}"
    if events and m.events:
        s += f",events={m.events}"
    return s


def toks(n):
    return [rng.randrange(1000, 30000) for _ in range(n)]




def worker_of(h):
    v = h.get("x-kvrouter-worker-id")
    return int(v) if v is not None else None


def is_openai_error(body, code):
    return (isinstance(body, dict) and isinstance(body.get("error"), dict)
            and isinstance(body["error"].get("message"), str) and body["error"]["message"]
            and isinstance(body["error"].get("type"), str) and "param" in body["error"]
            and body["error"].get("code") == code)


def subscribed(m, engine=None):
    """Bounded wait until the router's subscription has reached the mocker's publisher (one
    rank's, or any): events published before it would be lost to ZeroMQ's slow joiner."""
    labels = {"engine": engine} if engine is not None else {}
    return eventually(lambda: (m.metric("kvr_mocker_kv_event_subscribers", **labels) or 0) >= 1,
                      10)


def loads_idle(r):
    return r.metric("kvr_requests_in_flight") == 0 and r.metric("kvr_frontend_in_flight") == 0


def blocks_active(ms):
    return sum(m.metric("kvr_mocker_blocks_active") or 0 for m in ms)




# ------------------------------------------------------------------------------------------
# The main setup: 3 mockers with KV events, a router in kv mode

def scenario_main():
    ms = [mocker("--speedup", 10, what=f"mocker{i + 1}") for i in range(3)]
    r = router([spec(i + 1, m) for i, m in enumerate(ms)], "--health-interval-ms", "60000",
               "--frontend-fence-failures", "2")
    try:
        check("main: every engine has the router's subscription", all(subscribed(m) for m in ms))
        shapes(r, ms)
        cache_affinity(r, ms)
        pinned(r)
        text_prompts(r, ms)
        concurrent(r, ms)
        cancellation(r, ms)
        errors(r)
        modes(ms)
        dead_workers(r, ms)
    finally:
        r.stop()
        for m in ms:
            m.stop()


def shapes(r, ms):
    st, body, h = r.call_h("GET", "/v1/models")
    check("models: the workers' model", st == 200 and body.get("object") == "list"
          and [d["id"] for d in body.get("data", [])] == ["m"], body)
    p = toks(40)
    st, body, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 5})
    ok = (st == 200 and body.get("object") == "text_completion"
          and isinstance(body["choices"][0]["text"], str) and body["usage"]["prompt_tokens"] == 40
          and body["usage"]["completion_tokens"] == 5 and "nvext" not in body)
    check("completion (ids, whole)", ok, (st, body))
    check("completion names its worker in headers", worker_of(h) in (1, 2, 3), dict(h))
    st, h, chunks, problems = stream(r, "/v1/completions", {
        "model": "m", "prompt": toks(40), "max_tokens": 6, "stream_options": {"include_usage": True}})
    ok = (st == 200 and not problems and h.get("Content-Type") == "text/event-stream"
          and all(c["object"] == "text_completion" for c in chunks)
          and sum(1 for c in chunks if c["choices"]) == 6
          and chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6)
    check("completion (stream, usage chunk)", ok, (st, problems, chunks[-2:]))
    st, h, chunks, problems = stream(r, "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "tell me a story"}],
        "max_tokens": 4})
    ok = (st == 200 and not problems and chunks
          and all(c["object"] == "chat.completion.chunk" for c in chunks)
          and chunks[0]["choices"][0]["delta"].get("role") == "assistant"
          and chunks[-1]["choices"][0]["finish_reason"] == "length")
    check("chat (stream)", ok, (st, problems, chunks[:2]))
    st, body, h = r.call_h("POST", "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_tokens": 3, "temperature": 0.7})
    ok = (st == 200 and body.get("object") == "chat.completion"
          and body["choices"][0]["message"]["role"] == "assistant"
          and body["usage"]["completion_tokens"] == 3)
    check("chat (whole, content parts, sampling fields kept)", ok, (st, body))
    # nvext.token_data: the ids win over the prompt
    td = toks(33)
    st, body, h = r.call_h("POST", "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "ignored"}], "max_tokens": 2,
        "nvext": {"token_data": td}})
    check("chat with nvext.token_data runs those ids",
          st == 200 and body["usage"]["prompt_tokens"] == 33, (st, body))
    st, body, h = r.call_h("POST", "/v1/completions", {
        "model": "m", "prompt": "some text", "max_tokens": 2, "nvext": {"token_data": td}})
    check("completion with nvext.token_data runs those ids",
          st == 200 and body["usage"]["prompt_tokens"] == 33, (st, body))
    # extra_fields worker_id
    st, body, h = r.call_h("POST", "/v1/completions", {
        "model": "m", "prompt": toks(20), "max_tokens": 2, "nvext": {"extra_fields": ["worker_id"]}})
    wi = body.get("nvext", {}).get("worker_id", {}) if st == 200 else {}
    check("extra_fields worker_id (whole)", st == 200 and wi.get("decode_worker_id") == worker_of(h)
          and wi.get("prefill_worker_id") == worker_of(h) and wi.get("decode_dp_rank") == 0, body)
    st, h, chunks, problems = stream(r, "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "x y z"}], "max_tokens": 3,
        "stream_options": {"include_usage": True}, "nvext": {"extra_fields": ["worker_id"]}})
    ok = (st == 200 and not problems and chunks and all(
        c.get("nvext", {}).get("worker_id", {}).get("decode_worker_id") == worker_of(h)
        for c in chunks))
    check("extra_fields worker_id (every stream chunk)", ok, (st, problems, chunks[:1]))


def query_blocks(r, p):
    st, q, _ = r.call_h("POST", "/v1/query", {"tokens": p})
    return {s["worker_id"]: s["device_blocks"] for s in q.get("scores", [])} if st == 200 else {}


def cache_affinity(r, ms):
    p = toks(8 * BS + 5)
    st, b1, h1 = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 2})
    w = worker_of(h1)
    check("affinity: first request served", st == 200 and w is not None, (st, b1))
    seen = eventually(lambda: query_blocks(r, p).get(w) == 8, 10)
    check("affinity: the router sees the prompt's blocks on its worker", seen, query_blocks(r, p))
    same = 0
    for i in range(3):
        st, b2, h2 = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": p + toks(3),
                                                         "max_tokens": 2})
        same += st == 200 and worker_of(h2) == w
        if i == 0:
            cached = b2.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens")
            check("affinity: cached tokens reported", cached == 8 * BS, b2)
    check("affinity: repeats go to the same worker", same == 3, same)
    check("affinity: routes with overlap counted", (r.metric("kvr_routes_with_overlap_total") or 0) >= 3)
    r.affinity = (p, w)


def pinned(r):
    body = {"model": "m", "prompt": toks(20), "max_tokens": 2, "nvext": {"extra_fields": ["worker_id"]}}
    st, b, h = r.call_h("POST", "/v1/completions", body, {"x-worker-instance-id": "3"})
    check("pinned by header", st == 200 and worker_of(h) == 3
          and b["nvext"]["worker_id"]["decode_worker_id"] == 3, (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", dict(body, nvext={"backend_instance_id": 2, "dp_rank": 0}))
    check("pinned by nvext", st == 200 and worker_of(h) == 2, (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", dict(body, nvext={"backend_instance_id": 2}),
                      {"x-worker-instance-id": "1", "x-dp-rank": "0"})
    check("the header wins over nvext", st == 200 and worker_of(h) == 1, (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", dict(body, nvext={"allowed_worker_ids": [2]}))
    check("allowed_worker_ids", st == 200 and worker_of(h) == 2, (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", body, {"x-worker-instance-id": "99"})
    check("pinned to an unknown worker: 400 naming it", st == 400 and is_openai_error(b, 400)
          and "99 is not registered" in b["error"]["message"], (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", body, {"x-decode-instance-id": "99"})
    check("x-decode-instance-id unknown: 400 too", st == 400, (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", body, {"x-worker-instance-id": "1",
                                                          "x-dp-rank": "7"})
    check("pinned to a missing rank: 503", st == 503 and is_openai_error(b, 503), (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", dict(body, nvext={"allowed_worker_ids": [2]}),
                      {"x-worker-instance-id": "1"})
    check("pinned outside allowed_worker_ids: 503", st == 503 and is_openai_error(b, 503), (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", body, {"x-worker-instance-id": "one"})
    check("bad x-worker-instance-id: 400", st == 400 and is_openai_error(b, 400)
          and "x-worker-instance-id" in b["error"]["message"], (st, b))


def text_prompts(r, ms):
    text = "the quick brown fox jumps over the lazy dog " * 20
    hits0 = r.metric("kvr_frontend_tokenize_cache_hits_total")
    miss0 = r.metric("kvr_frontend_tokenize_cache_misses_total")
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": text, "max_tokens": 2})
    st2, tk, _ = ms[0].call_h("POST", "/tokenize", {"model": "m", "prompt": text})
    check("text prompt: the worker ran the tokenized ids", st == 200 and st2 == 200
          and b["usage"]["prompt_tokens"] == tk["count"], (st, b, tk.get("count")))
    check("text prompt: a cache miss", r.metric("kvr_frontend_tokenize_cache_misses_total") == miss0 + 1)
    st, b2, h2 = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": text, "max_tokens": 2})
    check("text prompt: the repeat hits the cache",
          st == 200 and r.metric("kvr_frontend_tokenize_cache_hits_total") == hits0 + 1, b2)
    check("text prompt: the repeat goes where the prefix is", worker_of(h2) == worker_of(h)
          or query_blocks(r, tk["tokens"]).get(worker_of(h), 0) == 0, (worker_of(h), worker_of(h2)))
    msgs = [{"role": "system", "content": "you are terse"}, {"role": "user", "content": "héllo\u0000 wörld"}]
    st, b, h = r.call_h("POST", "/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 2})
    st2, tk, _ = ms[1].call_h("POST", "/tokenize", {"model": "m", "messages": msgs})
    check("chat: the worker ran the tokenized ids", st == 200 and st2 == 200
          and b["usage"]["prompt_tokens"] == tk["count"], (st, b, tk))
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "nope", "prompt": "abc", "max_tokens": 2})
    check("text prompt for an unknown model: the worker's 404 relayed",
          st == 404 and is_openai_error(b, 404), (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "nope", "prompt": [1, 2, 3], "max_tokens": 2})
    check("ids for an unknown model: the worker's 404 relayed",
          st == 404 and is_openai_error(b, 404), (st, b))


def concurrent_streams(r, n, prompt_tokens, max_tokens):
    """n streaming completions at once (prompt i has prompt_tokens + i tokens): per stream,
    True when it streamed max_tokens tokens without a problem, else what went wrong."""
    out = []

    def one(i):
        try:
            st, h, chunks, problems = stream(r, "/v1/completions", {
                "model": "m", "prompt": toks(prompt_tokens + i), "max_tokens": max_tokens})
            out.append(st == 200 and not problems
                       and sum(1 for c in chunks if c["choices"]) == max_tokens)
        except Exception as e:  # noqa: BLE001
            out.append(repr(e))
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    return out


def concurrent(r, ms):
    out = concurrent_streams(r, 16, 30, 8)
    check("16 concurrent streams complete", out.count(True) == 16, out)
    check("load drains to 0 after them", eventually(lambda: loads_idle(r), 5))


def cancellation(r, ms):
    gone0 = r.metric("kvr_frontend_client_disconnects_total")
    s = raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(64), "max_tokens": 20000,
                                           "stream": True})
    got = read_events(s, 3, limit_s=10)
    check("cancel (stream): tokens arrived", got.count(b"data: ") >= 3, got[:300])
    check("cancel (stream): the router holds it", (r.metric("kvr_requests_in_flight") or 0) >= 1)
    s.close()
    check("cancel (stream): the router's load drains to 0", eventually(lambda: loads_idle(r), 5),
          (r.metric("kvr_requests_in_flight"), r.metric("kvr_frontend_in_flight")))
    check("cancel (stream): the mocker's blocks are freed",
          eventually(lambda: blocks_active(ms) == 0, 5), blocks_active(ms))
    check("cancel (stream): counted", r.metric("kvr_frontend_client_disconnects_total") == gone0 + 1)
    # a non-streaming client that leaves before its answer (noticed by the probe)
    s = raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(64), "max_tokens": 20000})
    check("cancel (whole): generating", eventually(lambda: blocks_active(ms) > 0, 5))
    s.close()
    check("cancel (whole): the router's load drains to 0", eventually(lambda: loads_idle(r), 5))
    check("cancel (whole): the mocker's blocks are freed",
          eventually(lambda: blocks_active(ms) == 0, 5), blocks_active(ms))
    check("cancel (whole): counted", r.metric("kvr_frontend_client_disconnects_total") == gone0 + 2)


def errors(r):
    st, b, h = r.call_h("POST", "/v1/completions", "{not json")
    check("bad JSON: 400 in the OpenAI shape", st == 400 and is_openai_error(b, 400), (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "max_tokens": 3})
    check("missing prompt: 400 naming it", st == 400 and is_openai_error(b, 400)
          and "prompt" in b["error"]["message"], (st, b))
    st, b, h = r.call_h("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user"}],
                                                       "n": 2})
    check("n > 1: 400", st == 400 and is_openai_error(b, 400), (st, b))
    st, b, h = r.call_h("GET", "/v1/nothing")
    check("unknown path: 404", st == 404 and "error" in b, (st, b))
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": [1, 2], "max_tokens": 10**6})
    check("the worker's 400 relayed", st == 400 and is_openai_error(b, 400), (st, b))


def modes(ms):
    for mode in ("round-robin", "random", "least-loaded", "approx"):
        events = mode != "approx"
        r = router([spec(i + 1, m, events) for i, m in enumerate(ms)], "--router-mode", mode,
                   what=f"router[{mode}]")
        try:
            seen = set()
            p = toks(4 * BS)
            ok = True
            for _ in range(6):
                st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": p if mode == "approx"
                                                              else toks(4 * BS), "max_tokens": 2})
                ok = ok and st == 200
                seen.add(worker_of(h))
            check(f"mode {mode}: requests served", ok)
            if mode == "round-robin":
                check("round-robin spreads over the workers", seen == {1, 2, 3}, seen)
            if mode == "approx":
                check("approx: a repeated prompt stays on the worker its decision recorded",
                      len(seen) == 1, seen)
        finally:
            r.stop()


def dead_workers(r, ms):
    """A killed worker with KV events: its lost events connection and a failed /health fence
    it before any request has to fail on it (tests/faults covers one without events, found
    by a failed request and retried)."""
    p, w = r.affinity
    retries0 = r.metric("kvr_frontend_retries_total")
    ms[w - 1].kill()

    def wk():
        st, ws, _ = r.call_h("GET", "/v1/workers")
        return [x for x in ws["workers"] if x["worker_id"] == w][0]

    check("killed worker: fenced and shown unreachable (no request needed)",
          eventually(lambda: wk()["fenced"] and wk()["ranks"][0]["index_state"] == "unreachable",
                     10), wk())
    check("killed worker: its index state dropped", wk()["ranks"][0]["index_blocks"] == 0, wk())
    check("killed worker: the lost connection counted",
          (r.metric("kvr_kv_disconnects_total") or 0) >= 1)
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 2})
    check("killed worker: the request is served elsewhere", st == 200 and worker_of(h) != w,
          (st, b, worker_of(h), w))
    check("killed worker: nothing sent to it (no retry)",
          r.metric("kvr_frontend_retries_total") == retries0)
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 2},
                        {"x-worker-instance-id": str(w)})
    check("pinned to the killed worker: 503", st == 503 and is_openai_error(b, 503), (st, b))
    for i in range(4):
        st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": toks(20), "max_tokens": 2})
        check(f"after the fence, request {i} served by a live worker", st == 200 and worker_of(h) != w)
    check("the load is back to 0", eventually(lambda: loads_idle(r), 5))
    for m in ms:
        m.stop()
    st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": toks(20), "max_tokens": 2})
    check("every worker dead: 503 in the OpenAI shape", st == 503 and is_openai_error(b, 503), (st, b))
    st, b, h = r.call_h("POST", "/v1/chat/completions", {"model": "m", "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "hi"}]})
    check("every worker dead, text to tokenize: 503", st == 503 and is_openai_error(b, 503), (st, b))
    check("the load is 0 after the failures", eventually(lambda: loads_idle(r), 5))


# ------------------------------------------------------------------------------------------
# The queue: a slow worker busy with one long prefill; two more wait, the next gets 429

def scenario_queue():
    m = mocker("--speedup", 0.02, events=False, what="mocker(slow)")
    busy = f"id=1,url={m.url},max_num_batched_tokens=1000000"
    r = router([busy], "--router-queue-threshold", "0.001", "--router-queue-max-requests", "2",
               "--router-queue-timeout-ms", "20000", what="router(queue)")
    out = {}

    def go(name, rt, body):
        try:
            out[name] = rt.call_h("POST", "/v1/completions", body, timeout=60)
        except Exception as e:  # noqa: BLE001
            out[name] = (repr(e), None, None)

    def small():
        return {"model": "m", "prompt": toks(20), "max_tokens": 2}
    r2 = None
    try:
        ts = [threading.Thread(target=go, args=("a", r, {"model": "m", "prompt": toks(2048),
                                                         "max_tokens": 2}))]
        ts[0].start()
        check("queue: the long prefill is placed", eventually(
            lambda: (r.metric("kvr_requests_in_flight") or 0) == 1, 5))
        ts.append(threading.Thread(target=go, args=("b", r, small())))
        ts[-1].start()
        check("queue: a request waits", eventually(lambda: r.metric("kvr_queue_pending") == 1, 5))
        x = raw_request(r, "/v1/completions", small())
        check("queue: a second one waits", eventually(lambda: r.metric("kvr_queue_pending") == 2, 5))
        x.close()
        check("queue: a waiting client that leaves is taken out",
              eventually(lambda: r.metric("kvr_queue_pending") == 1, 5)
              and r.metric("kvr_queue_cancelled_total") == 1, r.metric("kvr_queue_pending"))
        ts.append(threading.Thread(target=go, args=("c", r, small())))
        ts[-1].start()
        check("queue: two wait again", eventually(lambda: r.metric("kvr_queue_pending") == 2, 5))
        st, b, h = r.call_h("POST", "/v1/completions", small())
        check("queue full: 429 in the OpenAI shape", st == 429 and is_openai_error(b, 429), (st, b))
        for t in ts:
            t.join(60)
        check("queue: the long request answered", out.get("a", (0,))[0] == 200, out.get("a"))
        check("queue: the waiting requests answered after the first token",
              out.get("b", (0,))[0] == 200 and out.get("c", (0,))[0] == 200, (out.get("b"), out.get("c")))
        check("queue: the load drains", eventually(lambda: loads_idle(r), 5))
        # a queue timeout answers 429 too
        r2 = router([busy], "--router-queue-threshold", "0.001", "--router-queue-timeout-ms", "300",
                    what="router(queue timeout)")
        ts = [threading.Thread(target=go, args=("a2", r2, {"model": "m", "prompt": toks(2048),
                                                           "max_tokens": 2}))]
        ts[0].start()
        eventually(lambda: (r2.metric("kvr_requests_in_flight") or 0) == 1, 5)
        st, b, h = r2.call_h("POST", "/v1/completions", small())
        check("queued past router_queue_timeout_ms: 429", st == 429 and is_openai_error(b, 429)
              and "queued longer" in b["error"]["message"], (st, b))
        ts[0].join(60)
        check("queue timeout: the long request answered", out.get("a2", (0,))[0] == 200, out.get("a2"))
    finally:
        if r2 is not None:
            r2.stop()
        r.stop()
        m.stop()


def scenario_queue_first_token():
    """A request queued behind a stream goes as soon as the stream's first token arrives (its
    prefill load is gone), as the JSON API's first_token call does, not at the next tick."""
    m = mocker("--speedup", 0.02, events=False, what="mocker(slow)")
    r = router([f"id=1,url={m.url},max_num_batched_tokens=1000000"],
               "--router-queue-threshold", "0.001", "--router-queue-timeout-ms", "30000",
               what="router(queue, stream)")
    out = {}
    try:
        a = raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(2048), "max_tokens": 3,
                                               "stream": True})
        check("queue/stream: the long prefill is placed",
              eventually(lambda: (r.metric("kvr_requests_in_flight") or 0) == 1, 10))
        t = threading.Thread(target=lambda: out.update(b=r.call_h(
            "POST", "/v1/completions", {"model": "m", "prompt": toks(20), "max_tokens": 1},
            timeout=60)))
        t.start()
        check("queue/stream: a request waits behind it",
              eventually(lambda: r.metric("kvr_queue_pending") == 1, 10))
        got = read_to_end(a, b"", 60)
        t.join(60)
        check("queue/stream: both answered", b"data: [DONE]" in got
              and out.get("b", (0,))[0] == 200, (got[-200:], out.get("b")))
        ev = r.metric("kvr_queue_dispatched_total", trigger="event")
        tick = r.metric("kvr_queue_dispatched_total", trigger="tick")
        check("queue/stream: let go by the first token, not by the tick", ev == 1 and tick == 0,
              (ev, tick))
        a.close()
    finally:
        r.stop()
        m.stop()


def read_to_end(s, got=b"", limit_s=30):
    """Reads a chunked answer until its last chunk (or EOF), within limit_s."""
    s.settimeout(limit_s)
    while not got.endswith(b"0\r\n\r\n"):
        c = s.recv(65536)
        if not c:
            break
        got += c
    return got




def refused(r):
    try:
        socket.create_connection((r.host, r.port), timeout=2).close()
        return False
    except OSError:
        return True


def scenario_shutdown():
    """SIGTERM drains: no new connections, the streams in flight go on; a second signal (here
    SIGINT) ends them at once with an error event, and a waiting request gets 503."""
    m = mocker("--speedup", 10, events=False, what="mocker(shutdown)")
    r = router([f"id=1,url={m.url}"], what="router(shutdown)")
    try:
        s1 = raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(30), "max_tokens": 20000,
                                                "stream": True})
        s2 = raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(30), "max_tokens": 20000})
        s1.settimeout(10)
        got = read_events(s1, 2)
        check("shutdown: both requests in flight",
              eventually(lambda: r.metric("kvr_frontend_in_flight") == 2, 5))
        r.proc.send_signal(signal.SIGTERM)
        check("shutdown: SIGTERM closes the listener", eventually(lambda: refused(r), 10))
        n = got.count(b"data: ")
        got = read_events(s1, n + 3, got)
        check("shutdown: the stream goes on while draining", got.count(b"data: ") >= n + 3
              and b'"error"' not in got, got[-300:])
        r.proc.send_signal(signal.SIGINT)
        got = read_to_end(s1, got, 10)
        check("shutdown: the second signal ends the stream with an error event and [DONE]",
              b'"error"' in got and b"data: [DONE]" in got and got.endswith(b"0\r\n\r\n"), got[-300:])
        s2.settimeout(10)
        whole = b""
        while True:
            c = s2.recv(65536)
            if not c:
                break
            whole += c
        check("shutdown: the waiting request gets 503", whole.startswith(b"HTTP/1.1 503"), whole[:200])
        check("shutdown: the mocker's blocks are freed", eventually(lambda: blocks_active([m]) == 0, 5))
        s1.close()
        s2.close()
    finally:
        r.stop()
        m.stop()


def scenario_shutdown_grace():
    """SIGTERM with 10 streams in flight lets them finish; past shutdown_grace_ms the rest
    are ended with an error event."""
    m = mocker("--speedup", 10, events=False, what="mocker(grace)")
    r = router([f"id=1,url={m.url}"], what="router(grace)")
    socks = []
    try:
        for _ in range(10):
            socks.append(raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(30),
                                                            "max_tokens": 40, "stream": True}))
        check("grace: 10 streams in flight",
              eventually(lambda: r.metric("kvr_frontend_in_flight") == 10, 10))
        r.proc.send_signal(signal.SIGTERM)
        outs = [read_to_end(s) for s in socks]
        done = [o for o in outs if b"data: [DONE]" in o and b'"error"' not in o
                and b'"finish_reason":"length"' in o]
        check("grace: all 10 streams finish normally after SIGTERM", len(done) == 10,
              [o[-200:] for o in outs if o not in done][:2])
        try:
            rc = r.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        check("grace: the router exits 0 once they are done", rc == 0, rc)
    finally:
        for s in socks:
            s.close()
        r.stop()
    r = router([f"id=1,url={m.url}"], "--shutdown-grace-ms", 300, what="router(grace 300)")
    try:
        s1 = raw_request(r, "/v1/completions", {"model": "m", "prompt": toks(30), "max_tokens": 20000,
                                                "stream": True})
        s1.settimeout(10)
        got = read_events(s1, 2)
        r.proc.send_signal(signal.SIGTERM)
        got = read_to_end(s1, got, 10)
        check("grace: past shutdown_grace_ms the stream ends with an error event and [DONE]",
              b'"error"' in got and b"data: [DONE]" in got and got.endswith(b"0\r\n\r\n"), got[-300:])
        s1.close()
    finally:
        r.stop()
        m.stop()


def scenario_config():
    for args, env, field in ((["--frontend-max-retries", "17"], {}, "--frontend-max-retries"),
                             ([], {"KVR_FRONTEND_FENCE_FAILURES": "0"}, "frontend_fence_failures"),
                             (["--frontend-upstream-timeout-ms", "5"], {},
                              "--frontend-upstream-timeout-ms"),
                             (["--frontend-max-client-buffer-bytes", "0"], {},
                              "--frontend-max-client-buffer-bytes"),
                             (["--router-mode", "fastest"], {}, "--router-mode")):
        p = subprocess.run([KVR, "serve", "--http-port", "0"] + args, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=20, env=dict(os.environ, **env))
        check(f"bad config {args or env} names {field}", p.returncode == 2 and field in p.stderr,
              (p.returncode, p.stderr))


# ------------------------------------------------------------------------------------------
# A streaming client that never reads: aborted once its unread bytes pass the cap

def scenario_slow_client():
    cap = 65536
    m = mocker("--speedup", 1000, what="mocker(fast)")
    r = router([spec(1, m)], "--frontend-max-client-buffer-bytes", cap, what="router(slow client)")
    s = None
    try:
        aborts0 = r.metric("kvr_frontend_slow_client_aborts_total")
        check("slow client: the cap is exported",
              r.metric("kvr_frontend_max_client_buffer_bytes") == cap)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a tiny window
        s.settimeout(10)
        s.connect((r.host, r.port))
        data = json.dumps({"model": "m", "prompt": toks(64), "max_tokens": 100000,
                           "stream": True}).encode()
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        aborted = eventually(lambda: r.metric("kvr_frontend_slow_client_aborts_total") == aborts0 + 1,
                             30, 0.1)
        check("slow client: aborted and counted", aborted,
              (r.metric("kvr_frontend_slow_client_aborts_total"),
               r.metric("kvr_frontend_client_buffer_bytes"), r.metric("kvr_frontend_in_flight")))
        check("slow client: the router's load is freed", eventually(lambda: loads_idle(r), 5),
              (r.metric("kvr_requests_in_flight"), r.metric("kvr_frontend_in_flight")))
        check("slow client: the mocker's request is cancelled",
              eventually(lambda: blocks_active([m]) == 0
                         and (m.metric("vllm:num_requests_running") or 0) == 0, 5),
              (blocks_active([m]), m.metric("vllm:num_requests_running")))
        check("slow client: aborted before the generation ended",
              (m.metric("vllm:request_success_total") or 0) == 0,
              m.metric("vllm:request_success_total"))
        check("slow client: not counted as a disconnect",
              r.metric("kvr_frontend_client_disconnects_total") == 0)
        check("slow client: nothing left buffered", r.metric("kvr_frontend_client_buffer_bytes") == 0)
        # the client's connection was closed: draining it ends (no [DONE])
        got, closed = b"", False
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                c = s.recv(1 << 20)
            except (ConnectionResetError, socket.timeout):
                closed = True
                break
            if not c:
                closed = True
                break
            got += c
        check("slow client: its connection is closed", closed and b"data: [DONE]" not in got,
              (closed, len(got)))
        st, b, _ = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": toks(32),
                                                       "max_tokens": 4})
        check("slow client: the router still serves", st == 200, (st, b))
    finally:
        if s is not None:
            s.close()
        r.stop()
        m.stop()


# ------------------------------------------------------------------------------------------
# Upstreams that misbehave: silent, closing before answering, breaking mid-answer

class FakeWorker:
    """A TCP server playing a broken engine: reads a request, then does `mode`."""

    def __init__(self, mode):
        self.mode = mode
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.conns = []
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        self.sock.settimeout(0.1)
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self.handle, args=(c,), daemon=True).start()

    def handle(self, c):
        c.settimeout(5)
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d:
                    return
                buf += d
            head, body = buf.split(b"\r\n\r\n", 1)
            m = re.search(rb"(?i)content-length:\s*(\d+)", head)
            need = int(m.group(1)) if m else 0
            while len(body) < need:
                d = c.recv(65536)
                if not d:
                    return
                body += d
            if self.mode == "silent" or head.startswith(b"GET /health"):
                self.conns.append(c)  # never answers (the probe neither)
                return
            if self.mode in ("bad_tokenize", "tokenize_500"):
                ans = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\n{}"
                       if self.mode == "tokenize_500" else
                       b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 17\r\n\r\n{\"tokens\":\"nope\"}")
                c.sendall(ans)
            if self.mode == "breaker":
                ev = json.dumps({"id": "x", "object": "text_completion", "created": 1, "model": "m",
                                 "choices": [{"index": 0, "text": "hi", "logprobs": None,
                                              "finish_reason": None}]})
                chunk = ("data: " + ev + "\n\n").encode()
                if b'"stream": true' in body or b'"stream":true' in body:
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n"
                              + b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                else:
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              b"Content-Length: 1000\r\n\r\n{\"id\":")
                time.sleep(0.05)
        except OSError:
            pass
        c.close()  # "slammer": closes without a byte; "breaker": mid-answer

    def close(self):
        self.stop = True
        self.sock.close()
        for c in self.conns:
            c.close()


def scenario_faults():
    m = mocker("--speedup", 10, events=False, what="mocker(faults)")
    silent, slammer, breaker = FakeWorker("silent"), FakeWorker("slammer"), FakeWorker("breaker")
    r = router([f"id=1,url={silent.url}", f"id=2,url={slammer.url}", f"id=3,url={m.url}",
                f"id=4,url={breaker.url}"], "--frontend-upstream-timeout-ms", "400",
               "--health-interval-ms", "60000", "--frontend-fence-failures", "3",
               what="router(faults)")
    body = {"model": "m", "prompt": toks(20), "max_tokens": 2}
    try:
        t0 = time.monotonic()
        st, b, h = r.call_h("POST", "/v1/completions", body, {"x-worker-instance-id": "1"})
        took = time.monotonic() - t0
        check("silent worker: 504 after the upstream timeout", st == 504 and is_openai_error(b, 504)
              and 0.3 < took < 5, (st, b, took))
        check("silent worker: a timeout counted",
              r.metric("kvr_frontend_upstream_errors_total", kind="timeout") == 1)
        st, b, h = r.call_h("POST", "/v1/completions", body, {"x-worker-instance-id": "2"})
        check("pinned to a worker that closes at once: 503", st == 503 and is_openai_error(b, 503), (st, b))
        check("a close before the first byte counted",
              r.metric("kvr_frontend_upstream_errors_total", kind="eof") == 1)
        ok = 0
        for _ in range(4):
            st, b, h = r.call_h("POST", "/v1/completions", dict(body, nvext={"allowed_worker_ids": [2, 3]}))
            ok += st == 200 and worker_of(h) == 3
        check("a worker that closes at once: requests retried on the live one", ok == 4, ok)
        st, h, chunks, problems = stream(r, "/v1/completions", body, {"x-worker-instance-id": "4"})
        errs = [c for c in chunks if "error" in c]
        check("broken mid-stream: the event, then an error event and [DONE]", st == 200
              and chunks and chunks[0].get("choices") and errs and errs[0]["error"]["code"] == 502
              and not [p for p in problems if "DONE" in p], (st, chunks, problems))
        st, b, h = r.call_h("POST", "/v1/completions", body, {"x-worker-instance-id": "4"})
        check("broken mid-answer (whole): 502", st == 502 and is_openai_error(b, 502), (st, b))
        # a body the worker must receive without the escaped prompt key
        raw = '{"model":"m","pr\\u006fmpt":"hello there friend","max_tokens":2}'
        st, b, h = r.call_h("POST", "/v1/completions", raw, {"x-worker-instance-id": "3"})
        st2, tk, _ = m.call_h("POST", "/tokenize", {"model": "m", "prompt": "hello there friend"})
        check("an escaped key is replaced, not duplicated", st == 200
              and b["usage"]["prompt_tokens"] == tk["count"], (st, b))
        check("the load is 0 after the faults", eventually(lambda: loads_idle(r), 5))
    finally:
        r.stop()
        m.stop()
        for f in (silent, slammer, breaker):
            f.close()


def scenario_bad_tokenizer():
    """A worker whose /tokenize answers garbage or 500 is a failing worker (counted), and the
    prompt is tokenized by another one: the client never sees its fault."""
    m = mocker("--speedup", 10, events=False, what="mocker(tokenizer)")
    bad, err = FakeWorker("bad_tokenize"), FakeWorker("tokenize_500")
    r = router([f"id=1,url={bad.url}", f"id=2,url={err.url}", f"id=3,url={m.url}"],
               "--health-interval-ms", "60000", "--frontend-tokenize-cache-tokens", "0",
               "--frontend-fence-failures", "100", what="router(bad tokenizer)")
    try:
        codes = []
        for i in range(3):  # round-robin over the tokenizers: each one first once
            st, b, h = r.call_h("POST", "/v1/completions", {
                "model": "m", "prompt": f"words to tokenize {i}", "max_tokens": 1,
                "nvext": {"backend_instance_id": 3}})
            codes.append((st, b if st != 200 else None))
        check("bad tokenizer: every text request served", all(c[0] == 200 for c in codes), codes)
        check("bad tokenizer: the broken answers counted as protocol errors",
              (r.metric("kvr_frontend_upstream_errors_total", kind="protocol") or 0) >= 2,
              r.metric("kvr_frontend_upstream_errors_total", kind="protocol"))
    finally:
        r.stop()
        m.stop()
        bad.close()
        err.close()


# ------------------------------------------------------------------------------------------
# Workers without a url: the routing API may book them, the front end never sends them
# anything (every attempt excludes them), whether registered at start or later

def scenario_urlless():
    m = mocker("--speedup", 10, events=False, what="mocker(url)")
    r = router([f"id=1,url={m.url}", "id=2"], "--router-mode", "round-robin",
               "--health-interval-ms", "60000", what="router(url-less)")
    try:
        check("url-less: the front end counts it",
              r.metric("kvr_frontend_workers_without_url") == 1,
              r.metric("kvr_frontend_workers_without_url"))
        st, b, h = r.call_h("POST", "/v1/workers", {"worker_id": 3, "dp_size": 1})
        check("url-less: one more registered through the API", st in (200, 201), (st, b))
        check("url-less: counted at once", r.metric("kvr_frontend_workers_without_url") == 2,
              r.metric("kvr_frontend_workers_without_url"))
        got = []
        for i in range(9):  # round robin over 3 workers: 2 of every 3 would be url-less
            st, b, h = r.call_h("POST", "/v1/completions",
                                {"model": "m", "prompt": toks(20), "max_tokens": 1})
            got.append((st, worker_of(h)))
        check("url-less: every request served by the worker with a url",
              all(g == (200, 1) for g in got), got)
        check("url-less: nothing retried (never sent there)",
              (r.metric("kvr_frontend_retries_total") or 0) == 0)
        st, b = r.call("POST", "/v1/route", {"tokens": toks(20)})
        check("url-less: the routing API still books them", st == 200, (st, b))
        st, b = r.call("DELETE", "/v1/workers/2")
        check("url-less: removed", st == 200 and r.metric("kvr_frontend_workers_without_url") == 1,
              (st, b, r.metric("kvr_frontend_workers_without_url")))
    finally:
        r.stop()
        m.stop()


# ------------------------------------------------------------------------------------------
# Direct mode: a gateway picks the workers; a request must name its worker, the router books,
# tracks and proxies

def scenario_direct():
    ms = [mocker("--speedup", 10, events=False, what=f"mocker(direct {i})") for i in (1, 2)]
    r = router([f"id=1,url={ms[0].url}", f"id=2,url={ms[1].url}"], "--router-mode", "direct",
               "--health-interval-ms", "60000", what="router(direct)")
    try:
        st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": toks(20),
                                                         "max_tokens": 1})
        check("direct: a request naming no worker is refused, the header named",
              st == 400 and is_openai_error(b, 400) and "x-worker-instance-id" in
              b["error"]["message"], (st, b))
        got = []
        for i in range(6):
            wid = 1 + i % 2
            st, b, h = r.call_h("POST", "/v1/completions",
                                {"model": "m", "prompt": toks(20), "max_tokens": 1},
                                {"x-worker-instance-id": str(wid)})
            got.append((st, wid, worker_of(h)))
        check("direct: each request served by the worker it names",
              all(st == 200 and want == w for st, want, w in got), got)
        st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": toks(20),
                                                         "max_tokens": 1,
                                                         "nvext": {"backend_instance_id": 2}})
        check("direct: nvext.backend_instance_id names it too", st == 200 and worker_of(h) == 2,
              (st, b))
        st, a = r.call("POST", "/v1/route", {"tokens": toks(32)})
        check("direct: /v1/route without pinned_worker is refused",
              st == 400 and "router_mode direct" in a["error"]["message"], (st, a))
        st, a = r.call("POST", "/v1/route", {"tokens": toks(32),
                                             "pinned_worker": {"worker_id": 1, "dp_rank": 0}})
        check("direct: /v1/route with pinned_worker books it", st == 200 and a["worker_id"] == 1,
              (st, a))
        st, w = r.call("GET", "/v1/workers")
        check("direct: shown as the mode and policy in force",
              w.get("router_mode") == "direct" and w.get("policy") == "direct", w)
    finally:
        r.stop()
        for m in ms:
            m.stop()


# ------------------------------------------------------------------------------------------
# Data-parallel ranks: the router picks the rank, the worker gets it as x-data-parallel-rank

def scenario_dp():
    m = mocker("--speedup", 10, dp=2, what="mocker(dp=2)")
    r = router([f"id=1,url={m.url},events={m.events},dp_size=2"], what="router(dp)")
    try:
        check("dp: both ranks have the router's subscription",
              subscribed(m, engine=0) and subscribed(m, engine=1))
        p = toks(8 * BS + 3)
        st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 2})
        rank = int(h.get("x-kvrouter-dp-rank", -1))
        check("dp: served on a rank", st == 200 and rank in (0, 1), (st, b, dict(h)))
        check("dp: the mocker ran it on that rank",
              m.metric("vllm:request_success_total", engine=rank) == 1, rank)
        seen = eventually(lambda: {(s["dp_rank"]): s["device_blocks"] for s in
                                   r.call("POST", "/v1/query", {"tokens": p})[1]["scores"]}
                          .get(rank) == 8, 10)
        check("dp: the router sees the blocks on that rank", seen)
        st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 2})
        check("dp: the repeat goes to the same rank, cached",
              st == 200 and int(h.get("x-kvrouter-dp-rank", -1)) == rank
              and b["usage"]["prompt_tokens_details"]["cached_tokens"] == 8 * BS, (st, b, dict(h)))
        other = 1 - rank
        st, b, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 2,
                                                       "nvext": {"extra_fields": ["worker_id"]}},
                          {"x-worker-instance-id": "1", "x-dp-rank": str(other)})
        check("dp: pinned to the other rank", st == 200 and int(h.get("x-kvrouter-dp-rank", -1)) == other
              and b["nvext"]["worker_id"]["decode_dp_rank"] == other
              and m.metric("vllm:request_success_total", engine=other) == 1, (st, b))
    finally:
        r.stop()
        m.stop()


def scenario_step_clock():
    """The router times each worker's engine steps from whose streamed tokens arrive (the
    locality cost prices the time a busy worker's running step has left): after concurrent
    streams, /v1/workers shows a step length near the mocker's modelled decode step (about
    6 ms in real time), not the sub-millisecond spacing between the streams' tokens. Then
    prompts of 256 to 4,096 tokens one at a time: the router fits a step's length to the prompt
    tokens it computes, and shows the slope near the mocker's (its reference polynomial: about
    15-17 ms per 1,000 tokens over that range)."""
    m = mocker("--speedup", 1, events=False, what="mocker(steps)")
    r = router([spec(1, m, events=False)], what="router(steps)")

    def rank():
        st, ws, _ = r.call_h("GET", "/v1/workers")
        return ws["workers"][0]["ranks"][0]
    try:
        first = rank()
        check("steps: none timed before any stream",
              first["steps_timed"] == 0 and first["step_ms"] is None, first)
        out = concurrent_streams(r, 8, 40, 40)
        check("steps: 8 concurrent streams of 40 tokens complete", out.count(True) == 8, out)
        got, steps = rank(), m.metric("kvr_mocker_steps_total")
        check("steps: the router timed the engine's steps, at most as many as it ran",
              steps is not None and 20 <= got["steps_timed"] <= steps, (got, steps))
        check("steps: their length is the engine's (3-40 ms), not the tokens' spacing",
              got["step_ms"] is not None and 3 <= got["step_ms"] <= 40, got)
        check("steps: decode steps timed apart (3-40 ms)",
              got["decode_step_ms"] is not None and 3 <= got["decode_step_ms"] <= 40, got)
        for n in (256, 1024, 2048, 4096):
            st, _, chunks, problems = stream(r, "/v1/completions",
                                             {"model": "m", "prompt": toks(n), "max_tokens": 4})
            check(f"steps: a {n}-token prompt streams alone", st == 200 and not problems,
                  (st, problems))
            eventually(lambda: loads_idle(r), 5)
        got = rank()
        check("steps: the prefill steps' length per 1,000 prompt tokens is the engine's (10-30 ms)",
              got["prefill_steps_timed"] >= 4 and got["prefill_ms_per_1k_tokens"] is not None
              and 10 <= got["prefill_ms_per_1k_tokens"] <= 30, got)
    finally:
        r.stop()
        m.stop()


def scenario_chat_token_data():
    """What a chat carries to its worker. By default (Dynamo's backends) the router adds the ids
    it routed on as nvext.token_data, and a mocker reading them runs those ids; with
    --frontend-chat-token-data false (vLLM and SGLang ignore the member) nothing is added and
    the engine tokenizes the chat itself; a mocker with --token-data ignore (as vLLM) tokenizes
    the chat whatever it carries."""
    td = toks(33)
    chat = {"model": "m", "messages": [{"role": "user", "content": "the text of the chat"}],
            "max_tokens": 2, "nvext": {"token_data": td}}
    m = mocker(what="mocker (reads token_data)")
    mi = mocker("--token-data", "ignore", what="mocker (--token-data ignore)")
    on = router([spec(1, m)], what="router (token data on)")
    off = router([spec(1, m)], "--frontend-chat-token-data", "false", what="router (off)")
    try:
        st, body = on.call("POST", "/v1/chat/completions", chat)
        check("token data on: the worker runs the ids the router routed on",
              st == 200 and body["usage"]["prompt_tokens"] == 33, (st, body))
        st, body = off.call("POST", "/v1/chat/completions", chat)
        check("token data off: the worker tokenizes the chat itself (the ids are not sent)",
              st == 200 and body["usage"]["prompt_tokens"] not in (0, 33), (st, body))
        st, body = off.call("POST", "/v1/chat/completions",
                            {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 2})
        check("token data off: a plain chat is answered", st == 200, (st, body))
        st, body = mi.call("POST", "/v1/chat/completions", chat)
        check("mocker --token-data ignore: tokenizes the chat, as vLLM",
              st == 200 and body["usage"]["prompt_tokens"] not in (0, 33), (st, body))
        p = subprocess.run([KVR, "mocker", "--token-data", "sometimes"], capture_output=True,
                           text=True, timeout=20, stdin=subprocess.DEVNULL)
        check("mocker --token-data sometimes: refused, naming the flag",
              p.returncode == 2 and "--token-data" in p.stderr, (p.returncode, p.stderr))
    finally:
        for c in (on, off, m, mi):
            c.stop()


def main():
    run_scenarios((("bad_tokenizer", scenario_bad_tokenizer), ("chat_token_data", scenario_chat_token_data), ("main", scenario_main), ("step_clock", scenario_step_clock), ("queue", scenario_queue),
                   ("queue_first_token", scenario_queue_first_token),
                   ("faults", scenario_faults), ("dp", scenario_dp), ("urlless", scenario_urlless), ("direct", scenario_direct),
                   ("shutdown", scenario_shutdown),
                   ("shutdown_grace", scenario_shutdown_grace), ("config", scenario_config),
                   ("slow_client", scenario_slow_client)), SEED)


if __name__ == "__main__":
    main()
