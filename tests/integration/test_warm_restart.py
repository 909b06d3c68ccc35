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
router starts cold.

The file itself (src/events/state_file.h): a stop before the engine confirmed the reloaded ranks
(an engine outage during a rolling restart) keeps them in the file, byte for byte, and a later
start with the engine back resumes them; a path that is not a regular file (FIFO, directory,
socket, symbolic link) and a second router on the same path stop the start at once with a
message naming state_file; a symbolic link planted where the temporary file used to go, or
swapped in at the path while the router runs, never gets its target written.
Usage: test_warm_restart.py <path to kvrouter>.
"""
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile

from kvr_harness import (SANITIZER_RE, Child, check, eventually, finish, read_line,
                         with_free_ports)

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


def router_args(ev, rp, state=None, bs=BS):
    args = [KVR, "serve", "--http-port", "0", "--block-size", bs, "--log-level", "info",
            "--worker", f"id=1,events=tcp://127.0.0.1:{ev},replay=tcp://127.0.0.1:{rp}"]
    if state:
        args += ["--state-file", state]
    return args


def start_router(ev, rp, state=None, bs=BS, what="router"):
    return Child(router_args(ev, rp, state, bs), what)


def start_refused(args, bound=10.0):
    """Runs a router that must refuse to start: (exit status, stderr), the status None when
    it started anyway (printed `listening`) or had not exited within the bound (then it is
    killed: a hang fails the check, it never blocks the test)."""
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE, stderr=err,
                             stdin=subprocess.DEVNULL)
        started = read_line(p, bound).startswith("listening")
        try:
            rc = None if started else p.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            rc = None
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        err.seek(0)
        text = err.read().decode(errors="replace")
    return rc, ("(it started) " if started else "") + text


def check_refused(name, args, *needles):
    rc, err = start_refused(args)
    check(f"{name}: refused at start (exit non-zero, no hang)", rc is not None and rc != 0,
          (rc, err[-800:]))
    check(f"{name}: the message names it", all(n in err for n in needles),
          (needles, err[-800:]))
    check(f"{name}: no crash", SANITIZER_RE.search(err) is None and (rc is None or rc > 0),
          (rc, err[-800:]))


def same_state(a, b):
    """Two state files hold the same ranks (cursors included) and events: only the save time
    (bytes 16..24) and the checksum (the last 8 bytes) may differ."""
    return len(a) == len(b) and a[:16] == b[:16] and a[24:-8] == b[24:-8]


def n_ranks(data):
    return struct.unpack_from("<I", data, 24)[0] if len(data) >= 28 else None


def read(path):
    with open(path, "rb") as f:
        return f.read()


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
        check("a rank its engine refused is not kept as loaded (its new state is saved)",
              "1 exact ranks saved" in r.stderr() and "0 ranks kept as loaded" in r.stderr()
              and "1 dropped (their engine refused them)" in r.stderr(), r.stderr()[-800:])
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


def scenario_stop_before_confirmation(tmp):
    """An engine outage during a rolling restart: the router reloads the file, but the engine
    (paused: alive, silent) cannot confirm the ranks. Stopped before the confirmation, or after
    the resume ran out of time, the router keeps those ranks in the file byte for byte (the
    engine, not the router, decides at a later start); with the engine back, the next start
    resumes them and is exact with every prompt. Stopped while its engine is down (the
    connection lost), the router saves the rank too: its state is whole up to its cursor."""
    (ev, rp), m = with_free_ports(start_mocker, 1, 1)
    state = os.path.join(tmp, "outage.state")
    paused = False
    try:
        r = start_router(ev, rp, state)
        try:
            check("router subscribed", subscribed(m))
            prompts = serve_prompts(m, 8)
            check("router exact with every prompt", eventually(
                lambda: exact_at(r, m) and all_cached(r, prompts) is True, 10), rank(r))
        finally:
            r.stop()
        saved = read(state)
        check("the file holds the rank", n_ranks(saved) == 1 and len(saved) > 1000,
              (n_ranks(saved), len(saved)))

        os.kill(m.proc.pid, signal.SIGSTOP)  # the outage: connections open, nothing answers
        paused = True
        r = start_router(ev, rp, state, what="router stopped before the confirmation")
        check("reloaded", "1 ranks resumed" in r.stderr(), r.stderr()[-800:])
        check("its loop runs (it answers) before it is stopped",
              r.call("GET", "/health")[0] == 200)
        r.stop()
        check("stopped before the confirmation: the file still holds the rank, byte for byte",
              same_state(read(state), saved), (n_ranks(read(state)), len(read(state)), len(saved)))
        check("the kept rank is logged", "1 ranks kept as loaded" in r.stderr(),
              r.stderr()[-800:])

        r = start_router(ev, rp, state, what="router whose resume ran out of time")
        try:
            check("the resume fails: no answer in time", eventually(
                lambda: r.metric("kvr_kv_resumes_failed_total") == 1, 15),
                r.metric("kvr_kv_resumes_failed_total"))
        finally:
            r.stop()
        check("after a resume that ran out of time: the file still holds the rank",
              same_state(read(state), saved), (n_ranks(read(state)), len(read(state)), len(saved)))
        check("why it is kept is logged", "did not confirm the saved state in time" in r.stderr()
              and "1 ranks kept as loaded" in r.stderr(), r.stderr()[-1200:])

        os.kill(m.proc.pid, signal.SIGCONT)  # the engine is back: the same process
        paused = False
        r = start_router(ev, rp, state, what="router after the outage")
        try:
            more = serve_prompts(m, 1)
            check("the kept rank is confirmed by its engine", eventually(
                lambda: r.metric("kvr_kv_resumes_total") == 1, 10),
                (r.metric("kvr_kv_resumes_total"), r.metric("kvr_kv_resumes_failed_total")))
            check("exact again with the prompts from before the outage and after it",
                  eventually(lambda: exact_at(r, m) and all_cached(r, prompts + more) is True,
                             10), (rank(r), all_cached(r, prompts + more)))
            before = rank(r)
            m.kill()  # an outage while the router runs: the connection is lost
            check("the rank shows its engine unreachable", eventually(
                lambda: rank(r).get("index_state") == "unreachable", 10), rank(r))
        finally:
            r.stop()
        kept = read(state)
        check("stopped while its engine is unreachable: the rank and its blocks are saved",
              n_ranks(kept) == 1 and len(kept) > len(saved) and
              struct.unpack_from("<Q", kept, 48)[0] == before.get("last_seq"),
              (n_ranks(kept), len(kept), len(saved), before.get("last_seq")))
        check("saved as unreachable (logged)", "1 of them with their engine unreachable"
              in r.stderr(), r.stderr()[-800:])
    finally:
        if paused:
            os.kill(m.proc.pid, signal.SIGCONT)
        m.stop()


def scenario_refused_paths(tmp, ev, rp):
    """A path that is not a regular file stops the start at once, with a message naming
    state_file, the path and what it is: a FIFO (it used to block the start forever), a
    directory, a socket, a symbolic link (to a file, or dangling), a link at the lock file.
    No link target is touched."""
    fifo = os.path.join(tmp, "fifo.state")
    os.mkfifo(fifo)
    check_refused("FIFO", router_args(ev, rp, fifo), "--state-file", fifo, "FIFO")
    d = os.path.join(tmp, "dir.state")
    os.mkdir(d)
    check_refused("directory", router_args(ev, rp, d), "--state-file", d, "directory")
    sock_path = os.path.join(tmp, "sock.state")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(sock_path)
    try:
        check_refused("socket", router_args(ev, rp, sock_path), "--state-file", sock_path,
                      "socket")
    finally:
        sock.close()
    victim = os.path.join(tmp, "victim")
    with open(victim, "wb") as f:
        f.write(b"precious\n")
    link = os.path.join(tmp, "link.state")
    os.symlink(victim, link)
    check_refused("symbolic link", router_args(ev, rp, link), "--state-file", link,
                  "symbolic link")
    dangling = os.path.join(tmp, "dangling.state")
    os.symlink(os.path.join(tmp, "nowhere"), dangling)
    check_refused("dangling symbolic link", router_args(ev, rp, dangling), "--state-file",
                  dangling, "symbolic link")
    check("nothing created through the dangling link", not os.path.lexists(
        os.path.join(tmp, "nowhere")))
    locked = os.path.join(tmp, "locklink.state")
    os.symlink(victim, locked + ".lock")
    check_refused("symbolic link at the lock file", router_args(ev, rp, locked), "--state-file",
                  locked + ".lock", "symbolic link")
    check("no link target written", read(victim) == b"precious\n", read(victim))


def scenario_symlinked_temp(tmp, ev, rp):
    """Links planted where the temporary file used to go (PATH.tmp), and swapped in at the
    path itself while the router runs: the save writes a new file of its own and renames it
    over the path; neither target is written. A temporary file an interrupted save left is
    removed at the next start."""
    state = os.path.join(tmp, "planted.state")
    victim, victim2 = os.path.join(tmp, "victim1"), os.path.join(tmp, "victim2")
    for v in (victim, victim2):
        with open(v, "wb") as f:
            f.write(b"precious\n")
    os.symlink(victim, state + ".tmp")
    leftover = state + ".tmp.AAAAAAAAAAAA"
    with open(leftover, "wb") as f:
        f.write(b"half a save")
    r = start_router(ev, rp, state, what="router with links planted")
    check("the leftover temporary file is removed at start", not os.path.exists(leftover))
    os.symlink(victim2, state)  # swapped in while it runs
    r.stop()
    check("the target of the link at PATH.tmp is untouched", read(victim) == b"precious\n",
          read(victim)[:40])
    check("the target of the link at PATH is untouched", read(victim2) == b"precious\n",
          read(victim2)[:40])
    check("PATH is now the saved file (the link replaced, not followed)",
          not os.path.islink(state) and read(state)[:8] == b"KVRSNAP1",
          (os.path.islink(state), read(state)[:8]))
    check("the planted link itself is left alone", os.path.islink(state + ".tmp"))
    left = [n for n in os.listdir(tmp) if n.startswith("planted.state.tmp.")]
    check("no temporary file left behind", left == [], left)


def scenario_two_routers(tmp, ev, rp):
    """Two routers on one path (the second used to start, and the two saves raced to a
    corrupt file): the second is refused at start naming state_file and the holder's pid; the
    lock dies with its holder, even killed."""
    state = os.path.join(tmp, "shared.state")
    r = start_router(ev, rp, state, what="first router")
    try:
        check_refused("second router on the same state file", router_args(ev, rp, state),
                      "--state-file", state, "in use", f"pid {r.proc.pid}")
    finally:
        r.kill()  # a crash: the kernel drops the lock
    r = start_router(ev, rp, state, what="router after the holder was killed")
    r.stop()
    check("it saved a whole file", read(state)[:8] == b"KVRSNAP1")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        ev, rp, _ = scenario_resume(tmp)
        scenario_engine_restarted(tmp)
        scenario_bad_files(tmp, ev, rp)
        scenario_stop_before_confirmation(tmp)
        scenario_refused_paths(tmp, ev, rp)
        scenario_symlinked_temp(tmp, ev, rp)
        scenario_two_routers(tmp, ev, rp)
    finish()


if __name__ == "__main__":
    main()
