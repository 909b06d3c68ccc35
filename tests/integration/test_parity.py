#!/usr/bin/python3
"""Where `kvrouter serve` behaves as the reference KV router does, and used not to: settings that
derive others (use_kv_events false = approximate mode; overlap credit 0 = no index and no
KV-event subscription; the deprecated overlap_score_weight), per-request load overrides,
/v1/dump in approximate mode, the engine priority forwarded apart from the queue's head start. Each scenario failed on the router before the change it covers.
Usage: test_parity.py <path to kvrouter>.
"""
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading

import zmq

from kvr_events import BS, Engine, batch, engine_hashes, tokens_for, vllm_stored_array
from kvr_harness import Child, check, eventually, finish, kill_children

KVR = sys.argv[1]


def serve(*extra):
    return Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--log-level", "info",
                  "--seed", "7"] + [str(a) for a in extra], "router")


def rank0(r, worker_id=1):
    """/v1/workers' entry for rank 0 of a worker (its index state and booked load)."""
    _, w = r.call("GET", "/v1/workers")
    return next(wk["ranks"][0] for wk in w["workers"] if wk["worker_id"] == worker_id)


def device_blocks(r, tokens):
    _, q = r.call("POST", "/v1/query", {"tokens": tokens})
    return {s["worker_id"]: s["device_blocks"] for s in q["scores"]}


def scenario_use_kv_events_false_is_approximate():
    """--use-kv-events false: the router learns from its own decisions (a routed prompt counts
    as cached on its worker), as the reference's approximate mode; before, kv mode just stopped
    ingesting and every overlap was 0."""
    r = serve("--use-kv-events", "false", "--worker", "id=1", "--worker", "id=2")
    try:
        toks = tokens_for(11, 8)
        st, a = r.call("POST", "/v1/route", {"tokens": toks, "request_id": "a"})
        check("approx: route", st == 200, (st, a))
        held = device_blocks(r, toks)
        check("approx: the routed prompt counts as cached on its worker",
              held.get(a["worker_id"]) == 8, held)
        st, w = r.call("GET", "/v1/workers")
        states = {rk["index_state"] for wk in w["workers"] for rk in wk["ranks"]}
        check("approx: /v1/workers says approximate", states == {"approximate"}, states)
        st, d = r.call("GET", "/v1/dump")
        check("approx: /v1/dump answers with the learnt blocks",
              st == 200 and sum(len(e.get("stored", {}).get("blocks", [])) for e in d["events"]) == 8
              and all(e["worker_id"] == a["worker_id"] for e in d["events"]), (st, d))
        check("approx: the start-up log says why", "approximate mode" in r.stderr(), r.stderr())
    finally:
        r.stop()


def scenario_credit_zero_runs_no_index(ctx):
    """overlap credit 0 (or the deprecated --overlap-score-weight 0): no index and no KV-event
    subscription, so a prompt the engine reports cached still books its whole prefill; the
    control router with the default credit subscribes and sees the cache."""
    eng = Engine(ctx)
    try:
        spec = f"id=1,events={eng.endpoint()},replay={eng.replay_endpoint()}"
        ctl = serve("--worker", spec)
        try:
            check("credit 1: subscribes", eng.wait_subscribed(1), eng.subscriptions)
            toks = tokens_for(21, 4)
            hs = engine_hashes(21, 4)
            eng.send(batch([vllm_stored_array(hs, None, toks)]))
            check("credit 1: indexes the engine's blocks",
                  eventually(lambda: device_blocks(ctl, toks).get(1) == 4), device_blocks(ctl, toks))
        finally:
            ctl.stop()
        for flag in (["--overlap-score-credit", "0"], ["--overlap-score-weight", "0"]):
            r = serve("--worker", spec, *flag)
            try:
                st, a = r.call("POST", "/v1/route", {"tokens": toks, "request_id": "x"})
                rk = rank0(r)
                check(f"{flag}: the whole prompt is booked as prefill (no overlap)",
                      st == 200 and rk["active_prefill_tokens"] == len(toks), (a, rk))
                check(f"{flag}: /v1/workers says not_indexed", rk["index_state"] == "not_indexed",
                      rk)
                st, d = r.call("GET", "/v1/dump")
                check(f"{flag}: /v1/dump says why there is none",
                      st == 404 and "overlap_score_credit" in d["error"]["message"], (st, d))
                check(f"{flag}: the start-up log says so", "no KV-event subscription" in r.stderr(),
                      r.stderr())
            finally:
                r.stop()
    finally:
        eng.close()


def scenario_no_events_no_credit_is_no_index():
    """--use-kv-events false with credit 0 (or the deprecated weight 0, or the reference's
    --no-router-kv-events --router-kv-overlap-score-weight 0: its load-aware preset) keeps no
    index at all, as the reference's Indexer::None wins over approximate mode: the same prompt
    routed twice is booked whole both times and nothing is predicted cached. Before, it was
    approximate mode, crediting the first request's blocks to the second."""
    toks = tokens_for(31, 6)
    for flags in (["--use-kv-events", "false", "--overlap-score-credit", "0"],
                  ["--use-kv-events", "false", "--overlap-score-weight", "0"],
                  ["--no-router-kv-events", "--router-kv-overlap-score-weight", "0"]):
        r = serve("--worker", "id=1", *flags)
        try:
            for rid in ("a", "b"):
                st, a = r.call("POST", "/v1/route", {"tokens": toks, "request_id": rid})
                check(f"{flags}: route {rid} sees no cached block",
                      st == 200 and a.get("overlap_blocks", 0) == 0, a)
            rk = rank0(r)
            check(f"{flags}: both prompts booked whole as prefill",
                  rk["active_prefill_tokens"] == 2 * len(toks), rk)
            check(f"{flags}: nothing predicted cached", device_blocks(r, toks).get(1, 0) == 0,
                  device_blocks(r, toks))
            st, w = r.call("GET", "/v1/workers")
            check(f"{flags}: kv mode without an index, shown",
                  w.get("router_mode") == "kv" and rk["index_state"] == "not_indexed", (w, rk))
            check(f"{flags}: the start-up log says why",
                  "no index at all, not approximate mode" in r.stderr(), r.stderr()[-2000:])
        finally:
            r.stop()


def scenario_strict_priority_on_route():
    """POST /v1/route takes strict_priority as POST /router does: a queued request with it
    leaves the queue before one that waited longer without it; mm_routing_info's
    routing_token_ids is refused naming what to send instead. Before, /v1/route ignored both."""
    r = serve("--worker", "id=1,max_num_batched_tokens=1000", "--router-queue-threshold",
              "0.001", "--router-queue-timeout-ms", "20000")
    out, order = {}, []

    def go(rid, extra):
        st, a = r.call("POST", "/v1/route", dict({"tokens": tokens_for(50 + len(rid), 4),
                                                  "request_id": rid}, **extra), timeout=60)
        out[rid] = (st, a)
        order.append(rid)
    try:
        st, a = r.call("POST", "/v1/route", {"tokens": tokens_for(49, 8), "request_id": "head"})
        check("strict priority: the first request is placed", st == 200, (st, a))
        t1 = threading.Thread(target=go, args=("plain", {}))
        t1.start()
        check("strict priority: a plain request waits",
              eventually(lambda: r.metric("kvr_queue_pending") == 1, 10), r.metric("kvr_queue_pending"))
        t2 = threading.Thread(target=go, args=("urgent", {"strict_priority": 1}))
        t2.start()
        check("strict priority: an urgent one waits behind it",
              eventually(lambda: r.metric("kvr_queue_pending") == 2, 10), r.metric("kvr_queue_pending"))
        r.call("DELETE", "/v1/requests/head")
        check("strict priority: the urgent request leaves the queue first",
              eventually(lambda: "urgent" in out, 10) and "plain" not in out, (out, order))
        r.call("DELETE", "/v1/requests/urgent")
        t1.join(30)
        t2.join(30)
        check("strict priority: then the plain one", order == ["urgent", "plain"] and
              all(v[0] == 200 for v in out.values()), (out, order))
        st, e = r.call("POST", "/v1/route", {"tokens": tokens_for(60, 2), "mm_routing_info":
                                             {"routing_token_ids": [1, 2, 3]}})
        check("routing_token_ids: refused naming it and what to send",
              st == 400 and "mm_routing_info.routing_token_ids: not supported" in
              e["error"]["message"], (st, e))
    finally:
        r.stop()


def scenario_busy_threshold():
    """POST /busy_threshold (the reference's): a model's busy thresholds at run time, on the
    admin plane; its workers' ranks are busy past them (a request then waits, or 429 with no
    queue), raising them lets work through; GET and /v1/workers list them. Before: 404."""
    r = serve("--worker", "id=1,model=m", "--worker", "id=2,model=other")
    try:
        st, a = r.call("POST", "/busy_threshold", {"model": "m"})
        check("busy threshold: read back before any change (the settings': unset)",
              st == 200 and a == {"model": "m", "active_prefill_tokens_threshold": None,
                                  "active_decode_blocks_threshold": None}, (st, a))
        st, a = r.call("POST", "/busy_threshold", {"model": "m",
                                                   "active_prefill_tokens_threshold": 10})
        check("busy threshold: set", st == 200 and a["active_prefill_tokens_threshold"] == 10,
              (st, a))
        st, a = r.call("POST", "/v1/route", {"model": "m", "tokens": tokens_for(80, 4)})
        check("busy threshold: the first request is placed", st == 200, (st, a))
        st, a = r.call("POST", "/v1/route", {"model": "m", "tokens": tokens_for(81, 4)})
        check("busy threshold: past it the model's only worker is busy (429)", st == 429, (st, a))
        st, a = r.call("POST", "/v1/route", {"model": "other", "tokens": tokens_for(82, 4)})
        st2, a2 = r.call("POST", "/v1/route", {"model": "other", "tokens": tokens_for(83, 4)})
        check("busy threshold: another model keeps the settings'", st == 200 and st2 == 200,
              (st, a, st2, a2))
        st, a = r.call("POST", "/busy_threshold", {"model": "m",
                                                   "active_prefill_tokens_threshold": 1e6})
        st, a = r.call("POST", "/v1/route", {"model": "m", "tokens": tokens_for(84, 4)})
        check("busy threshold: raised, the worker takes work again", st == 200, (st, a))
        st, g = r.call("GET", "/busy_threshold")
        check("busy threshold: GET lists the model",
              st == 200 and [t["model"] for t in g["thresholds"]] == ["m"], (st, g))
        _, w = r.call("GET", "/v1/workers")
        check("busy threshold: shown in /v1/workers",
              w.get("busy_thresholds", [{}])[0].get("active_prefill_tokens_threshold") == 1e6, w)
        st, e = r.call("POST", "/busy_threshold", {"model": "m",
                                                   "active_decode_blocks_threshold": -1})
        check("busy threshold: a negative value is refused, named",
              st == 400 and "active_decode_blocks_threshold" in e["error"]["message"], (st, e))
        st, e = r.call("POST", "/busy_threshold", {"active_prefill_tokens_threshold": 5})
        check("busy threshold: the model is required", st == 400 and "model" in
              e["error"]["message"], (st, e))
    finally:
        r.stop()


def scenario_decision_logs():
    """The routing decisions you can read (the reference's routing logs): POST /v1/log-level
    debug at run time, then one line per decision with the choice, the prompt's blocks and each
    rank's terms and why; back to info, no more. Before: no such endpoint, no such line."""
    r = serve("--worker", "id=1", "--worker", "id=2")
    try:
        st, a = r.call("GET", "/v1/log-level")
        check("log level: read", st == 200 and a == {"level": "info"}, (st, a))
        st, a = r.call("POST", "/v1/log-level", {"level": "debug"})
        check("log level: set to debug", st == 200 and a == {"level": "debug"}, (st, a))
        st, a = r.call("POST", "/v1/route", {"tokens": tokens_for(90, 4), "request_id": "dl-1"})
        check("log level: routed", st == 200, (st, a))
        check("decision logs: one line naming the choice and every rank's terms",
              eventually(lambda: re.search(r"debug decision dl-1: worker \d+ rank 0, prompt 4 "
                                           r"blocks, overlap 0 blocks .*ranks: 1/0 eligible "
                                           r"overlap 0\.0 prefill [\d.]+ \(step wait [\d.]+, "
                                           r"memory 0\.0\) decode [\d.]+ cost "
                                           r"[\d.]+; 2/0 eligible", r.stderr()) is not None, 5),
              r.stderr()[-1500:])
        st, a = r.call("POST", "/v1/log-level", {"level": "info"})
        r.call("POST", "/v1/route", {"tokens": tokens_for(91, 4), "request_id": "dl-2"})
        check("decision logs: none at info", "decision dl-2" not in r.stderr())
        st, e = r.call("POST", "/v1/log-level", {"level": "loud"})
        check("log level: a bad name is refused", st == 400 and "level" in e["error"]["message"],
              (st, e))
    finally:
        r.stop()


def scenario_overlap_score_weight_alias():
    """--overlap-score-weight W (deprecated) is prefill_load_scale = W, and logged."""
    r = serve("--worker", "id=1", "--overlap-score-weight", "2.5",
              "--router-selection-policy", "dynamo")
    try:
        check("weight: accepted and logged",
              "overlap_score_weight 2.5 (deprecated): prefill_load_scale = 2.5" in r.stderr(),
              r.stderr())
        _, w = r.call("GET", "/v1/workers")
        check("weight: dynamo's cost, shown", w.get("policy") == "dynamo", w)
    finally:
        r.stop()


def scenario_cost_weights_need_dynamo():
    """prefill_load_scale, decode_active_request_weight and a nonzero overlap_score_weight are
    terms of the dynamo cost: under the default policy (locality, which multiplies prefill by
    decode load) they are refused at start and per request, naming the setting and the policy;
    before, they were accepted and changed nothing."""
    for flag, value in (("--prefill-load-scale", "2"), ("--decode-active-request-weight", "0.5"),
                        ("--overlap-score-weight", "2.5"),
                        ("--router-kv-overlap-score-weight", "3")):
        p = subprocess.run([KVR, "serve", "--http-port", "0", "--worker", "id=1", flag, value],
                           capture_output=True, text=True, timeout=30)
        name = flag.replace("router-kv-", "")  # the reference's flag: named as ours
        check(f"{flag} {value} under locality: refused at start naming it and the policy",
              p.returncode == 2 and name in p.stderr and "--router-selection-policy locality"
              in p.stderr, (p.returncode, p.stderr))
    r = serve("--worker", "id=1")
    try:
        st, a = r.call("POST", "/v1/route", {"tokens": tokens_for(41, 2),
                                             "config_override": {"prefill_load_scale": 2}})
        check("per-request prefill_load_scale under locality: 400 naming it",
              st == 400 and "config_override.prefill_load_scale" in a["error"]["message"]
              and "locality" in a["error"]["message"], (st, a))
        st, a = r.call("POST", "/v1/route", {"tokens": tokens_for(41, 2),
                                             "config_override": {"prefill_load_scale": 1}})
        check("per-request prefill_load_scale 1 (no change): routed", st == 200, (st, a))
    finally:
        r.stop()


def scenario_load_overrides():
    """config_override.assume_kv_reuse / track_prefill_tokens false (the reference's decode-pool
    overrides) reach the booking: the same prompt twice holds its blocks twice, no prefill."""
    r = serve("--worker", "id=1")
    try:
        toks = tokens_for(31, 4)
        ovr = {"assume_kv_reuse": False, "track_prefill_tokens": False}
        for rid in ("d1", "d2"):
            st, a = r.call("POST", "/v1/route", {"tokens": toks, "request_id": rid,
                                                 "config_override": ovr})
            check(f"overrides: route {rid}", st == 200, (st, a))
        rk = rank0(r)
        check("overrides: no prefill tokens booked", rk["active_prefill_tokens"] == 0, rk)
        check("overrides: blocks held twice (no dedup)", rk["active_blocks"] == 8, rk)
    finally:
        r.stop()


class CaptureWorker:
    """An engine's OpenAI server as far as the front end needs one: /health, and completions
    answered at once; it keeps every request body it was sent."""

    def __init__(self, models=()):
        bodies = self.bodies = []
        listing = json.dumps({"object": "list", "data": [
            {"id": mid, "object": "model", "created": 1, "owned_by": "vllm", "root": mid,
             "parent": parent} for mid, parent in models]}).encode()

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self.answer(200, listing if self.path.endswith("/v1/models") else b"{}")

            def do_POST(self):
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.answer(200, json.dumps({
                    "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "text": "ok", "logprobs": None,
                                 "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                              "total_tokens": 2}}).encode())

            def answer(self, code, data):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def scenario_priorities():
    """nvext.priority (or agent_hints.priority) is the engine's priority: forwarded as the body's
    top-level "priority" vLLM and SGLang read, replacing the client's own; priority_jump (or
    agent_hints.latency_sensitivity) is the router queue's head start and is not forwarded.
    Before, nvext.priority was read as the head start and nothing reached the engine."""
    w = CaptureWorker()
    r = serve("--worker", f"id=1,url={w.url}")
    try:
        cases = [({"priority": -5}, -5),
                 ({"agent_hints": {"priority": 9, "latency_sensitivity": 2.0}}, 9),
                 ({"priority_jump": 3.5}, None)]
        for nvext, want in cases:
            body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 1, "priority": 100,
                    "nvext": nvext}
            n = len(w.bodies)
            st, a = r.call("POST", "/v1/completions", body)
            got = w.bodies[n] if len(w.bodies) > n else {}
            check(f"priority {nvext}: answered", st == 200, (st, a))
            check(f"priority {nvext}: the engine sees priority {want if want is not None else 100}",
                  got.get("priority") == (want if want is not None else 100) and "nvext" not in got,
                  got)
        st, e = r.call("POST", "/v1/completions", {"model": "m", "prompt": [1], "nvext":
                                                   {"priority": 1.5}})
        check("priority: a fractional engine priority is refused, named",
              st == 400 and "nvext.priority" in e["error"]["message"], (st, e))
    finally:
        r.stop()
        w.close()


def promtool_problems(text):
    """promtool check metrics' complaints about a /metrics text (promtool from Debian's
    prometheus package, which scripts/install-deps.sh installs)."""
    tool = shutil.which("promtool")
    if tool is None:
        return ["promtool is not installed (scripts/install-deps.sh installs prometheus)"]
    p = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=60)
    return [l for l in (p.stdout + p.stderr).splitlines() if l.strip()]


def scenario_metrics():
    """Per-model request histograms at the router (TTFT, ITL, ISL, OSL, E2E, KV hit rate, in
    seconds and tokens), and /metrics of serve and mocker pass promtool check metrics; the only
    complaint allowed is the colon in the mocker's vllm:* names, which are vLLM's own."""
    m = Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "m",
               "--block-size", BS, "--speedup", "100"], "mocker")
    r = serve("--worker", f"id=1,url={m.url}")
    try:
        toks = tokens_for(41, 2)
        st, raw = r.request("POST", "/v1/completions", {"model": "m", "prompt": toks,
                                                         "max_tokens": 5, "stream": True})[::2]
        check("metrics: streamed answer", st == 200 and b"[DONE]" in raw, raw[-200:])
        st, a = r.call("POST", "/v1/completions", {"model": "m", "prompt": toks, "max_tokens": 7})
        check("metrics: whole answer", st == 200, (st, a))
        lab = {"model": "m"}
        check("metrics: TTFT observed for the streamed request",
              r.metric("kvr_frontend_time_to_first_token_seconds_count", **lab) == 1,
              r.metric("kvr_frontend_time_to_first_token_seconds_count", **lab))
        check("metrics: ITL observed (5 tokens streamed)",
              r.metric("kvr_frontend_inter_token_latency_seconds_count", **lab) == 1)
        check("metrics: OSL = 5 streamed + 7 from usage",
              r.metric("kvr_frontend_output_sequence_tokens_sum", **lab) == 12,
              r.metric("kvr_frontend_output_sequence_tokens_sum", **lab))
        check("metrics: ISL = both prompts",
              r.metric("kvr_frontend_input_sequence_tokens_sum", **lab) == 2 * len(toks))
        check("metrics: E2E and KV hit rate per request",
              r.metric("kvr_frontend_request_duration_seconds_count", **lab) == 2 and
              r.metric("kvr_frontend_kv_hit_rate_count", **lab) == 2)
        for what, c in (("serve", r), ("mocker", m)):
            text = c.request("GET", "/metrics")[2].decode()
            bad = [l for l in promtool_problems(text)
                   if not re.match(r"^vllm:\S+ metric names should not contain ':'$", l)]
            check(f"metrics: promtool check metrics passes on {what}'s /metrics", bad == [],
                  bad[:20])
        check("metrics: no _ms metric names left",
              not any(n.endswith("_ms") or "_ms_" in n for n, _, _ in r.metrics()),
              [n for n, _, _ in r.metrics() if "_ms" in n][:5])
    finally:
        r.stop()
        m.stop()


def scenario_min_initial_workers():
    """Requests that arrive before min_initial_workers are ready wait (bounded) instead of
    failing: one sent to a router with no worker is answered once a worker registers; past
    min_initial_workers_wait_ms the answer is a 503 naming the setting. Before, both were an
    immediate 503."""
    r = serve("--min-initial-workers-wait-ms", "20000")
    try:
        st, _ = r.call("GET", "/ready")
        check("start-up wait: not ready without workers", st == 503, st)
        out = {}
        t = threading.Thread(target=lambda: out.update(
            zip(("st", "body"), r.call("POST", "/v1/route", {"tokens": tokens_for(51, 2)}))))
        t.start()
        check("start-up wait: the request waits (it is queued)",
              eventually(lambda: (r.metric("kvr_queue_pending") or 0) >= 1, 10), r.metric("kvr_queue_pending"))
        st, w = r.call("POST", "/v1/workers", {"worker_id": 4, "dp_size": 1})
        check("start-up wait: a worker registers", st == 201, (st, w))
        t.join(20)
        check("start-up wait: the waiting request is routed to it",
              out.get("st") == 200 and out["body"].get("worker_id") == 4, out)
    finally:
        r.stop()
    r = serve("--min-initial-workers", "2", "--min-initial-workers-wait-ms", "300",
              "--worker", "id=1")
    try:
        st, e = r.call("POST", "/v1/route", {"tokens": tokens_for(52, 2)})
        check("start-up wait: past the wait, a 503 naming min_initial_workers",
              st == 503 and "min_initial_workers (2; 1 ready)" in e["error"]["message"], (st, e))
    finally:
        r.stop()


def scenario_eagle(ctx):
    """Eagle: a worker registered eagle=true has its requests hashed over block_size + 1 token
    windows like its events (EAGLE token pairs), so its cache matches; registered without it,
    the mismatch is counted and named in /v1/workers; a fleet mixing both is refused. Before,
    requests were never hashed as Eagle and such fleets never matched, silently."""
    eng = Engine(ctx)
    try:
        toks = tokens_for(61, 4) + [7]              # 4 Eagle blocks need 4 x 16 + 1 tokens
        pairs = [[toks[i], toks[i + 1]] for i in range(len(toks) - 1)]
        hs = engine_hashes(61, 4)
        spec = f"id=1,events={eng.endpoint()},replay={eng.replay_endpoint()}"
        for eagle in (True, False):
            r = serve("--worker", spec + (",eagle=true" if eagle else ""))
            try:
                check(f"eagle={eagle}: subscribed", eng.wait_subscribed(1 if eagle else 2))
                eng.send(batch([["BlockStored", hs, None, pairs, BS, None, "GPU"]]))
                if eagle:
                    check("eagle: the engine's Eagle blocks match the request",
                          eventually(lambda: device_blocks(r, toks).get(1) == 4),
                          device_blocks(r, toks))
                    st, e = r.call("POST", "/v1/workers", {"worker_id": 2, "dp_size": 1})
                    check("eagle: a worker without Eagle is refused in an Eagle fleet",
                          st == 400 and "eagle=false" in e["error"]["message"], (st, e))
                else:
                    check("no eagle: the mismatch is counted",
                          eventually(lambda: rank0(r)["eagle_mismatches"] >= 1), rank0(r))
                    check("no eagle: and logged, naming the setting",
                          eventually(lambda: "register it with eagle=true" in r.stderr()),
                          r.stderr()[-500:])
            finally:
                r.stop()
    finally:
        eng.close()


def scenario_sessions():
    """Sticky sessions through the front end: requests carrying x-session-id (or
    nvext.session_control) go to the worker of the session's first request; close ends it;
    /metrics counts hits and ends. Before, the header and the field were ignored."""
    ws = [CaptureWorker(), CaptureWorker()]
    r = serve("--worker", f"id=1,url={ws[0].url}", "--worker", f"id=2,url={ws[1].url}",
              "--session-ttl-secs", "300")
    try:
        def send(i, headers=None, nvext=None):
            body = {"model": "m", "prompt": tokens_for(70 + i, 2), "max_tokens": 1}
            if nvext is not None:
                body["nvext"] = nvext
            st, a, h = r.call_h("POST", "/v1/completions", body, headers=headers)
            return st, h.get("x-kvrouter-worker-id")
        got = [send(i, {"x-session-id": "conv-a"}) for i in range(8)]
        check("sessions: x-session-id keeps a session on one worker",
              all(st == 200 for st, _ in got) and len({w for _, w in got}) == 1, got)
        got = [send(20 + i, nvext={"session_control": {"session_id": "conv-b"}}) for i in range(8)]
        check("sessions: nvext.session_control does the same",
              all(st == 200 for st, _ in got) and len({w for _, w in got}) == 1, got)
        st, _ = send(40, nvext={"session_control": {"session_id": "conv-b", "action": "close"}})
        check("sessions: close answered", st == 200)
        check("sessions: hits and ends counted",
              r.metric("kvr_session_requests_total", outcome="hit") == 14 and
              r.metric("kvr_session_requests_total", outcome="new") == 2 and
              r.metric("kvr_sessions_ended_total", cause="closed") == 1 and
              r.metric("kvr_sessions") == 1,
              [(n, l, v) for n, l, v in r.metrics() if "session" in n])
        st, e = r.call("POST", "/v1/completions", {"model": "m", "prompt": [1], "nvext":
                                                   {"session_control": {"action": "close"}}})
        check("sessions: a session_control without its id is refused, named",
              st == 400 and "nvext.session_control.session_id" in e["error"]["message"], (st, e))
    finally:
        r.stop()
        for w in ws:
            w.close()


def mocker_with_events(model, bs):
    """A mocker serving model with bs-token blocks, publishing KV events on a free port."""
    from kvr_harness import with_free_ports

    def start(ev):
        return Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", model,
                      "--block-size", bs, "--speedup", "100", "--kv-events-config",
                      json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                  "endpoint": f"tcp://*:{ev}"})], f"mocker {model}")
    (ev,), m = with_free_ports(start, 1)
    m.events = f"tcp://127.0.0.1:{ev}"
    return m


def scenario_models():
    """One router, two models with different block sizes: each request goes to its model's
    worker; each worker's KV events are read with its own block size (no mismatch) and a
    repeated prompt finds its cache; an unknown model is a 404 in the OpenAI shape. Before,
    model was ignored and a second block size was a mismatch."""
    ma, mb = mocker_with_events("alpha", 16), mocker_with_events("beta", 32)
    r = serve("--worker", f"id=1,url={ma.url},events={ma.events},model=alpha",
              "--worker", f"id=2,url={mb.url},events={mb.events},model=beta,block_size=32")
    try:
        for m in (ma, mb):  # ZeroMQ's slow joiner: events sent before this would be lost
            check(f"models: {m.what} has the router's subscription",
                  eventually(lambda: (m.metric("kvr_mocker_kv_event_subscribers") or 0) >= 1))
        prompt = tokens_for(81, 8)  # 128 tokens: 8 blocks of 16, 4 of 32
        for model, want in (("alpha", "1"), ("beta", "2")):
            for k in range(3):
                st, a, h = r.call_h("POST", "/v1/completions",
                                    {"model": model, "prompt": prompt, "max_tokens": 2})
                check(f"models: {model} request {k} answered by its worker",
                      st == 200 and h.get("x-kvrouter-worker-id") == want,
                      (st, h.get("x-kvrouter-worker-id"), a))
        st, w = r.call("GET", "/v1/workers")
        ranks = {wk["worker_id"]: (wk["model"], wk["block_size"], wk["ranks"][0])
                 for wk in w["workers"]}
        check("models: /v1/workers names each model and block size",
              ranks[1][:2] == ("alpha", 16) and ranks[2][:2] == ("beta", 32), ranks)
        check("models: each engine's events indexed with its block size",
              eventually(lambda: all(x["ranks"][0]["index_blocks"] > 0
                                     for x in r.call("GET", "/v1/workers")[1]["workers"])),
              r.call("GET", "/v1/workers")[1])
        check("models: no block-size mismatch",
              all(x[2]["block_size_mismatches"] == 0 for x in ranks.values()), ranks)
        st, e = r.call("POST", "/v1/completions", {"model": "gamma", "prompt": [1, 2], "max_tokens": 1})
        check("models: an unknown model is a 404 naming it",
              st == 404 and "gamma" in e["error"]["message"], (st, e))
        st, w = r.call("POST", "/v1/workers", {"worker_id": 9, "model": "alpha", "loras": "sql;chat"})
        check("models: a worker registers with adapters", st == 201, (st, w))
        st, ml = r.call("GET", "/v1/models")
        ids = sorted(m["id"] for m in ml.get("data", []))
        check("models: /v1/models lists both models and the registered adapters",
              st == 200 and ids == ["alpha", "beta", "chat", "sql"], (st, ml))
        st, e = r.call("POST", "/v1/workers", {"worker_id": 10, "model": "beta", "block_size": 16})
        check("models: a worker of a model with another block size is refused, named",
              st == 400 and "block_size 32" in e["error"]["message"], (st, e))
        before = r.metric("kvr_routes_with_overlap_total") or 0
        for model in ("alpha", "beta"):  # both engines' blocks are indexed (checked above)
            r.call("POST", "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 1})
        check("models: a repeated prompt finds its cache in each model",
              (r.metric("kvr_routes_with_overlap_total") or 0) == before + 2,
              (before, r.metric("kvr_routes_with_overlap_total")))
    finally:
        r.stop()
        ma.stop()
        mb.stop()


def scenario_multimodal():
    """Two requests with the same (placeholder) tokens and different images must not share
    blocks: the blocks an image covers are hashed with its mm_hash (block_mm_infos on /v1/route
    and /router, as the reference hashes them). Approximate mode learns from the first request;
    the same image then overlaps fully, another image only up to its block. Before, the field
    was ignored and both overlapped fully."""
    r = serve("--router-mode", "approx", "--worker", "id=1", "--worker", "id=2")
    try:
        toks = tokens_for(91, 4)
        def mm(h):  # the image covers blocks 1 and 2
            return [None, {"mm_objects": [{"mm_hash": h, "offsets": [[0, 16]]}]},
                    {"mm_objects": [{"mm_hash": h}]}, None]
        st, a = r.call("POST", "/v1/route", {"tokens": toks, "request_id": "img-a",
                                             "block_mm_infos": mm(1111)})
        check("mm: routed", st == 200, (st, a))
        def overlap(body):
            body = dict(body, tokens=toks, update_state=False,
                        pinned_worker={"worker_id": a["worker_id"], "dp_rank": 0})
            st, x = r.call("POST", "/v1/route", body)
            return x.get("overlap_blocks") if st == 200 else (st, x)
        check("mm: the same image overlaps fully", overlap({"block_mm_infos": mm(1111)}) == 4)
        check("mm: another image shares only the block before it",
              overlap({"block_mm_infos": mm(2222)}) == 1, overlap({"block_mm_infos": mm(2222)}))
        check("mm: mm_routing_info carries the same list",
              overlap({"mm_routing_info": {"block_mm_infos": mm(1111)}}) == 4)
        check("mm: no image info is not the same prompt",
              overlap({}) == 1, overlap({}))
        r.call("DELETE", "/v1/requests/img-a")  # equal loads: the cached prefix decides
        st, t = r.call("POST", "/router", {"method": "new", "tokens": toks,
                                           "block_mm_infos": mm(1111)})
        check("mm: /router new takes block_mm_infos",
              st == 200 and t.get("overlap_blocks") == 4, (st, t))
    finally:
        r.stop()


def scenario_learned_adapters():
    """The adapters an engine lists in its /v1/models (entries with a parent, as vLLM lists
    LoRA modules) are routed to as if registered: a request naming one goes to that engine."""
    ws = [CaptureWorker([("m", None), ("sql-lora", "m")]), CaptureWorker([("m", None)])]
    r = serve("--worker", f"id=1,url={ws[0].url},model=m", "--worker", f"id=2,url={ws[1].url},model=m")
    try:
        st, ml = r.call("GET", "/v1/models")  # a round of /v1/models (also every 30 s)
        check("learned adapters: listed", st == 200 and
              sorted(m["id"] for m in ml["data"]) == ["m", "sql-lora"], (st, ml))
        st, w = r.call("GET", "/v1/workers")
        learned = {x["worker_id"]: x["learned_loras"] for x in w["workers"]}
        check("learned adapters: /v1/workers shows them", learned == {1: "sql-lora", 2: ""},
              learned)
        got = set()
        for i in range(6):
            st, a, h = r.call_h("POST", "/v1/completions", {"model": "sql-lora", "max_tokens": 1,
                                                            "prompt": tokens_for(100 + i, 2)})
            got.add((st, h.get("x-kvrouter-worker-id")))
        check("learned adapters: requests for it go to the engine serving it",
              got == {(200, "1")}, got)
    finally:
        r.stop()
        for w in ws:
            w.close()


def scenario_mocker_adapters():
    """A mocker serving a LoRA adapter (--lora-modules): the router learns it from the mocker's
    /v1/models, sends the adapter's requests there, and finds their cache (the mocker's KV
    events name the adapter, and both sides salt its blocks with it); the adapter's blocks are
    not the base model's."""
    from kvr_harness import with_free_ports

    def start(ev):
        return Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "base",
                      "--block-size", BS, "--speedup", "100", "--enable-lora",
                      "--lora-modules", "sql-lora=/adapters/sql", "--kv-events-config",
                      json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                  "endpoint": f"tcp://*:{ev}"})], "mocker (lora)")
    (ev,), ml = with_free_ports(start, 1)
    plain = mocker_with_events("base", 16)
    r = serve("--worker", f"id=1,url={ml.url},events=tcp://127.0.0.1:{ev},model=base",
              "--worker", f"id=2,url={plain.url},events={plain.events},model=base")
    try:
        for c in (ml, plain):
            check(f"mocker adapters: {c.what} subscribed",
                  eventually(lambda: (c.metric("kvr_mocker_kv_event_subscribers") or 0) >= 1))
        st, models = ml.call("GET", "/v1/models")
        check("mocker adapters: the mocker lists its adapter with the model as parent",
              {(x["id"], x.get("parent")) for x in models["data"]} ==
              {("base", None), ("sql-lora", "base")}, models)
        r.call("GET", "/v1/models")  # the router's round of /v1/models (also every 30 s)
        prompt = tokens_for(111, 6)
        got = set()
        for k in range(2):
            st, a, h = r.call_h("POST", "/v1/completions", {"model": "sql-lora", "max_tokens": 1,
                                                            "prompt": prompt})
            got.add((st, h.get("x-kvrouter-worker-id")))
        check("mocker adapters: the adapter's requests go to the mocker serving it",
              got == {(200, "1")}, got)
        def held(lora):
            body = {"tokens": prompt} if lora is None else {"tokens": prompt, "lora_name": lora}
            _, q = r.call("POST", "/v1/query", body)
            return {s["worker_id"]: s["device_blocks"] for s in q["scores"]}.get(1)
        check("mocker adapters: its events indexed under the adapter",
              eventually(lambda: held("sql-lora") == 6), held("sql-lora"))
        check("mocker adapters: not under the base model", held(None) == 0, held(None))
    finally:
        r.stop()
        ml.stop()
        plain.stop()


def scenario_chat_images():
    """Chat requests with image parts go through the front end (before: a 400), and two chats
    with the same text and other images never share a block in the router's view, while the
    same images do (approximate mode learns from the first)."""
    ms = [Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "vlm",
                 "--speedup", "100"], f"mocker {k}") for k in range(2)]
    r = serve("--router-mode", "approx", "--worker", f"id=1,url={ms[0].url}",
              "--worker", f"id=2,url={ms[1].url}")
    try:
        text = "Describe the picture in detail, please. " * 12

        def chat(image):
            content = [{"type": "text", "text": text}]
            if image is not None:
                content.append({"type": "image_url", "image_url": {"url": image}})
            st, a, h = r.call_h("POST", "/v1/chat/completions", {
                "model": "vlm", "max_tokens": 1,
                "messages": [{"role": "user", "content": content}]})
            return st, h.get("x-kvrouter-worker-id"), a

        def overlaps():
            return r.metric("kvr_routes_with_overlap_total") or 0

        st, w1, a = chat("https://img.example/cat.png")
        check("images: a chat with an image part is answered", st == 200, (st, a))
        before = overlaps()
        st, w2, _ = chat("https://img.example/cat.png")
        check("images: the same image finds its blocks", st == 200 and w2 == w1 and
              overlaps() == before + 1, (w1, w2, before, overlaps()))
        st, _, _ = chat("https://img.example/dog.png")
        check("images: another image shares none", st == 200 and overlaps() == before + 1,
              overlaps())
        st, _, _ = chat(None)
        check("images: no image shares none either", st == 200 and overlaps() == before + 1,
              overlaps())
    finally:
        r.stop()
        for m in ms:
            m.stop()


def scenario_vllm_mm_events(ctx):
    """vLLM's extra_keys are read as the reference reads them: a block whose extra_keys name an
    image (its 64-hex digest) is indexed with that image, so a request naming the same image in
    block_mm_infos finds all of it, and one without the image only the blocks before it.
    Before, extra_keys were skipped and the image blocks matched requests without images."""
    eng = Engine(ctx)
    try:
        r = serve("--worker", f"id=1,events={eng.endpoint()},replay={eng.replay_endpoint()}")
        try:
            check("mm events: subscribed", eng.wait_subscribed(1))
            toks = tokens_for(121, 3)
            digest = "fedcba9876543210" * 4
            ev = vllm_stored_array(engine_hashes(121, 3), None, toks) + [None, [None, [digest], None]]
            eng.send(batch([ev]))
            mm = [None, {"mm_objects": [{"mm_hash": int(digest[:16], 16)}]}, None]

            def overlap(body):
                st, x = r.call("POST", "/v1/route", dict(body, tokens=toks, update_state=False))
                return x.get("overlap_blocks") if st == 200 else (st, x)
            check("mm events: the same image finds all 3 blocks",
                  eventually(lambda: overlap({"block_mm_infos": mm}) == 3),
                  overlap({"block_mm_infos": mm}))
            check("mm events: without the image only the block before it", overlap({}) == 1,
                  overlap({}))
        finally:
            r.stop()
    finally:
        eng.close()


class FakeMetricsEngine:
    """An engine's HTTP face reduced to /health (200) and /metrics (the given text)."""

    def __init__(self, text):
        body = text.encode()

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.server.gets.append(self.path)
                out = body if self.path == "/metrics" else b"ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.gets = []
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def metrics_gets(self):
        return sum(1 for g in self.srv.gets if g == "/metrics")

    def health_gets(self):
        return sum(1 for g in self.srv.gets if g == "/health")

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def scenario_capacity_from_metrics():
    """A worker registered without num_blocks= gets its KV-cache size from its /metrics: vLLM's
    cache_config_info (here the mocker's, which exports it as vLLM does), SGLang's
    max_total_num_tokens in tokens; a worker given one is never asked; a worker whose metrics
    are malformed is asked three times, counted and logged, then left alone."""
    m = Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--block-size", BS,
               "--num-gpu-blocks", "500", "--speedup", "100"], "mocker capacity")
    sgl = FakeMetricsEngine("# TYPE sglang:max_total_num_tokens gauge\n"
                            'sglang:max_total_num_tokens{model_name="m"} 1.6e+04\n')
    bad = FakeMetricsEngine('vllm:cache_config_info{block_size="16",num_gpu_blocks="lots"} 1\n')
    given = FakeMetricsEngine('vllm:cache_config_info{block_size="16",num_gpu_blocks="9"} 1\n')
    r = None
    try:
        r = serve("--use-kv-events", "false", "--health-interval-ms", "100",
                  "--worker", f"id=1,url={m.url}", "--worker", f"id=2,url={sgl.url}",
                  "--worker", f"id=3,url={bad.url}",
                  "--worker", f"id=4,url={given.url},num_blocks=77")

        def caps():
            _, w = r.call("GET", "/v1/workers")
            return {wk["worker_id"]: wk.get("total_kv_blocks") for wk in w["workers"]}
        check("capacity: learnt from vLLM's cache_config_info (the mocker's 500 blocks) and "
              "SGLang's pool (16,000 tokens / 16)",
              eventually(lambda: caps().get(1) == 500 and caps().get(2) == 1000), caps())

        def fetches(result):
            return r.metric("kvr_worker_capacity_fetches_total", result=result)
        check("capacity: the malformed one asked 3 times, counted failed",
              eventually(lambda: fetches("failed") == 3 and bad.metrics_gets() == 3),
              (fetches("failed"), bad.metrics_gets()))
        check("capacity: learnt counted once a worker", fetches("learnt") == 2, fetches("learnt"))
        gets_1, health_1 = bad.metrics_gets(), bad.health_gets()
        check("capacity: health probes go on (five more)",
              eventually(lambda: bad.health_gets() >= health_1 + 5), bad.health_gets())
        check("capacity: then left alone; a worker given num_blocks never asked",
              bad.metrics_gets() == gets_1 and given.metrics_gets() == 0 and caps().get(4) == 77
              and caps().get(3) is None, (bad.metrics_gets(), given.metrics_gets(), caps()))
        check("capacity: the gauge per worker",
              r.metric("kvr_worker_kv_capacity_blocks", worker_id=1) == 500 and
              r.metric("kvr_worker_kv_capacity_blocks", worker_id=3) == 0,
              (r.metric("kvr_worker_kv_capacity_blocks", worker_id=1),
               r.metric("kvr_worker_kv_capacity_blocks", worker_id=3)))
        check("capacity: the failure logged naming the metric and the way out",
              "num_gpu_blocks is not a count" in r.stderr() and "num_blocks=" in r.stderr(),
              r.stderr()[-800:])
    finally:
        if r is not None:
            r.stop()
        m.stop()
        for e in (sgl, bad, given):
            e.close()


def scenario_reference_names():
    """The reference's flag and variable spellings start this router as they would start
    Dynamo's (each read logged once at start); the ones with no effect here are said, a DYN_*
    variable no setting reads is warned about, a refused one stops start-up naming it and why.
    Before, each such flag was 'unknown setting' and every DYN_* was ignored without a word."""
    r = Child([KVR, "serve", "--http-port", "0", "--log-level", "info", "--worker", "id=1",
               "--no-router-kv-events", "--kv-cache-block-size", "32",
               "--router-kv-overlap-score-credit", "0.5", "--router-event-threads", "8",
               "--router-session-affinity-ttl-secs", "60", "--router-selection-policy", "default"],
              "router(reference names)",
              env={"DYN_ROUTER_TEMPERATURE": "0.25", "DYN_NOT_A_SETTING_AT_ALL": "1",
                   "DYN_KV_CACHE_BLOCK_SIZE": "64"})
    try:
        st, w = r.call("GET", "/v1/workers")
        check("reference names: --kv-cache-block-size (the flag wins over DYN_*) is the block size",
              st == 200 and w["block_size"] == 32, w)
        check("reference names: --no-router-kv-events is approximate mode, shown",
              w.get("router_mode") == "approx", w)
        check("reference names: the policy in force is shown (default reads as locality)",
              w.get("policy") == "locality", w)
        err = r.stderr()
        for line in ("reference name --no-router-kv-events read as use_kv_events = false",
                     "reference name --kv-cache-block-size read as block_size",
                     "reference name --router-kv-overlap-score-credit read as overlap_score_credit",
                     "reference name --router-session-affinity-ttl-secs read as session_ttl_secs",
                     "reference name DYN_ROUTER_TEMPERATURE read as router_temperature",
                     "--router-event-threads (the reference's): accepted, no effect here",
                     "router_selection_policy 'default' (the reference's keyword) reads as locality",
                     "policy locality"):
            check(f"reference names: logged: {line}", line in err, err[-3000:])
        check("reference names: an unknown DYN_* variable is a warning naming it",
              re.search(r"warn .*DYN_NOT_A_SETTING_AT_ALL: not read", err) is not None, err[-3000:])
        _, q = r.call("POST", "/v1/route", {"tokens": list(range(1000, 1100))})
        check("reference names: routes", "worker_id" in q, q)
    finally:
        r.stop()
    r = serve("--worker", "id=1", "--router-selection-policy", "dynamo")
    try:
        check("sessions off by default, as the reference's: nothing said",
              "sticky sessions on" not in r.stderr(), r.stderr()[-2000:])
        _, w = r.call("GET", "/v1/workers")
        check("sessions off by default: shown", w.get("session_ttl_secs") == 0, w)
        check("policy dynamo: shown", w.get("policy") == "dynamo" and w.get("router_mode") == "kv",
              w)
        check("policy dynamo: in the start-up line", "mode kv, policy dynamo" in r.stderr())
    finally:
        r.stop()
    r = serve("--worker", "id=1", "--session-ttl-secs", "300")
    try:
        _, w = r.call("GET", "/v1/workers")
        check("sessions on: shown, and said at start",
              w.get("session_ttl_secs") == 300 and
              "sticky sessions on (session_ttl_secs 300)" in r.stderr(), w)
    finally:
        r.stop()
    for how, args, env, want in (
            ("flag", ["--router-durable-kv-events"], None, "--router-durable-kv-events is the "
             "reference router's flag; not supported here: there is no JetStream"),
            ("variable", [], {"DYN_ROUTER_DURABLE_KV_EVENTS": "true"},
             "environment DYN_ROUTER_DURABLE_KV_EVENTS (the reference's): not supported")):
        p = subprocess.run([KVR, "serve", "--http-port", "0", "--worker", "id=1"] + args,
                           capture_output=True, text=True, timeout=30,
                           env=None if env is None else {**__import__("os").environ, **env})
        check(f"refused reference {how}: exit 2 naming it and why",
              p.returncode == 2 and want in p.stderr, (p.returncode, p.stderr))


def main():
    ctx = zmq.Context()
    try:
        scenario_use_kv_events_false_is_approximate()
        scenario_reference_names()
        scenario_no_events_no_credit_is_no_index()
        scenario_credit_zero_runs_no_index(ctx)
        scenario_overlap_score_weight_alias()
        scenario_cost_weights_need_dynamo()
        scenario_strict_priority_on_route()
        scenario_busy_threshold()
        scenario_decision_logs()
        scenario_load_overrides()
        scenario_priorities()
        scenario_metrics()
        scenario_min_initial_workers()
        scenario_eagle(ctx)
        scenario_sessions()
        scenario_models()
        scenario_multimodal()
        scenario_learned_adapters()
        scenario_mocker_adapters()
        scenario_chat_images()
        scenario_vllm_mm_events(ctx)
        scenario_capacity_from_metrics()
    finally:
        kill_children()
        ctx.term()
    finish()


if __name__ == "__main__":
    main()
