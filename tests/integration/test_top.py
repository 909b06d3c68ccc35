#!/usr/bin/python3
"""`kvrouter top`, the operator's terminal view, run for real: the real binaries (two
`kvrouter mocker`s with KV events behind a `kvrouter serve`, all on free loopback ports) and
`kvrouter top` in a real terminal, a detached tmux session on a socket of its own
(`tmux -S <a temporary folder>/tmux.sock new-session -d -x 160 -y 48`), whose screen is read
with `capture-pane -p`.
A wrapper shell around top records its exit status and whether the terminal's modes (`stty -g`)
are as they were, then keeps the pane open, so what the screen shows after top is checked too.
  - fleet: both workers' rows show the figures /v1/workers gives (state, role, model, blocks
    indexed after some completions, KV capacity); decisions/s shown non-zero during a short
    load; after a mocker is killed, its row says unreachable or fenced within 2 s of
    /v1/workers saying so; a narrower window (SIGWINCH) is redrawn to its width; `q` quits with
    status 0, the alternate screen left, the cursor shown and the terminal's modes restored;
    `--once` prints the table as plain text (no escapes) and exits 0;
  - key: a router with --api-key-file (a 0600 file): without --key-file top shows the 401 and
    that it retries, with it the rows; also on the admin listener; Ctrl-C quits as q does;
  - errors: --once with nothing listening exits non-zero naming the URL; bad flags are named.
Skipped (saying so, exit 0) when /usr/bin/tmux is not installed. Every wait polls the screen or
the router under a bound; everything started is stopped, the tmux server killed, also on failure.
Usage: test_top.py <path to kvrouter>.
"""
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from kvr_harness import (SANITIZER_RE, Child, check, eventually, free_ports, read_line,
                         run_scenarios, with_free_ports)

KVR = os.path.abspath(sys.argv[1])
TMUX = "/usr/bin/tmux"
BS = 16
SEED = int(os.environ.get("KVR_TEST_SEED", random.randrange(1 << 30)))
RNG = random.Random(SEED)
GONE = ("unreachable", "fenced")


class Tmux:
    """A tmux server of our own (its own socket, no configuration file) and a folder for the
    wrappers' files. Each `top` runs in a session named after it."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kvtop-")
        self.sock = os.path.join(self.dir, "tmux.sock")  # removed with the folder

    def run(self, *args):
        env = dict(os.environ, TERM=os.environ.get("TERM") or "xterm")
        env.pop("TMUX", None)  # run from inside tmux: still a server of our own
        return subprocess.run([TMUX, "-S", self.sock, "-f", "/dev/null"] + list(args),
                              capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL, env=env)

    def start(self, name, args, width=160, height=48):
        """`kvrouter top ARGS` in session `name`; its stderr goes to NAME.err, its exit status
        to NAME.rc, whether `stty -g` is the same after it to NAME.tty."""
        script = os.path.join(self.dir, f"{name}.sh")
        base = os.path.join(self.dir, name)
        with open(script, "w") as f:
            f.write("trap ':' INT\n"  # Ctrl-C is top's: the wrapper waits for it, then records
                    'before=$(stty -g)\n'
                    '"$@" 2> "$KVTOP_BASE.err"\n'
                    'rc=$?\n'
                    'after=$(stty -g)\n'
                    'if [ "$before" = "$after" ]; then echo same; else echo changed; fi'
                    ' > "$KVTOP_BASE.tty"\n'
                    'echo "top exited $rc"\n'
                    'echo $rc > "$KVTOP_BASE.part"\n'
                    'mv "$KVTOP_BASE.part" "$KVTOP_BASE.rc"\n'
                    'exec sleep 600\n')
        cmd = " ".join(shlex.quote(a) for a in ["env", f"KVTOP_BASE={base}", "sh", script, KVR,
                                              "top"] + [str(a) for a in args])
        p = self.run("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height), cmd)
        assert p.returncode == 0, ("tmux new-session", p.returncode, p.stderr)

    def screen(self, name):
        p = self.run("capture-pane", "-p", "-t", name)
        return p.stdout if p.returncode == 0 else ""

    def fmt(self, name, f):
        return self.run("display-message", "-p", "-t", name, f).stdout.strip()

    def keys(self, name, *keys):
        self.run("send-keys", "-t", name, *keys)

    def resize(self, name, width, height):
        self.run("resize-window", "-t", name, "-x", str(width), "-y", str(height))

    def result(self, name, what):
        """The content of NAME.what ("rc", "tty", "err"), or None while it is not written."""
        try:
            with open(os.path.join(self.dir, f"{name}.{what}")) as f:
                return f.read().strip()
        except OSError:
            return None

    def close(self):
        self.run("kill-server")
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- reading the screen ----------------------------------------------------------------------

def table(screen):
    """{(worker, dp): {column head: cell}} of the fleet table on a screen (columns are two or
    more spaces apart; no cell holds two spaces in a row)."""
    lines = screen.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("worker  "):
            continue
        head = re.split(r"\s{2,}", line.strip())
        rows = {}
        for row in lines[i + 1:]:
            if not row.strip():
                break
            cells = re.split(r"\s{2,}", row.strip())
            if len(cells) == len(head):
                rows[(cells[0], cells[head.index("dp")] if "dp" in head else "0")] = \
                    dict(zip(head, cells))
        return rows
    return {}


def decisions(screen):
    m = re.search(r"decisions (\S+)/s", screen)
    try:
        return float(m.group(1)) if m else None
    except ValueError:
        return None


def api_ranks(r, headers=None):
    """{(worker, dp): (worker JSON, rank JSON)} from the router's /v1/workers."""
    st, body = r.call("GET", "/v1/workers", headers=headers)
    if st != 200:
        return {}
    return {(str(w["worker_id"]), str(k["dp_rank"])): (w, k)
            for w in body["workers"] for k in w["ranks"]}


def row_matches(row, w, k):
    """Whether a screen row shows what /v1/workers says of the rank."""
    cap = w.get("total_kv_blocks") or "-"
    return (row.get("state") == k.get("state") and row.get("role") == w["role"] and
            row.get("model") == (w["model"] or "-") and
            row.get("indexed blk") == str(k["index_blocks"]) and
            row.get("active req") == str(k["active_requests"]) and
            row.get("decode blk/cap (%)", "").startswith(f"{k['active_blocks']}/{cap}"))


def shows_fleet(tm, name, r):
    """The screen's rows agree with a /v1/workers answer taken just after (None if not)."""
    rows = table(tm.screen(name))
    api = api_ranks(r)
    ok = api and all(key in rows and row_matches(rows[key], w, k) for key, (w, k) in api.items())
    return (rows, api) if ok else None


# ---- the processes ---------------------------------------------------------------------------

def mocker(name):
    def start(ev):
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}"}
        return Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "m",
                      "--block-size", str(BS), "--num-gpu-blocks", "4096", "--speedup", "20",
                      "--kv-events-config", json.dumps(cfg)], f"mocker {name}")
    (ev,), m = with_free_ports(start, 1)
    m.spec = f"url={m.url},events=tcp://127.0.0.1:{ev},model=m"
    return m


def serve(*workers, extra=()):
    args = [KVR, "serve", "--http-port", "0", "--block-size", str(BS), "--log-level", "warn"]
    for i, m in enumerate(workers):
        args += ["--worker", f"id={i + 1},{m.spec}"]
    return Child(args + [str(x) for x in extra], "router")


def subscribed(*ms):
    return all(eventually(lambda: (m.metric("kvr_mocker_kv_event_subscribers") or 0) >= 1,
                          timeout=15) for m in ms)


def complete(r, n_tokens, headers=None):
    toks = [RNG.randrange(1, 30000) for _ in range(n_tokens)]
    st, _ = r.call("POST", "/v1/completions", {"model": "m", "prompt": toks, "max_tokens": 2},
                   headers=headers, timeout=30)
    return st


def once(*args):
    p = subprocess.run([KVR, "top"] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    m = SANITIZER_RE.search(p.stderr)
    check(f"top {' '.join(map(str, args))[:60]}: no sanitizer report", m is None, p.stderr[-2000:])
    return p


def quits(tm, name, keys, what):
    """Sends keys to top in session name; checks it exits 0 and gives the terminal back."""
    tm.keys(name, *keys)
    rc = eventually(lambda: tm.result(name, "rc"), timeout=10)
    check(f"{what}: top exits with status 0", rc == "0", (rc, tm.result(name, "err")))
    check(f"{what}: the terminal's modes are restored (stty -g as before)",
          tm.result(name, "tty") == "same", tm.result(name, "tty"))
    restored = eventually(lambda: tm.fmt(name, "#{alternate_on} #{cursor_flag}") == "0 1",
                          timeout=5)
    check(f"{what}: the alternate screen is left and the cursor shown", restored,
          tm.fmt(name, "#{alternate_on} #{cursor_flag}"))
    scr = eventually(lambda: (lambda s: s if "top exited 0" in s else None)(tm.screen(name)),
                     timeout=5)
    check(f"{what}: the shell's screen is back (top's frame gone, the wrapper's line shown)",
          scr and "worker  " not in scr, tm.screen(name))
    err = tm.result(name, "err") or ""
    check(f"{what}: top wrote nothing on stderr", err == "", err[-2000:])


# ---- scenarios -------------------------------------------------------------------------------

def scenario_fleet():
    a, b = mocker("a"), mocker("b")
    r = serve(a, b)
    tm = Tmux()
    try:
        check("fleet: the router subscribed to both engines", subscribed(a, b))
        for i in range(6):  # three on each worker
            check("fleet: a completion through the router",
                  complete(r, 8 * BS + 3, {"x-worker-instance-id": str(1 + i % 2)}) == 200)
        check("fleet: /v1/workers shows blocks indexed on both",
              eventually(lambda: all(k["index_blocks"] > 0 for _, k in api_ranks(r).values()),
                         timeout=15), api_ranks(r))
        tm.start("top", ["--url", r.url])
        check("fleet: top switches to the alternate screen",
              eventually(lambda: tm.fmt("top", "#{alternate_on}") == "1", timeout=10))
        got = eventually(lambda: shows_fleet(tm, "top", r), timeout=15)
        check("fleet: both workers' rows show what /v1/workers says (state, role, model, blocks "
              "indexed, active, capacity)", got and len(got[0]) == 2, tm.screen("top"))
        scr = tm.screen("top")
        check("fleet: the header names the router, its mode, policy and version",
              r.url in scr and "mode kv" in scr and "policy locality" in scr and
              re.search(r"version \d+\.\d+\.\d+", scr) is not None, scr)
        check("fleet: units in the table's headers",
              all(h in scr for h in ("active req", "prefill tok", "decode blk/cap (%)",
                                     "indexed blk", "hit pred/rep", "step ms")), scr)
        check("fleet: a rank's hit ratios show once it has answered", got and all(
            re.fullmatch(r"\d\.\d\d/\d\.\d\d", row["hit pred/rep"]) for row in got[0].values()),
            got and got[0])

        p = once("--url", r.url, "--once")
        rows = table(p.stdout)
        check("fleet: --once prints the table as plain text and exits 0",
              p.returncode == 0 and "\x1b" not in p.stdout and len(rows) == 2 and
              all(row["state"] == "exact" for row in rows.values()), (p.returncode, p.stdout,
                                                                       p.stderr))

        stop = threading.Event()

        def load():
            while not stop.is_set():
                complete(r, 2 * BS + 1)
        t = threading.Thread(target=load)
        t.start()
        try:
            busy = eventually(lambda: (decisions(tm.screen("top")) or 0) > 0, timeout=10)
            check("fleet: decisions/s shown non-zero during a short load", busy,
                  tm.screen("top"))
        finally:
            stop.set()
            t.join(timeout=60)

        tm.resize("top", 90, 30)

        def narrow():
            # tmux cuts the old frame's lines at 90 columns; top's own fit in 89 (the last
            # column is left empty), with the least needed columns dropped, not cut
            scr = tm.screen("top")
            rows = table(scr)
            return (scr if all(len(x) < 90 for x in scr.splitlines()) and len(rows) == 2 and
                    "step ms" not in scr and "hit pred/rep" in scr and
                    all(row["state"] == "exact" for row in rows.values()) else None)
        check("fleet: a narrower window is redrawn to its width (columns dropped, the state "
              "kept)", eventually(narrow, timeout=10), tm.screen("top"))
        tm.resize("top", 160, 48)

        b.kill()
        said = eventually(lambda: api_ranks(r).get(("2", "0"), ({}, {}))[1].get("state") in GONE,
                          timeout=30)
        t_api = time.monotonic()
        check("fleet: /v1/workers says the killed worker is unreachable or fenced", said,
              api_ranks(r))
        state = api_ranks(r)[("2", "0")][1]["state"]

        def shown():
            return table(tm.screen("top")).get(("2", "0"), {}).get("state") in GONE
        seen = eventually(shown, timeout=10)
        lag = time.monotonic() - t_api
        check(f"fleet: top's row says {state} within 2 s of /v1/workers ({lag:.2f} s)",
              seen and lag <= 2.0, tm.screen("top"))
        check("fleet: the other worker is still exact",
              table(tm.screen("top")).get(("1", "0"), {}).get("state") == "exact",
              tm.screen("top"))

        quits(tm, "top", ["q"], "fleet: q")
    finally:
        tm.close()
        for c in (r, a, b):
            c.stop()  # b was killed: nothing to check of it


def key_file(token):
    fd, path = tempfile.mkstemp(suffix=".key")  # 0600
    os.write(fd, (token + "\n").encode())
    os.close(fd)
    return path


def scenario_key():
    a = mocker("a")
    token = f"kvtop-{RNG.randrange(1 << 60):x}"
    key = key_file(token)
    r = serve(a, extra=["--api-key-file", key, "--admin-port", "0"])
    line = read_line(r.proc)
    admin = "http://" + line.split()[-1] if line.startswith("admin listening ") else None
    auth = {"Authorization": f"Bearer {token}"}
    tm = Tmux()
    try:
        check("key: the admin listener is announced", admin is not None, line)
        check("key: the router subscribed to the engine", subscribed(a))
        check("key: a completion with the key", complete(r, 4 * BS, auth) == 200)
        st, _ = r.call("GET", "/v1/workers")
        check("key: /v1/workers needs the key", st == 401, st)

        tm.start("nokey", ["--url", r.url])
        scr = eventually(lambda: (lambda s: s if "answered 401" in s else None)(
            tm.screen("nokey")), timeout=10)
        check("key: without --key-file top shows the 401, that it retries and what to give",
              scr and "retrying" in scr and "--key-file" in scr and r.url in scr,
              tm.screen("nokey"))
        check("key: ... and no rows", scr and not table(scr), scr)

        tm.start("withkey", ["--url", r.url, "--key-file", key])
        rows = eventually(lambda: table(tm.screen("withkey")), timeout=10)
        check("key: with --key-file the rows show",
              rows and rows.get(("1", "0"), {}).get("state") == "exact" and
              "answered 401" not in tm.screen("withkey"), tm.screen("withkey"))

        quits(tm, "nokey", ["C-c"], "key: Ctrl-C")
        quits(tm, "withkey", ["q"], "key: q")

        p = once("--url", admin, "--key-file", key, "--once")
        check("key: --once on the admin listener with the key shows the row",
              p.returncode == 0 and ("1", "0") in table(p.stdout), (p.returncode, p.stdout,
                                                                     p.stderr))
        p = once("--url", r.url, "--once")
        check("key: --once without the key exits 1 naming the 401 and the URL",
              p.returncode == 1 and "401" in p.stderr and r.url in p.stderr, (p.returncode,
                                                                              p.stderr))
    finally:
        tm.close()
        r.stop()
        a.stop()
        os.unlink(key)


def scenario_errors():
    port = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    p = once("--url", url, "--once")
    check("errors: --once with nothing listening exits non-zero naming the URL",
          p.returncode != 0 and url in p.stderr and "unreachable" in p.stderr and p.stdout == "",
          (p.returncode, p.stdout, p.stderr))
    for args, want in ((["--once"], "--url is required"),
                       (["--url", url, "--interval-ms", "5"], "--interval-ms 5"),
                       (["--url", url, "--interval-ms", "lots"], "--interval-ms lots"),
                       (["--url", "ftp://x", "--once"], "--url"),
                       (["--url", url, "--key-file", "/nonexistent/key", "--once"],
                        "--key-file"),
                       (["--url", url, "--onse"], "did you mean --once?"),
                       (["--url", url, "--once=yes"], "--once")):
        p = once(*args)
        check(f"errors: top {' '.join(args)}: exit 2 naming the flag",
              p.returncode == 2 and want in p.stderr, (p.returncode, p.stderr))
    p = once("--help")
    check("errors: --help prints the usage and exits 0",
          p.returncode == 0 and "--key-file" in p.stdout and "--interval-ms" in p.stdout, p)
    p = subprocess.run([KVR, "top", "--url", url], capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    check("errors: the live view refuses an output that is not a terminal, pointing at --once",
          p.returncode == 2 and "--once" in p.stderr, (p.returncode, p.stderr))


if __name__ == "__main__":
    if not os.access(TMUX, os.X_OK):
        print(f"SKIP test_top: {TMUX} is not installed (Debian's tmux package)", flush=True)
        raise SystemExit(0)
    print(f"test_top: seed {SEED}", flush=True)
    run_scenarios([("fleet", scenario_fleet), ("key", scenario_key),
                   ("errors", scenario_errors)], SEED)
