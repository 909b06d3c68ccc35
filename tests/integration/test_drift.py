#!/usr/bin/python3
"""The index checks itself: for every answer, the cached tokens the router predicted on the
chosen rank against the cached tokens its engine reports (usage.prompt_tokens_details), with real
mockers behind `kvrouter serve`'s OpenAI front end.
  - healthy: repeated prompts on two workers; neither is ever flagged, accuracy 1;
  - a mocker whose KV events turn silently wrong (stored events name other tokens) is flagged
    drifting within prediction_drift_window answers, logged with why, resynced from its replay
    buffer (the rank replays), while the healthy worker is never flagged; once the fault stops
    it agrees again and is shown well;
  - a mocker whose events are silently dropped (never sent, never numbered) and that has no
    replay socket: flagged, its state dropped (resync result "dropped"), well again after;
  - prediction_drift_action flag: flagged and logged, nothing resynced;
  - prediction_drift_action approximate: flagged, then routed on the router's own decisions (a
    prompt it was sent counts as cached there though its wrong events say nothing of it) until
    its events agree again, then routed by them (what was recorded is gone);
  - /v1/workers and /metrics (kvr_prediction_*) show each of these states.
Every wait polls an observable condition under a bound.
Usage: test_drift.py <path to kvrouter>.
"""
import http.client
import json
import random
import subprocess
import sys

from kvr_harness import Child, check, eventually, finish, kill_children, with_free_ports

KVR = sys.argv[1]
BS = 16
WINDOW = 8


def mocker(name, replay):
    def start(ev, rp):
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}"}
        if replay:
            cfg["replay_endpoint"] = f"tcp://*:{rp}"
        return Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "m",
                      "--block-size", str(BS), "--speedup", "100", "--kv-events-config",
                      json.dumps(cfg)], f"mocker {name}")
    (ev, rp), m = with_free_ports(start, 1, 1)
    m.spec = f"url={m.url},events=tcp://127.0.0.1:{ev}" + \
        (f",replay=tcp://127.0.0.1:{rp}" if replay else "")
    return m


def serve(specs, *extra):
    args = [KVR, "serve", "--http-port", "0", "--block-size", str(BS), "--log-level", "info",
            "--seed", "7", "--prediction-drift-window", str(WINDOW)]
    for wid, m in specs:
        args += ["--worker", f"id={wid},{m.spec}"]
    return Child(args + [str(a) for a in extra], "router")


def rank(r, wid):
    _, w = r.call("GET", "/v1/workers")
    return next(wk["ranks"][0] for wk in w["workers"] if wk["worker_id"] == wid)


def held(r, wid, toks):
    _, q = r.call("POST", "/v1/query", {"tokens": toks})
    return {s["worker_id"]: s["device_blocks"] for s in q["scores"]}.get(wid, 0)


RNG = random.Random(31)


def prompt(n_blocks=4):
    # whole blocks and 5 tokens more: the engine can report every block cached
    return [RNG.randrange(1, 30000) for _ in range(n_blocks * BS + 5)]


def ask(r, wid, toks):
    st, a, h = r.call_h("POST", "/v1/completions", {"model": "m", "prompt": toks, "max_tokens": 2},
                        headers={"x-worker-instance-id": str(wid)})
    assert st == 200 and h.get("x-kvrouter-worker-id") == str(wid), (st, h, a)
    return a


def stream(r, wid, toks, usage):
    """A streamed completion on wid, read to its end; with usage: stream_options asks for it."""
    body = {"model": "m", "prompt": toks, "max_tokens": 2, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    conn = http.client.HTTPConnection(r.host, r.port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json",
                              "x-worker-instance-id": str(wid)})
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == 200 and b"[DONE]" in data, (resp.status, data[:200])
    finally:
        conn.close()


def healthy_round(r, wid, n_prompts):
    """Each prompt twice on wid, the second once the router has indexed the first's blocks."""
    for _ in range(n_prompts):
        toks = prompt()
        ask(r, wid, toks)
        if not eventually(lambda: held(r, wid, toks) == 4, timeout=10):
            raise AssertionError(f"worker {wid}: blocks never indexed")
        ask(r, wid, toks)


def faulty_round(r, m, wid, n_prompts, wait_events):
    """Each prompt four times on wid: its engine reports the blocks cached after the first."""
    for _ in range(n_prompts):
        toks = prompt()
        before = rank(r, wid)["events_applied"]
        ask(r, wid, toks)
        if wait_events:  # the (wrong) events of the first are in before the repeats
            eventually(lambda: rank(r, wid)["events_applied"] > before, timeout=10)
        for _ in range(3):
            ask(r, wid, toks)


def subscribed(*ms):
    return all(eventually(lambda: (m.metric("kvr_mocker_kv_event_subscribers") or 0) >= 1)
               for m in ms)


def scenario_wrong_events_resynced():
    a, b = mocker("a", True), mocker("b", True)
    r = serve([(1, a), (2, b)])
    try:
        check("wrong: the router subscribed to both", subscribed(a, b))
        for wid in (1, 2):
            healthy_round(r, wid, WINDOW // 2 + 1)
        pa, pb = rank(r, 1)["prediction"], rank(r, 2)["prediction"]
        check("wrong: a healthy fleet agrees (accuracy 1, compared, not drifting)",
              all(p["accuracy"] == 1 and p["compared"] >= WINDOW and not p["drifting"]
                  for p in (pa, pb)), (pa, pb))
        replayed0 = rank(r, 2)["replayed"]
        st, f = b.call("POST", "/debug/kv_events_fault?mode=wrong")
        check("wrong: the mocker's events turn wrong", st == 200, (st, f))
        answers = 0
        while answers < WINDOW and not rank(r, 2)["prediction"]["drifting"]:
            faulty_round(r, b, 2, 1, True)
            answers += 4
        pb = rank(r, 2)["prediction"]
        check("wrong: flagged drifting within the window", pb["drifting"] and answers <= WINDOW,
              (answers, pb))
        check("wrong: the index misses what the engine holds (mean error > 0)",
              pb["mean_error_tokens"] > 0 or pb["window_answers"] == 0, pb)
        check("wrong: logged with why",
              eventually(lambda: "predictions drifting" in r.stderr()
                         and "rebuilt from its engine's replay buffer" in r.stderr()),
              r.stderr()[-3000:])
        check("wrong: resynced from the replay buffer (the rank replayed)",
              eventually(lambda: rank(r, 2)["replayed"] > replayed0)
              and r.metric("kvr_prediction_resyncs_total", result="asked") >= 1,
              (rank(r, 2), r.metric("kvr_prediction_resyncs_total", result="asked")))
        check("wrong: /metrics shows it drifting",
              r.metric("kvr_prediction_drifting", worker_id="2", dp_rank="0") == 1
              and r.metric("kvr_prediction_drift_flags_total", worker_id="2", dp_rank="0") >= 1)
        healthy_round(r, 1, 3)
        check("wrong: the healthy worker is never flagged",
              rank(r, 1)["prediction"]["flagged"] == 0
              and r.metric("kvr_prediction_drifting", worker_id="1", dp_rank="0") == 0,
              rank(r, 1)["prediction"])
        st, _ = b.call("POST", "/debug/kv_events_fault?mode=none")
        check("wrong: the fault stops", st == 200)
        n = 0
        while rank(r, 2)["prediction"]["drifting"] and n < 3 * WINDOW:
            healthy_round(r, 2, 1)
            n += 2
        pb = rank(r, 2)["prediction"]
        check("wrong: agrees again once the fault stops", not pb["drifting"] and pb["recovered"] >= 1,
              (n, pb))
        check("wrong: the recovery is logged", "predictions agree again" in r.stderr())
        check("wrong: a healthy worker never flagged, all along",
              rank(r, 1)["prediction"]["flagged"] == 0)
        check("wrong: answers counted as reported",
              r.metric("kvr_prediction_answers_total", report="reported") >= 4 * WINDOW
              and r.metric("kvr_prediction_answers_total", report="unreported") == 0)
        ans = {k: r.metric("kvr_prediction_answers_total", report=k)
               for k in ("reported", "unreported", "not_asked")}
        for _ in range(3):
            stream(r, 1, prompt(), usage=False)
        stream(r, 1, prompt(), usage=True)
        check("streams without include_usage count as not asked, not as unreported",
              eventually(lambda: r.metric("kvr_prediction_answers_total", report="not_asked")
                         == ans["not_asked"] + 3
                         and r.metric("kvr_prediction_answers_total", report="reported")
                         == ans["reported"] + 1, timeout=10)
              and r.metric("kvr_prediction_answers_total", report="unreported") == 0,
              (ans, r.metric("kvr_prediction_answers_total", report="not_asked")))
        check("wrong: the error histogram has the answers",
              r.metric("kvr_prediction_error_tokens_count") >= 4 * WINDOW)
    finally:
        r.stop()
        a.stop()
        b.stop()


def scenario_dropped_events_without_replay():
    a, b = mocker("a", True), mocker("b", False)
    r = serve([(1, a), (2, b)])
    try:
        check("drop: the router subscribed to both", subscribed(a, b))
        healthy_round(r, 2, WINDOW // 2)
        st, _ = b.call("POST", "/debug/kv_events_fault?mode=drop")
        check("drop: the mocker stops sending events", st == 200)
        answers = 0
        while answers < WINDOW and not rank(r, 2)["prediction"]["drifting"]:
            faulty_round(r, b, 2, 1, False)
            answers += 4
        check("drop: flagged drifting within the window",
              rank(r, 2)["prediction"]["drifting"] and answers <= WINDOW,
              (answers, rank(r, 2)["prediction"]))
        check("drop: no replay socket, so its state is dropped (counted, logged)",
              eventually(lambda: r.metric("kvr_prediction_resyncs_total", result="dropped") >= 1)
              and "no replay socket" in r.stderr(), r.stderr()[-2000:])
        check("drop: shown degraded after the drop", rank(r, 2)["index_state"] == "degraded",
              rank(r, 2))
        b.call("POST", "/debug/kv_events_fault?mode=none")
        n = 0
        while rank(r, 2)["prediction"]["drifting"] and n < 3 * WINDOW:
            healthy_round(r, 2, 1)
            n += 2
        check("drop: agrees again once events flow", not rank(r, 2)["prediction"]["drifting"],
              rank(r, 2)["prediction"])
        check("drop: the other worker was never flagged", rank(r, 1)["prediction"]["flagged"] == 0)
    finally:
        r.stop()
        a.stop()
        b.stop()


def scenario_flag_only():
    b = mocker("b", True)
    r = serve([(2, b)], "--prediction-drift-action", "flag")
    try:
        check("flag: subscribed", subscribed(b))
        b.call("POST", "/debug/kv_events_fault?mode=wrong")
        answers = 0
        while answers < 2 * WINDOW and not rank(r, 2)["prediction"]["drifting"]:
            faulty_round(r, b, 2, 1, True)
            answers += 4
        check("flag: flagged", rank(r, 2)["prediction"]["drifting"], rank(r, 2)["prediction"])
        check("flag: logged as flagged only", "flagged only" in r.stderr(), r.stderr()[-2000:])
        total = sum(r.metric("kvr_prediction_resyncs_total", result=k) or 0
                    for k in ("asked", "dropped", "busy", "failed"))
        check("flag: nothing resynced", total == 0 and rank(r, 2)["replayed"] == 0, total)
    finally:
        r.stop()
        b.stop()


def scenario_approximate_until_agreeing():
    a, b = mocker("a", True), mocker("b", True)
    r = serve([(1, a), (2, b)], "--prediction-drift-action", "approximate")
    try:
        check("approximate: subscribed", subscribed(a, b))
        healthy_round(r, 2, WINDOW // 2)
        check("approximate: routed by its events while they agree",
              rank(r, 2)["prediction"]["routed"] == "events")
        b.call("POST", "/debug/kv_events_fault?mode=wrong")
        answers = 0
        while answers < WINDOW and not rank(r, 2)["prediction"]["drifting"]:
            faulty_round(r, b, 2, 1, True)
            answers += 4
        p = rank(r, 2)["prediction"]
        check("approximate: flagged within the window, then routed approximately",
              p["drifting"] and p["routed"] == "approximate" and answers <= WINDOW, (answers, p))
        check("approximate: shown in /metrics",
              r.metric("kvr_prediction_approximate", worker_id="2", dp_rank="0") == 1
              and r.metric("kvr_prediction_approximations_total") == 1)
        check("approximate: logged", "routed on the router's own decisions" in r.stderr(),
              r.stderr()[-2000:])
        toks = prompt()
        before = rank(r, 2)["events_applied"]
        ask(r, 2, toks)
        eventually(lambda: rank(r, 2)["events_applied"] > before)
        check("approximate: a prompt it was sent counts as cached there, though its (wrong) "
              "events say nothing of it", held(r, 2, toks) == 4, held(r, 2, toks))
        check("approximate: nothing resynced",
              (r.metric("kvr_prediction_resyncs_total", result="asked") or 0) == 0)
        b.call("POST", "/debug/kv_events_fault?mode=none")
        n = 0
        while rank(r, 2)["prediction"]["drifting"] and n < 3 * WINDOW:
            healthy_round(r, 2, 1)
            n += 2
        p = rank(r, 2)["prediction"]
        check("approximate: once its events agree again, routed by them",
              not p["drifting"] and p["routed"] == "events"
              and r.metric("kvr_prediction_approximate", worker_id="2", dp_rank="0") == 0, (n, p))
        check("approximate: what it recorded is gone (the wrong events say nothing of it)",
              held(r, 2, toks) == 0, held(r, 2, toks))
        check("approximate: the other worker never flagged", rank(r, 1)["prediction"]["flagged"] == 0)
    finally:
        r.stop()
        a.stop()
        b.stop()


def scenario_off_and_bad_settings():
    b = mocker("b", True)
    r = Child([KVR, "serve", "--http-port", "0", "--block-size", str(BS),
               "--prediction-drift-window", "0", "--worker", f"id=2,{b.spec}"], "router")
    try:
        check("off: /v1/workers shows no prediction", rank(r, 2)["prediction"] is None)
        check("off: no kvr_prediction_ families", "kvr_prediction_" not in r.request("GET", "/metrics")[2].decode())
    finally:
        r.stop()
        b.stop()
    for flag, val in (("--prediction-drift-min-accuracy", "1.5"),
                      ("--prediction-drift-action", "approximately"),
                      ("--prediction-drift-window", "5000")):
        p = subprocess.run([KVR, "serve", "--http-port", "0", flag, val], capture_output=True,
                           text=True, timeout=20)
        check(f"bad setting {flag} {val}: refused at start, naming it as typed",
              p.returncode != 0 and flag in p.stderr, (p.returncode, p.stderr[-500:]))


def main():
    try:
        scenario_wrong_events_resynced()
        scenario_dropped_events_without_replay()
        scenario_flag_only()
        scenario_approximate_until_agreeing()
        scenario_off_and_bad_settings()
    finally:
        kill_children()
    finish()


if __name__ == "__main__":
    main()
