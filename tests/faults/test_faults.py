#!/usr/bin/python3
"""The fault-scenario suite: each scenario of docs/reliability.md that needs real processes,
named after it (sNN_...). Real `kvrouter mocker` engines are killed with SIGKILL, paused with
SIGSTOP, restarted on the same ports or under a new id; a scripted ZeroMQ publisher
(kvr_events.Engine) sends garbage, unknown parents, foreign ranks and wrong block sizes.
Scenarios covered elsewhere (unit, model and fuzz tests) are listed in docs/reliability.md.

Every wait is a bounded poll of something the router shows (/v1/workers, /metrics, /v1/dump);
no sleep stands in for a synchronisation. Usage: test_faults.py KVROUTER
(KVR_TEST_VERBOSE=1 prints every check; KVR_TEST_SEED fixes the prompts)."""
import http.client
import json
import os
import random
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import zmq  # noqa: E402

from kvr_events import (BS, Engine, batch, engine_hashes, tokens_for,  # noqa: E402
                        vllm_removed, vllm_stored_array)
from kvr_harness import Child, check, eventually, run_scenarios, with_free_ports  # noqa: E402

KVR = sys.argv[1]
SEED = int(os.environ.get("KVR_TEST_SEED", str(int(time.time()) % 100000)))
rng = random.Random(SEED)


def toks(n):
    return [rng.randrange(1000, 30000) for _ in range(n)]


class Mocker:
    """A mocker on fixed ports (HTTP, events, replay), so it can come back where it was."""

    def __init__(self, wid, *extra):
        self.wid, self.extra = wid, [str(a) for a in extra]
        self.child = None
        (self.http, self.ev, self.rp), _ = with_free_ports(self.start_once, 1, 1, 1)

    def start_once(self, http, ev, rp):
        self.http, self.ev, self.rp = http, ev, rp
        self.start(patience=0)

    def start(self, patience=10):
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": f"tcp://*:{self.ev}", "replay_endpoint": f"tcp://*:{self.rp}"}
        end = time.monotonic() + patience
        while True:  # a killed process's ports are free again within moments
            try:
                self.child = Child([KVR, "mocker", "--host", "127.0.0.1", "--port", self.http,
                                    "--model", "m", "--block-size", BS, "--seed", self.wid,
                                    "--kv-events-config", json.dumps(cfg)] + self.extra,
                                   f"mocker {self.wid}")
                return
            except RuntimeError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)

    def spec(self, wid=None, events=True):
        s = f"id={wid or self.wid},url=http://127.0.0.1:{self.http}"
        if events:
            s += f",events=tcp://127.0.0.1:{self.ev},replay=tcp://127.0.0.1:{self.rp}"
        return s


def subscribed(*ms):
    """Bounded wait until the router's subscription has reached every engine (what an engine
    publishes before that is lost to ZeroMQ's slow joiner until a later batch shows the gap)."""
    return eventually(lambda: all((m.child.metric("kvr_mocker_kv_event_subscribers") or 0) >= 1
                                  for m in ms), 10)


def router(specs, *extra, what="router"):
    args = [KVR, "serve", "--http-port", "0", "--block-size", BS, "--log-level", "error"]
    for s in specs:
        args += ["--worker", s]
    return Child(args + [str(a) for a in extra], what)


def worker(r, wid):
    st, ws = r.call("GET", "/v1/workers")
    for w in ws.get("workers", []) if st == 200 else []:
        if w["worker_id"] == wid:
            return w
    return None


def rank(r, wid, d=0):
    w = worker(r, wid)
    return w["ranks"][d] if w else None


def dump_workers(r):
    """{worker_id: stored blocks} from /v1/dump (the index as replayable store events)."""
    st, d = r.call("GET", "/v1/dump")
    out = {}
    for ev in d.get("events", []) if st == 200 else ():
        n = len(ev.get("stored", {}).get("blocks", []))
        out[ev["worker_id"]] = out.get(ev["worker_id"], 0) + n
    return out


def complete(r, prompt, headers=None, max_tokens=2, stream=False):
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    st, body, h = r.call_h("POST", "/v1/completions", body, headers)
    wid = h.get("x-kvrouter-worker-id")
    return st, body, int(wid) if wid else None


def in_flight(r):
    return r.metric("kvr_requests_in_flight")


def open_stream(r, prompt, headers, max_tokens):
    """A streaming request left open: (connection, response) once the first chunk is in."""
    conn = http.client.HTTPConnection(r.host, r.port, timeout=30)
    h = {"Content-Type": "application/json"}
    h.update(headers)
    conn.request("POST", "/v1/completions", json.dumps(
        {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": True}), h)
    resp = conn.getresponse()
    resp.readline()  # the first event's line (chunked decoding stays in step)
    return conn, resp


# ------------------------------------------------------------------------------------------

def s01_worker_sigkill():
    """S1: a worker killed mid-load. Its streams end, it is fenced and shown unreachable
    before any new request fails on it, its blocks leave the index, its bookings are released
    and its prefixes are served by the survivors."""
    ms = [Mocker(i + 1, "--speedup", 0.05) for i in range(3)]
    r = router([m.spec() for m in ms], "--health-interval-ms", 60000, what="router(S1)")
    check("S1: subscribed to every engine", subscribed(*ms))
    p = toks(8 * BS)
    st, _, w = complete(r, p)
    check("S1: warm-up served", st == 200, st)
    check("S1: the prefix is indexed on its worker",
          eventually(lambda: (rank(r, w)["index_blocks"] or 0) >= 8, 5), rank(r, w))
    streams = [open_stream(r, toks(4 * BS), {"x-worker-instance-id": str(w)}, 2000)
               for _ in range(3)]
    check("S1: three streams in flight on the worker",
          eventually(lambda: rank(r, w)["active_requests"] == 3, 5), rank(r, w))
    ms[w - 1].child.kill()
    ended = []

    def drain(resp):
        try:
            resp.read()
        except Exception:  # noqa: BLE001 - a reset is an end too
            pass
        ended.append(True)

    ts = [threading.Thread(target=drain, args=(resp,)) for _, resp in streams]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    check("S1: every stream on the killed worker ended (none hangs)", len(ended) == 3, len(ended))
    for c, _ in streams:
        c.close()
    check("S1: fenced and unreachable without a failed request (events connection lost, "
          "/health refused)",
          eventually(lambda: worker(r, w)["fenced"]
                     and rank(r, w)["index_state"] == "unreachable", 10), worker(r, w))
    check("S1: its blocks left the index", rank(r, w)["index_blocks"] == 0
          and dump_workers(r).get(w, 0) == 0, (rank(r, w), dump_workers(r)))
    check("S1: its bookings released", eventually(lambda: rank(r, w)["active_requests"] == 0
                                                  and in_flight(r) == 0, 10), rank(r, w))
    st, _, w2 = complete(r, p)
    check("S1: its prefix is served by a survivor", st == 200 and w2 not in (None, w), (st, w2))
    check("S1: the lost connection counted", (r.metric("kvr_kv_disconnects_total") or 0) >= 1)
    r.stop()
    for m in ms:
        if m.child.proc.poll() is None:
            m.child.stop()


def s01_worker_sigkill_no_events():
    """S1 for a worker without KV events: the first request that cannot connect is retried on
    another worker, and the /health probe it triggers fences the worker at once (health
    checks are 60 s apart here, so only that probe can)."""
    ms = [Mocker(i + 1) for i in range(2)]
    r = router([m.spec(events=False) for m in ms], "--router-mode", "round-robin",
               "--health-interval-ms", 60000, what="router(S1 no events)")
    check("S1b: both admitted", eventually(lambda: not worker(r, 1)["fenced"]
                                           and not worker(r, 2)["fenced"], 5))
    ms[0].child.kill()
    retries0 = r.metric("kvr_frontend_retries_total")
    codes = [complete(r, toks(2 * BS)) for _ in range(4)]
    check("S1b: every request served by the live worker",
          all(c[0] == 200 and c[2] == 2 for c in codes), codes)
    check("S1b: the failed attempt retried", r.metric("kvr_frontend_retries_total") >= retries0 + 1)
    check("S1b: the connect error counted",
          (r.metric("kvr_frontend_upstream_errors_total", kind="connect") or 0) >= 1)
    check("S1b: fenced after one failed request and one failed probe",
          eventually(lambda: worker(r, 1)["fenced"], 5), worker(r, 1))
    r.stop()
    ms[1].child.stop()


def s02_worker_restart_same_ports():
    """S2: a worker restarted on the same ports (a new process): counted as a restart, its
    old blocks gone, its rank exact again and equal to what the new engine holds. The new
    process serves requests before the router's connection is back, so its numbers may run
    past the old ones (caught by the replayed last batch's bytes) or not (numbers went back):
    both must end the same way."""
    m = Mocker(1)
    r = router([m.spec()], "--health-interval-ms", 200, what="router(S2)")
    check("S2: subscribed", subscribed(m))
    for _ in range(4):
        check("S2: served before the kill", complete(r, toks(4 * BS))[0] == 200)
    check("S2: exact before the kill", eventually(lambda: rank(r, 1)["index_state"] == "exact"
                                                  and rank(r, 1)["index_blocks"] > 0, 5),
          rank(r, 1))
    old_blocks = rank(r, 1)["index_blocks"]
    m.child.kill()
    check("S2: unreachable once killed",
          eventually(lambda: rank(r, 1)["index_state"] == "unreachable", 5), rank(r, 1))
    m.start()
    # straight to the engine: batches published while the router is still reconnecting
    for _ in range(8):
        st, _ = m.child.call("POST", "/v1/completions",
                             {"model": "m", "prompt": toks(2 * BS), "max_tokens": 1})
        check("S2: the new engine serves", st == 200, st)
    check("S2: readmitted", eventually(lambda: not worker(r, 1)["fenced"], 10), worker(r, 1))
    for _ in range(2):
        complete(r, toks(2 * BS))
    cached = lambda: m.child.metric("kvr_mocker_blocks_cached")  # noqa: E731
    check("S2: counted as a restart and exact again, holding what the new engine holds",
          eventually(lambda: rank(r, 1)["restarts"] >= 1 and rank(r, 1)["index_state"] == "exact"
                     and rank(r, 1)["index_blocks"] == cached(), 10),
          (rank(r, 1), cached(), old_blocks))
    check("S2: the restart counted in /metrics",
          (r.metric("kvr_kv_publisher_restarts_total") or 0) >= 1)
    r.stop()
    m.child.stop()


def s02_worker_new_identity():
    """S2 with a new id: the old id removed, the same engine added as another worker: no
    block of the old id stays, the new one is indexed from the engine's replay buffer."""
    m = Mocker(1)
    r = router([m.spec()], what="router(S2 new id)")
    check("S2b: subscribed", subscribed(m))
    for _ in range(3):
        complete(r, toks(4 * BS))
    check("S2b: indexed under id 1", eventually(lambda: dump_workers(r).get(1, 0) > 0, 5))
    st, _ = r.call("DELETE", "/v1/workers/1")
    check("S2b: old id removed", st == 200, st)
    st, w = r.call("POST", "/v1/workers", {
        "worker_id": 7, "url": f"http://127.0.0.1:{m.http}",
        "events": f"tcp://127.0.0.1:{m.ev}", "replay": f"tcp://127.0.0.1:{m.rp}"})
    check("S2b: added as id 7", st == 201, (st, w))
    check("S2b: the new subscription arrived",
          eventually(lambda: (m.child.metric("kvr_mocker_kv_event_subscribers") or 0) >= 1, 10))
    complete(r, toks(4 * BS))
    check("S2b: the new id indexed, the old one gone",
          eventually(lambda: dump_workers(r).get(7, 0) > 0 and 1 not in dump_workers(r), 5),
          dump_workers(r))
    r.stop()
    m.child.stop()


def s03_late_events_after_removal():
    """S3: events a removed worker still publishes are never applied (its coverage is not
    resurrected). A second engine's marker batch, sent after them, shows the router has
    read past the moment they would have landed."""
    ctx = zmq.Context()
    e, e2 = Engine(ctx), Engine(ctx)
    r = router([f"id=1,events={e.endpoint()},replay={e.replay_endpoint()}",
                f"id=2,events={e2.endpoint()},replay={e2.replay_endpoint()}"], what="router(S3)")
    check("S3: subscribed", e.wait_subscribed() and e2.wait_subscribed())
    p, h = tokens_for(3, 4), engine_hashes(3, 4)
    e.send(batch([vllm_stored_array(h, None, p)]))
    check("S3: stored", eventually(lambda: rank(r, 1)["index_blocks"] == 4, 5), rank(r, 1))
    st, _ = r.call("DELETE", "/v1/workers/1")
    check("S3: removed", st == 200)
    check("S3: its blocks left with it", dump_workers(r) == {}, dump_workers(r))
    e.send(batch([vllm_stored_array(engine_hashes(4, 4), None, tokens_for(4, 4))]))
    e.send(batch([vllm_stored_array(engine_hashes(5, 2), h[-1], tokens_for(5, 2))]))
    e2.send(batch([vllm_stored_array(engine_hashes(6, 1), None, tokens_for(6, 1))]))
    check("S3: the marker from the other engine applied",
          eventually(lambda: dump_workers(r).get(2) == 1, 5), dump_workers(r))
    check("S3: nothing of the removed worker applied or indexed",
          dump_workers(r) == {2: 1} and r.metric("kvr_index_pairs") == 1,
          (dump_workers(r), r.metric("kvr_index_pairs")))
    r.stop()
    e.close()
    e2.close()
    ctx.term()


def s06_paused_worker():
    """S6/S13: a worker paused with SIGSTOP (alive, silent): requests are not held behind it,
    its failing health probes fence it, and SIGCONT readmits it."""
    ms = [Mocker(i + 1) for i in range(2)]
    r = router([m.spec() for m in ms], "--health-interval-ms", 300, "--health-failures", 2,
               "--frontend-upstream-timeout-ms", 1500, what="router(S6)")
    check("S6: both admitted", eventually(lambda: not worker(r, 1)["fenced"]
                                          and not worker(r, 2)["fenced"], 5))
    ms[0].child.proc.send_signal(signal.SIGSTOP)
    try:
        check("S6: the paused worker is fenced by its health probes",
              eventually(lambda: worker(r, 1)["fenced"], 15), worker(r, 1))
        check("S6: no stale blocks shown for it while fenced", rank(r, 1)["index_blocks"] == 0,
              rank(r, 1))
        res = [complete(r, toks(2 * BS)) for _ in range(4)]
        check("S6: requests go to the live worker meanwhile",
              all(x[0] == 200 and x[2] == 2 for x in res), res)
    finally:
        ms[0].child.proc.send_signal(signal.SIGCONT)
    check("S6: readmitted once it answers again",
          eventually(lambda: not worker(r, 1)["fenced"], 15), worker(r, 1))
    check("S6: nothing left in flight", eventually(lambda: in_flight(r) == 0, 10))
    r.stop()
    for m in ms:
        m.child.stop()


def s11_all_workers_busy():
    """S11: every worker busy (a tiny prefill budget) under a flood: only 200 or 429 with one
    stable body, and the rejections counted equal the ones observed. (Our overload answer is
    429, which OpenAI clients retry with backoff; docs/reliability.md.)"""
    m = Mocker(1, "--speedup", 0.05)
    r = router([m.spec() + ",max_num_batched_tokens=1000"],
               "--active-prefill-tokens-threshold-frac", 0.5, what="router(S11)")
    out = []
    lock = threading.Lock()

    def go():
        st, body, _ = complete(r, toks(40 * BS), max_tokens=4)
        with lock:
            out.append((st, json.dumps(body.get("error", {}).get("message")) if st != 200
                        else None))

    ts = [threading.Thread(target=go) for _ in range(12)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    codes = sorted({s for s, _ in out})
    rejected = [b for s, b in out if s == 429]
    check("S11: every request answered", len(out) == 12, len(out))
    check("S11: only 200 or 429", set(codes) <= {200, 429}, codes)
    check("S11: some served, some refused", 200 in codes and 429 in codes, codes)
    check("S11: one stable refusal body", len(set(rejected)) == 1, set(rejected))
    check("S11: the refusals counted exactly",
          r.metric("kvr_routes_total", result="busy") == len(rejected),
          (r.metric("kvr_routes_total", result="busy"), len(rejected)))
    check("S11: nothing left in flight", eventually(lambda: in_flight(r) == 0, 20))
    r.stop()
    m.child.stop()


def s12_cancel_mid_stream():
    """S12: clients hang up mid-stream: every booking released exactly once, the engines
    free the blocks, the load returns to 0."""
    ms = [Mocker(i + 1, "--speedup", 0.1) for i in range(2)]
    r = router([m.spec() for m in ms], what="router(S12)")
    streams = [open_stream(r, toks(6 * BS), {}, 500) for _ in range(10)]
    check("S12: ten streams in flight", eventually(lambda: in_flight(r) == 10, 5), in_flight(r))
    for c, _ in streams:
        c.close()
    check("S12: the router's load back to 0",
          eventually(lambda: in_flight(r) == 0 and all(rank(r, i)["active_requests"] == 0
                                                       and rank(r, i)["active_blocks"] == 0
                                                       for i in (1, 2)), 10),
          [rank(r, i) for i in (1, 2)])
    check("S12: the engines freed them too",
          eventually(lambda: sum(m.child.metric("kvr_mocker_blocks_active") or 0 for m in ms) == 0,
                     10))
    check("S12: no free for an unknown request (each released once)",
          r.metric("kvr_requests_unknown_total") == 0)
    r.stop()
    for m in ms:
        m.child.stop()


def s13_worker_removed_in_flight():
    """S13: the worker leaves (DELETE /v1/workers) while a stream is on it: its booking goes
    with it at once, the stream drains from the engine to its end (no hang, no cut), its end
    is not taken for an unknown request, and the next request goes to the other worker."""
    ms = [Mocker(i + 1, "--speedup", 0.05) for i in range(2)]
    r = router([m.spec() for m in ms], what="router(S13)")
    c, resp = open_stream(r, toks(4 * BS), {"x-worker-instance-id": "1"}, 30)
    check("S13: in flight on worker 1", eventually(lambda: rank(r, 1)["active_requests"] == 1, 5))
    st, _ = r.call("DELETE", "/v1/workers/1")
    check("S13: removed", st == 200, st)
    check("S13: its booking released with it", in_flight(r) == 0, in_flight(r))
    done = []
    t = threading.Thread(target=lambda: done.append(resp.read()))
    t.start()
    t.join(60)
    c.close()
    check("S13: the stream on the removed worker drained to its end",
          len(done) == 1 and done[0].endswith(b"data: [DONE]\n\n"), done[:1])
    check("S13: its end is not an unknown request", r.metric("kvr_requests_unknown_total") == 0)
    st, _, w = complete(r, toks(2 * BS))
    check("S13: the next request goes to the remaining worker", st == 200 and w == 2, (st, w))
    r.stop()
    for m in ms:
        m.child.stop()


def event_router(e, *extra, dp=1):
    return router([f"id=1,events={e.endpoint()},replay={e.replay_endpoint()},dp_size={dp}"],
                  *extra, what="router(events)")


def s14_garbage_from_publisher():
    """S14: garbage from a publisher: malformed messages, an undecodable batch, an unknown
    event tag beside a good event. The router stays up, counts each, and applies the good
    batch-mate."""
    ctx = zmq.Context()
    e = Engine(ctx)
    r = event_router(e)
    check("S14: subscribed", e.wait_subscribed())
    e.pub.send_multipart([b"x", b"y"])                       # 2 frames
    e.pub.send_multipart([b"", b"\x00" * 7, b"z"])           # a 7-byte seq
    e.send(b"\xc1\xc1garbage")                               # not msgpack: a gap, replayed
    p, h = tokens_for(6, 3), engine_hashes(6, 3)
    e.send(batch([["SomethingNew", 1, 2], vllm_stored_array(h, None, p)]))
    check("S14: the good event beside an unknown tag applied",
          eventually(lambda: rank(r, 1)["index_blocks"] == 3, 5), rank(r, 1))
    check("S14: malformed messages counted", r.metric("kvr_kv_bad_messages_total") == 2)
    check("S14: the undecodable batch counted",
          eventually(lambda: r.metric("kvr_kv_batch_decode_errors_total") >= 1, 5))
    check("S14: the unknown tag counted",
          r.metric("kvr_kv_events_dropped_total", cause="unknown_tag") >= 1)
    check("S14: state shown partial after a batch that could not be read",
          rank(r, 1)["index_state"] == "degraded", rank(r, 1))
    check("S14: the router still answers", r.call("GET", "/health")[0] == 200)
    r.stop()
    e.close()
    ctx.term()


def s15_s16_s17_bad_events():
    """S15 (unknown parent), S16 (remove of an unknown block; a batch naming a rank the
    worker does not have), S17 (a hash repeated inside one store): each refused and counted,
    the rest of the batch applied, no entry for anyone else."""
    ctx = zmq.Context()
    e = Engine(ctx)
    r = event_router(e)
    check("S15: subscribed", e.wait_subscribed())
    p, h = tokens_for(7, 4), engine_hashes(7, 4)
    e.send(batch([vllm_stored_array(h, None, p)]))
    check("S15: base chain stored", eventually(lambda: rank(r, 1)["index_blocks"] == 4, 5))
    errs = lambda k: r.metric("kvr_index_errors_total", kind=k) or 0  # noqa: E731
    # S15: parent never stored
    e.send(batch([vllm_stored_array(engine_hashes(8, 2), 0x1234567, tokens_for(8, 2))]))
    check("S15: unknown parent refused and counted",
          eventually(lambda: errs("parent_not_found") == 1, 5), errs("parent_not_found"))
    check("S15: no partial insert", rank(r, 1)["index_blocks"] == 4, rank(r, 1))
    # S16: remove of an unknown block, then a good store in the same batch
    p9, h9 = tokens_for(9, 2), engine_hashes(9, 2)
    e.send(batch([vllm_removed([0xDEADBEEF]), vllm_stored_array(h9, None, p9)]))
    check("S16: unknown block's removal counted, its batch-mate applied",
          eventually(lambda: errs("block_not_found") == 1 and rank(r, 1)["index_blocks"] == 6, 5),
          (errs("block_not_found"), rank(r, 1)))
    # S16: a batch naming dp_rank 5 of a worker with one rank
    e.send(batch([vllm_stored_array(engine_hashes(10, 2), None, tokens_for(10, 2))], rank=5))
    check("S16: a batch for a rank the worker lacks refused and counted",
          eventually(lambda: r.metric("kvr_kv_batches_rank_out_of_range_total") == 1, 5)
          and rank(r, 1)["batches_rank_out_of_range"] == 1 and rank(r, 1)["index_blocks"] == 6,
          rank(r, 1))
    _, q = r.call("POST", "/v1/query", {"tokens": tokens_for(10, 2)})
    check("S16: no entry created for rank 5",
          all(s["dp_rank"] == 0 for s in q["scores"]) and sum(s["device_blocks"] for s in q["scores"]) == 0,
          q)
    # S17: a store whose hashes repeat
    hd = engine_hashes(11, 3)
    e.send(batch([vllm_stored_array([hd[0], hd[1], hd[0]], None, tokens_for(11, 3))]))
    e.send(batch([vllm_stored_array(engine_hashes(12, 1), None, tokens_for(12, 1))]))
    check("S17: the rank goes on after a self-referencing store (next batch applied)",
          eventually(lambda: rank(r, 1)["last_seq"] == e.seq - 1, 5), rank(r, 1))
    _, q = r.call("POST", "/v1/query", {"tokens": tokens_for(7, 4)})
    check("S17: the worker's other blocks kept",
          [s["device_blocks"] for s in q["scores"] if s["worker_id"] == 1] == [4], q)
    check("S15-S17: the router still answers", r.call("GET", "/health")[0] == 200)
    r.stop()
    e.close()
    ctx.term()


def s18_block_size_mismatch_clears():
    """S18: events of another block size put the rank in `error` (counted, never a silent 0
    overlap); once events of the right size apply again the error clears, and the rank shows
    degraded (what was refused is missing), not exact."""
    ctx = zmq.Context()
    e = Engine(ctx)
    r = event_router(e)
    check("S18: subscribed", e.wait_subscribed())
    e.send(batch([vllm_stored_array(engine_hashes(13, 2), None, tokens_for(13, 1) * 2,
                                    block_size=2 * BS)]))
    check("S18: error state and counter",
          eventually(lambda: rank(r, 1)["index_state"] == "error"
                     and rank(r, 1)["block_size_mismatches"] == 1, 5), rank(r, 1))
    e.send(batch([vllm_stored_array(engine_hashes(14, 2), None, tokens_for(14, 2))]))
    check("S18: cleared to degraded by right-sized events",
          eventually(lambda: rank(r, 1)["index_state"] == "degraded"
                     and rank(r, 1)["index_blocks"] == 2, 5), rank(r, 1))
    r.stop()
    e.close()
    ctx.term()


def s21_s22_prompt_sizes():
    """S21: a prompt over the limit is refused with 413 before hashing, token ids and text
    alike (text is tokenized by a worker first). S22: sub-block and one-token prompts route
    with overlap 0; an empty one is a 400 naming the field."""
    m = Mocker(1)
    r = router([m.spec()], "--router-max-prompt-tokens", 1000, what="router(S21)")
    st, b, _ = complete(r, list(range(1_000_000)))
    check("S21: a 1M-token prompt is a 413", st == 413 and "1000" in json.dumps(b), (st, b))
    st, b, _ = complete(r, "hello " * 3000)
    check("S21: a text prompt over the limit is a 413 (not the worker's refusal as a 502)",
          st == 413 and "router_max_prompt_tokens" in json.dumps(b), (st, b))
    check("S21: no upstream protocol error counted for it",
          (r.metric("kvr_frontend_upstream_errors_total", kind="protocol") or 0) == 0)
    for n in (1, BS - 1):
        st, res = r.call("POST", "/v1/route", {"tokens": list(range(n)), "update_state": False})
        check(f"S22: a {n}-token prompt routes with overlap 0",
              st == 200 and res.get("overlap_blocks", 0) == 0, (st, res))
        check(f"S22: and completes ({n} tokens)", complete(r, list(range(n)))[0] == 200)
    st, b, _ = complete(r, [])
    check("S22: an empty prompt is a 400 naming the prompt",
          st == 400 and "prompt" in json.dumps(b), (st, b))
    r.stop()
    m.child.stop()


def s25_unknown_request_calls():
    """S24/S25: a second live request under the same id is refused (409); a free or a
    first-token for an unknown id changes nothing, answers 404 and is counted."""
    r = router(["id=1"], what="router(S25)")
    st, _ = r.call("POST", "/v1/route", {"tokens": list(range(64)), "request_id": "dup"})
    check("S24: first booking", st == 200, st)
    st, b = r.call("POST", "/v1/route", {"tokens": list(range(64)), "request_id": "dup"})
    check("S24: the same live id again is a 409", st == 409, (st, b))
    unknown0 = r.metric("kvr_requests_unknown_total")
    for method, path in (("DELETE", "/v1/requests/nope"), ("POST", "/v1/requests/nope/first_token")):
        st, b = r.call(method, path, {} if method == "POST" else None)
        check(f"S25: {method} {path} is a 404", st == 404, (st, b))
    check("S25: both counted", r.metric("kvr_requests_unknown_total") == unknown0 + 2)
    check("S25: the live booking untouched", in_flight(r) == 1)
    st, _ = r.call("DELETE", "/v1/requests/dup")
    check("S25: its own free works", st == 200 and in_flight(r) == 0, st)
    r.stop()


if __name__ == "__main__":
    run_scenarios([
        ("S1", s01_worker_sigkill),
        ("S1 no events", s01_worker_sigkill_no_events),
        ("S2", s02_worker_restart_same_ports),
        ("S2 new id", s02_worker_new_identity),
        ("S3", s03_late_events_after_removal),
        ("S6", s06_paused_worker),
        ("S11", s11_all_workers_busy),
        ("S12", s12_cancel_mid_stream),
        ("S13", s13_worker_removed_in_flight),
        ("S14", s14_garbage_from_publisher),
        ("S15-S17", s15_s16_s17_bad_events),
        ("S18", s18_block_size_mismatch_clears),
        ("S21-S22", s21_s22_prompt_sizes),
        ("S24-S25", s25_unknown_request_calls),
    ], SEED)
