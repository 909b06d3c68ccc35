#!/usr/bin/python3
"""Warm restart of `kvrouter serve` (--state-file) against a real `kvrouter mocker`.

The engine keeps only the last 40 event batches for replay, so a router that starts after the
engine has published more cannot rebuild the index from the engine alone: started cold it is
`degraded` for good (and says so). With a state file, the router saved its index and each
exact rank's cursor on SIGTERM; restarted, it reloads them, asks the engine's replay socket for
the saved last batch (same number, same bytes: the same engine process) and what came after,
and is `exact` again, with the blocks of every prompt, including those the engine cached while
the router was down. A state file the engine cannot confirm (it restarted meanwhile), a
damaged file and one saved with another block size are refused, named in the log, and the
router starts cold. Usage: test_warm_restart.py <path to kvrouter>.
"""
import json
import os
import random
import sys
import tempfile

from kvr_harness import Child, check, eventually, finish, with_free_ports

KVR = sys.argv[1]
BS = 4
rng = random.Random(11)


def start_mocker(ev, rp):
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}",
           "replay_endpoint": f"tcp://*:{rp}", "buffer_steps": 40}
    return Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "m",
                  "--block-size", BS, "--num-gpu-blocks", 4096, "--speedup", 50,
                  "--kv-events-config", json.dumps(cfg)], "mocker")


def subscribed(m, n=1):
    """Bounded wait until n routers' subscriptions have reached the engine (what it
    publishes before that is lost to ZeroMQ's slow joiner until a later batch shows the gap)."""
    return eventually(lambda: (m.metric("kvr_mocker_kv_event_subscribers") or 0) >= n, 10)


def start_router(ev, rp, state=None, bs=BS, what="router"):
    args = [KVR, "serve", "--http-port", "0", "--block-size", bs, "--log-level", "info",
            "--worker", f"id=1,events=tcp://127.0.0.1:{ev},replay=tcp://127.0.0.1:{rp}"]
    if state:
        args += ["--state-file", state]
    return Child(args, what)


def rank(r):
    st, ws = r.call("GET", "/v1/workers")
    return ws["workers"][0]["ranks"][0] if st == 200 else {}


def blocks(r, p):
    st, q = r.call("POST", "/v1/query", {"tokens": p})
    return {s["worker_id"]: s["device_blocks"] for s in q["scores"]}.get(1) if st == 200 else None


def serve_prompts(m, n, length=(9, 40)):
    """n requests with fresh prompts straight to the engine; each is cached whole (no
    eviction: 4096 blocks), one event batch per prompt at least."""
    out = []
    for _ in range(n):
        p = [rng.randrange(1, 30000) for _ in range(rng.randrange(*length) * BS)]
        st, _ = m.call("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 1})
        check("engine answers", st == 200, st)
        out.append(p)
    return out


def all_cached(r, prompts):
    """The router's overlap for every prompt is its whole prompt (the engine cached them all:
    block count = len // BS, since a full last block is cached too)."""
    got = [blocks(r, p) for p in prompts]
    want = [len(p) // BS for p in prompts]
    return got == want or (got, want)


def exact_at(r, m):
    want = int(m.metric("kvr_mocker_kv_event_batches_published_total") or 0) - 1
    rk = rank(r)
    return rk if rk.get("index_state") == "exact" and rk.get("last_seq") == want else None


def scenario_resume(tmp):
    (ev, rp), m = with_free_ports(start_mocker, 1, 1)
    state = os.path.join(tmp, "router.state")
    try:
        r = start_router(ev, rp, state)
        # The router's subscription may still be on its way: one prompt at a time until the
        # router has received a batch (it replays the ones it missed from the buffer).
        first = []
        ok = eventually(lambda: first.extend(serve_prompts(m, 1)) or rank(r).get("batches"), 10)
        check("router receives the engine's events", ok, rank(r))
        before = first + serve_prompts(m, 60)
        check("router exact before the restart", eventually(lambda: exact_at(r, m), 10),
              rank(r))
        check("router holds every prompt", eventually(lambda: all_cached(r, before) is True, 10),
              all_cached(r, before))
        r.stop()
        check("state file written on SIGTERM", os.path.getsize(state) > 0)
        check("save logged", "exact ranks saved" in r.stderr(), r.stderr()[-800:])

        during = serve_prompts(m, 5)  # 5+ batches the router misses; the buffer keeps 40
        published = m.metric("kvr_mocker_kv_event_batches_published_total")
        check("history is longer than the engine's replay buffer", published > 40, published)

        cold = start_router(ev, rp, what="cold router")
        warm = start_router(ev, rp, state, what="warm router")
        try:
            check("both routers subscribed", subscribed(m, 2))
            more = serve_prompts(m, 2)  # live batches: the cold router sees its gap now
            check("warm router exact again", eventually(lambda: exact_at(warm, m), 10),
                  rank(warm))
            check("warm router resumed once", warm.metric("kvr_kv_resumes_total") == 1
                  and warm.metric("kvr_kv_resumes_failed_total") == 0,
                  (warm.metric("kvr_kv_resumes_total"), warm.metric("kvr_kv_resumes_failed_total")))
            everything = before + during + more
            check("warm router holds the prompts from before, during and after the restart",
                  eventually(lambda: all_cached(warm, everything) is True, 10),
                  all_cached(warm, everything))
            check("reload logged", "1 ranks resumed" in warm.stderr(), warm.stderr()[-800:])
            rk = eventually(lambda: (lambda k: k if k.get("index_state") == "degraded" else None)
                            (rank(cold)), 10) or rank(cold)
            check("a cold router after a lost history says degraded (never exact)",
                  rk.get("index_state") == "degraded" and rk.get("gaps_lost", 0) >= 1, rk)
            check("the cold router lacks the old prompts", blocks(cold, before[0]) == 0,
                  blocks(cold, before[0]))
        finally:
            cold.stop()
            warm.stop()
    finally:
        m.stop()
    return ev, rp, state


def scenario_engine_restarted(tmp):
    """The engine restarted while the router was down: the saved cursor names a batch the new
    process never sent, so the reloaded state is dropped, and the router rebuilds from the
    new engine's own events."""
    (ev, rp), m = with_free_ports(start_mocker, 1, 1)
    state = os.path.join(tmp, "restarted.state")
    r = start_router(ev, rp, state)
    try:
        check("router subscribed", subscribed(m))
        old = serve_prompts(m, 6)
        check("router exact", eventually(lambda: exact_at(r, m) and all_cached(r, old) is True,
                                         10), rank(r))
    finally:
        r.stop()
        m.stop()
    m = start_mocker(ev, rp)  # a new process on the same ports: numbering starts over
    try:
        new = serve_prompts(m, 2)
        r = start_router(ev, rp, state, what="router after the engine's restart")
        try:
            check("router subscribed to the new engine", subscribed(m))
            check("resume refused by the engine's replay",
                  eventually(lambda: r.metric("kvr_kv_resumes_failed_total") == 1, 10),
                  r.metric("kvr_kv_resumes_failed_total"))
            check("the old engine's blocks are gone", eventually(
                lambda: blocks(r, old[0]) == 0, 5), blocks(r, old[0]))
            newer = serve_prompts(m, 1)  # a live batch: the router replays the new history
            check("exact from the new engine's history",
                  eventually(lambda: exact_at(r, m), 10), rank(r))
            check("the new engine's prompts are there",
                  eventually(lambda: all_cached(r, new + newer) is True, 10),
                  all_cached(r, new + newer))
            check("the failed resume is logged", "not resumed" in r.stderr(), r.stderr()[-800:])
        finally:
            r.stop()
    finally:
        m.stop()


def scenario_bad_files(tmp, ev, rp):
    """A damaged file and one saved with another block size are refused whole, named in the
    log, and the router starts cold (the engine is gone: nothing to confirm anyway)."""
    good = os.path.join(tmp, "router.state")
    data = open(good, "rb").read()
    cases = {
        "truncated": data[: len(data) // 2],
        "bit flip": data[:40] + bytes([data[40] ^ 1]) + data[41:],
        "not a state file": b"hello, world\n" * 10,
    }
    for name, raw in cases.items():
        path = os.path.join(tmp, name.replace(" ", "_"))
        with open(path, "wb") as f:
            f.write(raw)
        r = start_router(ev, rp, path, what=f"router with a {name} state file")
        try:
            check(f"{name}: nothing reloaded", r.metric("kvr_index_pairs") == 0,
                  r.metric("kvr_index_pairs"))
        finally:
            r.stop()
        err = r.stderr()
        check(f"{name}: the log names the problem and starts cold",
              "starting cold" in err and ("checksum" in err or "magic" in err
                                          or "shorter" in err), err[-600:])
    r = start_router(ev, rp, good, bs=8, what="router with another block size")
    try:
        check("block size mismatch: nothing reloaded", r.metric("kvr_index_pairs") == 0)
    finally:
        r.stop()
    check("block size mismatch named", "block size 4, the router uses 8" in r.stderr(),
          r.stderr()[-600:])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        ev, rp, _ = scenario_resume(tmp)
        scenario_engine_restarted(tmp)
        scenario_bad_files(tmp, ev, rp)
    finish()


if __name__ == "__main__":
    main()
