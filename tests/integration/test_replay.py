#!/usr/bin/python3
"""`kvrouter replay` from the outside: a trace slice replayed open loop against real endpoints.

It starts `kvrouter mocker` on loopback (--port 0) and replays tests/data/trace_slice.jsonl
(120 rows of data/traces/conversation_trace.jsonl with prompts up to 8K tokens, unchanged) at
a high speedup, then checks the report: exit status, the --json keys shared with `kvrouter sim`,
the request count, a hit ratio above zero and at most the trace's infinite-cache ceiling, the
per-request samples file, the table, and --plot (a PNG from gnuplot when it is installed, a
clear error naming gnuplot when it is not). A fake OpenAI server written here (http.server)
makes the failures a run must classify: a 503, a stream without [DONE], a chunk that is not
JSON, an error event, a response slower than --timeout. Also: a bad trace line (named), a dead
URL, usage errors, SIGINT (partial report, exit 130). `kvrouter demo`: the comparison, no
process left behind, and its kv router getting the mockers' KV events (a repeated prompt hits
the ceiling on one worker); `kvrouter demo --disagg`: the automatic split and its estimates, the
trade-off sentence with the table's figures, neither pool crowding one worker, and --disagg's
usage errors. Every kvrouter child must be free of sanitizer reports. Usage: test_replay.py <path to kvrouter>.
"""
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from kvr_harness import RESULTS as results, SANITIZER_RE, check, eventually, read_line, terminate

KVR = sys.argv[1]
DATA = os.environ.get("KVR_TEST_DATA") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "..", "data")
SLICE = os.path.join(DATA, "trace_slice.jsonl")
SHARED_KEYS = ["policy", "workers", "requests", "ttft_ms", "itl_ms", "e2e_ms", "hit_ratio",
               "ceiling_infinite", "ceiling_pooled", "max_worker_share"]
CHILDREN = []
TMP = tempfile.mkdtemp(prefix="kvr-test-replay-")


def no_sanitizer(what, stderr):
    m = SANITIZER_RE.search(stderr or "")
    check(f"{what}: no sanitizer report", m is None,
          (stderr or "")[max(0, (m.start() if m else 0) - 300):][:3000])


class Mocker:
    def __init__(self, *extra):
        self.err = tempfile.TemporaryFile()
        args = [KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--log-level", "warn"]
        args += list(extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.err,
                                     stdin=subprocess.DEVNULL)
        CHILDREN.append(self.proc)
        line = read_line(self.proc)
        if not line.startswith("listening "):
            self.proc.kill()
            raise RuntimeError(f"mocker did not start: {line!r}")
        self.url = "http://" + line.split()[1]

    def finished(self):
        """Requests the engine has finished (vllm:request_success)."""
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return 0
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success"))

    def stop(self):
        terminate(self.proc, "mocker")
        self.err.seek(0)
        err = self.err.read().decode(errors="replace")
        no_sanitizer("mocker", err)
        check("mocker exits 0 on SIGTERM", self.proc.returncode == 0, (self.proc.returncode, err[-1500:]))


def replay(*args, timeout=240, env=None):
    """Runs kvrouter replay; (returncode, stdout, stderr)."""
    p = subprocess.run([KVR, "replay", *args], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=timeout, env=env)
    no_sanitizer("replay " + " ".join(args[:4]), p.stderr)
    return p.returncode, p.stdout, p.stderr


def parse_json(name, out):
    try:
        return json.loads(out)
    except ValueError:
        check(f"{name}: stdout is one JSON object", False, out[:1500])
        return None


# ---- against a mocker -------------------------------------------------------------------------


def scenario_mocker():
    m = Mocker("--speedup", "50", "--block-size", "16", "--num-gpu-blocks", "16384")
    samples = os.path.join(TMP, "kv.tsv")
    try:
        rc, out, err = replay("--url", m.url, "--trace", SLICE, "--requests", "100", "--speedup",
                              "50", "--json", "--samples", samples, "--label", "kv", "--workers",
                              "1", "--num-gpu-blocks", "16384", "--block-size", "16")
        check("replay exits 0", rc == 0, (rc, err[-2000:]))
        j = parse_json("replay --json", out)
        if j is not None:
            check("json has the shared keys", all(k in j for k in SHARED_KEYS),
                  [k for k in SHARED_KEYS if k not in j])
            check("json: requests = 100", j.get("requests") == 100, j.get("requests"))
            check("json: ok = 100", j.get("ok") == 100, (j.get("ok"), j.get("errors")))
            check("json: policy = the label", j.get("policy") == "kv", j.get("policy"))
            check("json: workers = --workers", j.get("workers") == 1, j.get("workers"))
            for k in ("ttft_ms", "itl_ms", "e2e_ms"):
                p = j.get(k) or {}
                check(f"json: {k} has p50 <= p90 <= p99",
                      all(isinstance(p.get(q), (int, float)) for q in ("p50", "p90", "p99"))
                      and p["p50"] <= p["p90"] <= p["p99"], p)
            hr, ci, cp = j.get("hit_ratio"), j.get("ceiling_infinite"), j.get("ceiling_pooled")
            check("json: hit_ratio > 0", isinstance(hr, (int, float)) and hr > 0, hr)
            check("json: hit_ratio <= ceiling_infinite",
                  isinstance(ci, (int, float)) and hr is not None and hr <= ci + 1e-9, (hr, ci))
            check("json: ceiling_pooled <= ceiling_infinite",
                  isinstance(cp, (int, float)) and cp <= ci + 1e-9, (cp, ci))
            check("json: a single mocker is the busiest worker",
                  j.get("max_worker_share") == 1, j.get("max_worker_share"))
            check("json: model found on /v1/models", j.get("model") == "kvrouter-mocker",
                  j.get("model"))
        with open(samples) as f:
            lines = f.read().splitlines()
        check("samples: a header line", lines and lines[0].startswith("# arrival_s\tsent_s\tttft_ms"),
              lines[:1])
        rows = [l.split("\t") for l in lines[1:]]
        check("samples: 100 rows", len(rows) == 100, len(rows))
        check("samples: 10 columns, all ok", all(len(r) == 10 and r[9] == "ok" for r in rows),
              [r for r in rows if len(r) != 10 or r[9] != "ok"][:3])
        slice_rows = [json.loads(l) for l in open(SLICE)][:100]
        check("samples: prompt_tokens = the trace's input_length",
              all(int(r[5]) == s["input_length"] for r, s in zip(rows, slice_rows)),
              [(r[5], s["input_length"]) for r, s in zip(rows, slice_rows)][:3])
        check("samples: output_tokens = the trace's output_length",
              all(int(r[7]) == s["output_length"] for r, s in zip(rows, slice_rows)))
        check("samples: arrival = timestamp / speedup",
              all(abs(float(r[0]) - (s["timestamp"] - slice_rows[0]["timestamp"]) / 1000 / 50) < 1e-3
                  for r, s in zip(rows, slice_rows)))

        # the table, and the plot
        png = os.path.join(TMP, "ttft.png")
        args = ["--url", m.url, "--trace", SLICE, "--requests", "30", "--speedup", "100",
                "--label", "again", "--plot", png, "--compare", f"kv={samples}"]
        if shutil.which("gnuplot"):
            rc, out, err = replay(*args)
            check("table run exits 0", rc == 0, (rc, err[-2000:]))
            check("table: latency rows", all(s in out for s in ("TTFT", "ITL", "E2E", "cache hits")),
                  out)
            check("table: the plot's path", png in out, out)
            with open(png, "rb") as f:
                head = f.read(8)
            check("--plot writes a PNG", head == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 1000,
                  (head, os.path.getsize(png)))
            svg = os.path.join(TMP, "only.svg")
            rc, out, err = replay("--plot", svg, "--compare", f"kv={samples}", "--compare",
                                  f"other={samples}")
            check("plot only (--compare, no --url) writes an SVG",
                  rc == 0 and os.path.getsize(svg) > 1000 and b"<svg" in open(svg, "rb").read(400),
                  (rc, err))
        else:
            print("note: gnuplot not installed; the PNG checks are skipped", flush=True)
        env = dict(os.environ, PATH=TMP)  # no gnuplot there
        rc, out, err = replay(*args, env=env)
        check("--plot without gnuplot: a clear error", rc == 1 and "gnuplot" in err
              and "not installed" in err, (rc, err))
        rc, out, err = replay("--plot", os.path.join(TMP, "x.png"), "--compare",
                              f"kv={SLICE}")
        check("--compare with a file that is not a samples file", rc == 1 and
              "not a samples file" in err, (rc, err))
    finally:
        m.stop()


# ---- failures ---------------------------------------------------------------------------------


class Fake(http.server.BaseHTTPRequestHandler):
    """/v1/models, and /v1/completions misbehaving by the request's number."""
    protocol_version = "HTTP/1.1"
    lengths = [json.loads(l)["input_length"] for l in open(SLICE)][:20]

    def log_message(self, *a):
        pass

    def send_body(self, status, ctype, body, close=False):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self.send_body(200, "application/json",
                           json.dumps({"object": "list", "data": [{"id": "fake-model"}]}).encode())
        else:
            self.send_body(404, "application/json", b'{"error":{"message":"no"}}')

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        req = json.loads(body)
        # the row's number, from its prompt length (unique among the first 20 rows), so the
        # behaviour does not depend on the order in which concurrent requests arrive
        n = Fake.lengths.index(len(req.get("prompt", []))) if len(req.get("prompt", [])) in Fake.lengths else -1
        ok = (req.get("stream") is True and req.get("model") == "fake-model"
              and req.get("stream_options", {}).get("include_usage") is True
              and "worker_id" in req.get("nvext", {}).get("extra_fields", [])
              and isinstance(req.get("prompt"), list) and req.get("max_tokens", 0) >= 1)
        if not ok or n < 0:
            self.send_body(400, "application/json", b'{"error":{"message":"bad request shape"}}')
            return
        chunk = lambda text: ("data: " + json.dumps({"object": "text_completion", "choices": [
            {"index": 0, "text": text, "finish_reason": None}],
            "nvext": {"worker_id": {"prefill_worker_id": 7 + n // 10, "decode_worker_id": 7 + n // 10}}})
            + "\n\n")
        usage = ("data: " + json.dumps({"choices": [], "usage": {
            "prompt_tokens": len(req["prompt"]), "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 16}}}) + "\n\n")
        kind = n % 10
        if kind == 0:
            self.send_body(503, "application/json",
                           b'{"error":{"message":"overloaded","type":"ServiceUnavailableError","code":503}}')
            return
        if kind == 1:
            sse = chunk(" a") + usage  # no [DONE]
        elif kind == 2:
            sse = chunk(" a") + "data: {not json\n\n" + "data: [DONE]\n\n"
        elif kind == 3:
            sse = chunk(" a") + 'data: {"error":{"message":"engine died","code":500}}\n\n' + "data: [DONE]\n\n"
        elif kind == 4:
            time.sleep(1.5)  # beyond --timeout 0.5
            sse = chunk(" a") + usage + "data: [DONE]\n\n"
        else:
            # a good stream, split oddly: CRLF line ends, a comment, "data:" without a space
            sse = (": keep-alive\r\n\r\n" + chunk(" a").replace("\n", "\r\n") + chunk(" b")
                   + "data:" + usage[len("data: "):] + "data: [DONE]\n\n")
        self.send_body(200, "text/event-stream", sse.encode())


def scenario_failures():
    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 256  # the default backlog of 5 drops concurrent connects
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass  # the timed-out request's client is gone: a broken pipe is expected

    srv = Server(("127.0.0.1", 0), Fake)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    samples = os.path.join(TMP, "fake.tsv")
    try:
        rc, out, err = replay("--url", url, "--trace", SLICE, "--requests", "20", "--speedup",
                              "1000", "--json", "--timeout", "0.5", "--samples", samples)
        check("failures > 1%: exit 1", rc == 1, (rc, err[-1500:]))
        check("failures: stderr says how many failed", "failed" in err and "more than 1%" in err, err)
        j = parse_json("failures --json", out)
        if j is not None:
            e = j.get("errors", {})
            check("errors by kind", e == {"http-503": 2, "bad-stream": 4, "stream-error": 2,
                                          "timeout": 2}, e)
            check("failures: ok = 10", j.get("ok") == 10, j.get("ok"))
            check("failures: worker share from nvext.worker_id", j.get("max_worker_share") == 0.5,
                  j.get("max_worker_share"))
            check("failures: workers = distinct ids seen", j.get("workers") == 2, j.get("workers"))
            check("failures: hit ratio from usage", isinstance(j.get("hit_ratio"), float)
                  and 0 < j["hit_ratio"] < 0.05, j.get("hit_ratio"))
            check("failures: ITL measured between text events", j["itl_ms"]["p50"] is not None)
        rows = [l.split("\t") for l in open(samples).read().splitlines()[1:]]
        st = [r[9] for r in rows]
        check("samples: statuses by request", st[:6] == ["http-503", "bad-stream", "bad-stream",
                                                         "stream-error", "timeout", "ok"], st)
    finally:
        srv.shutdown()
        srv.server_close()


def scenario_bad_input():
    bad = os.path.join(TMP, "bad.jsonl")
    lines = open(SLICE).read().splitlines()[:5]
    lines[2] = '{"timestamp": 5, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]}'
    with open(bad, "w") as f:
        f.write("\n".join(lines) + "\n")
    rc, out, err = replay("--url", "http://127.0.0.1:9", "--trace", bad)
    check("bad trace line: exit 1", rc == 1, (rc, err))
    check("bad trace line: the error names the line and field", "line 3" in err and "hash_ids" in err, err)
    rc, out, err = replay("--url", "http://127.0.0.1:9", "--trace", os.path.join(TMP, "nope.jsonl"))
    check("missing trace: names it", rc == 1 and "nope.jsonl" in err, (rc, err))

    # a dead URL: a port nobody listens on
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t0 = time.monotonic()
    rc, out, err = replay("--url", f"http://127.0.0.1:{port}", "--trace", SLICE, "--requests", "5")
    check("dead URL: exit 1, quickly", rc == 1 and time.monotonic() - t0 < 10, (rc, err))
    check("dead URL: a clear error", f"127.0.0.1:{port}" in err and "not reachable" in err
          and "refused" in err, err)

    for args, what in ((["--trace", SLICE], "--url is required"),
                       (["--url", "ftp://x"], "--url"),
                       (["--url", "http://127.0.0.1:1", "--block-size", "24"], "must divide 512"),
                       (["--url", "http://127.0.0.1:1", "--speedup", "0"], "--speedup"),
                       (["--url", "http://127.0.0.1:1", "--bogus"], "unknown option"),
                       (["--url", "http://127.0.0.1:1", "--compare", "a=b"], "--compare needs --plot")):
        rc, out, err = replay(*args)
        check(f"usage error {args}: exit 2 naming it", rc == 2 and what in err, (rc, err))
    rc, out, err = replay("--help")
    check("--help", rc == 0 and "--max-inflight" in out and "--compare" in out, (rc, out))


def scenario_interrupt():
    m = Mocker("--speedup", "1")
    try:
        p = subprocess.Popen([KVR, "replay", "--url", m.url, "--trace", SLICE, "--requests", "100",
                              "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True)
        CHILDREN.append(p)
        # interrupted mid-run: once the engine has answered a few of the 100 requests
        check("SIGINT: requests under way first", eventually(lambda: m.finished() >= 3, 60))
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        no_sanitizer("interrupted replay", err)
        check("SIGINT: exit 130", p.returncode == 130, (p.returncode, err[-1500:]))
        j = parse_json("interrupted --json", out)
        if j is not None:
            check("SIGINT: a partial report", j.get("interrupted") is True and j.get("not_sent", 0) > 0
                  and j.get("requests") == 100, j)
    finally:
        m.stop()


def children_of(pid):
    """Pids whose parent is pid."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                for line in f:
                    if line.startswith("PPid:"):
                        if int(line.split()[1]) == pid:
                            out.append(int(d))
                        break
        except OSError:
            continue
    return out


def alive(pids):
    """Those of pids still running this binary (not zombies)."""
    left = []
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if state != "Z" and (b"mocker" in cmd or b"serve" in cmd):
            left.append(p)
    return left


def run_watched(args, interrupt_after=None, timeout=240):
    """Runs a demo, noting every child it starts; optionally SIGINT once interrupt_after
    children are up. (returncode, stdout, stderr, child pids seen)."""
    q = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True)
    CHILDREN.append(q)
    seen = set()
    out_chunks, err_chunks = [], []
    # drain the pipes in threads so the child never blocks on a full pipe
    t_out = threading.Thread(target=lambda: out_chunks.append(q.stdout.read()), daemon=True)
    t_err = threading.Thread(target=lambda: err_chunks.append(q.stderr.read()), daemon=True)
    t_out.start()
    t_err.start()
    end = time.monotonic() + timeout
    sent = False
    while q.poll() is None and time.monotonic() < end:
        seen.update(children_of(q.pid))
        if interrupt_after and not sent and len(seen) >= interrupt_after:
            time.sleep(1.0)
            q.send_signal(signal.SIGINT)
            sent = True
        time.sleep(0.05)
    if q.poll() is None:
        q.kill()
    q.wait(timeout=30)
    t_out.join(timeout=10)
    t_err.join(timeout=10)
    return q.returncode, "".join(out_chunks), "".join(err_chunks), seen


def scenario_demo():
    """kvrouter demo, small: 2 workers, 60 rows; everything it started is gone after."""
    png = os.path.join(TMP, "demo.png")
    keep = os.path.join(TMP, "demo-keep")
    args = [KVR, "demo", "--workers", "2", "--requests", "60", "--num-gpu-blocks", "8192",
            "--mocker-speedup", "20", "--load", "1", "--plot", png, "--trace", SLICE]
    rc, out, err, seen = run_watched(args + ["--keep", keep])
    no_sanitizer("demo", err)
    check("demo exits 0", rc == 0, (rc, err[-3000:]))
    check("demo: started 2 mockers and a router per policy (and gnuplot)", len(seen) >= 6, seen)
    check("demo: no child failed", "warning" not in err, err[-3000:])
    lines = out.splitlines()
    check("demo: a row per policy", any(l.startswith("kv ") for l in lines)
          and any(l.startswith("round-robin ") for l in lines), out)
    check("demo: the comparison line", "kv vs round-robin: TTFT p50" in out, out)
    head = next((l for l in lines if l.startswith("policy ")), "")
    ceil = next((l for l in lines if l.startswith("ceiling ")), "")
    check("demo: the ceiling stands under the hit-ratio column",
          head and ceil and len(ceil.rstrip()) == head.index("hit ratio") + len("hit ratio"),
          (head, ceil))
    check("demo: the columns are explained", "max share: the" in out and "ceiling: the" in out,
          out)
    check("demo: samples kept", all(os.path.getsize(os.path.join(keep, f"{x}.tsv")) > 0
                                    for x in ("kv", "round-robin")))
    if shutil.which("gnuplot"):
        check("demo: the plot", f"plot: {png}" in out and os.path.getsize(png) > 1000, out)
    check("demo: no process left behind", not alive(seen), alive(seen))

    # Ctrl-C in the middle of the first replay: exit 130, every child stopped
    rc, out, err, seen = run_watched(args + ["--requests", "120", "--load", "0.05"],
                                     interrupt_after=3)
    no_sanitizer("interrupted demo", err)
    check("demo SIGINT: exit 130", rc == 130, (rc, err[-2000:]))
    check("demo SIGINT: no process left behind", seen and not alive(seen), (seen, alive(seen)))


def scenario_demo_kv_events():
    """The demo's router must see its mockers' KV events: one 2,048-token prompt sent 12 times,
    each after the last has finished, must hit its whole prefix from the second on (the
    infinite-cache ceiling exactly). Without events a kv router only sees load, and with 4
    idle workers sends the repeats where its tie-break falls."""
    trace = os.path.join(TMP, "repeat.jsonl")
    with open(trace, "w") as f:
        for i in range(12):
            f.write(json.dumps({"timestamp": 4000 * i, "input_length": 2048,
                                "output_length": 2, "hash_ids": [0, 1, 2, 3]}) + "\n")
    args = [KVR, "demo", "--policies", "kv", "--workers", "4", "--requests", "12",
            "--num-gpu-blocks", "4096", "--mocker-speedup", "20", "--load", "1", "--json",
            "--quiet", "--trace", trace, "--plot", os.path.join(TMP, "repeat.png")]
    rc, out, err, seen = run_watched(args)
    no_sanitizer("demo (repeated prompt)", err)
    check("demo (repeated prompt) exits 0", rc == 0, (rc, err[-3000:]))
    try:
        j = json.loads(out.splitlines()[0])
    except (ValueError, IndexError):
        j = {}
    hr, ci = j.get("hit_ratio"), j.get("ceiling_infinite")
    check("demo (repeated prompt): kv routing hits the whole ceiling (the router gets the "
          "mockers' KV events)", hr is not None and ci is not None and abs(hr - ci) < 1e-9,
          (hr, ci, out[-2000:]))
    check("demo (repeated prompt): one worker served them all", j.get("max_worker_share") == 1.0,
          j.get("max_worker_share"))
    check("demo (repeated prompt): no process left behind", not alive(seen), alive(seen))


def table_row(lines, policy):
    """The demo table's row of policy as (TTFT p50, ITL p90) in ms, or None."""
    for line in lines:
        t = line.split()
        if len(t) >= 13 and t[0] == policy and t[2] == "ms":
            return float(t[1]), float(t[9])
    return None


def expected_work(out, rows, blocks, load):
    """(prefill, decode) workers kept busy, recomputed here from the trace rows with the model
    the split's legend states (its step size, polynomial and full-cache decode step)."""
    text = " ".join(out.split())
    m = re.search(r"cold in (\d+)-token steps of ([-\d.e+]+) T\^2 \+ ([-\d.e+]+) T \+ "
                  r"([-\d.e+]+) ms; decode: .* held for output x ([\d.]+) ms steps", text)
    if m is None:
        return None
    chunk, a, b, c, step = (float(x) for x in m.groups())
    pf = kv = 0.0
    for r in rows:
        left = r["input_length"]
        while left > 0:
            t = min(left, chunk)
            pf += a * t * t + b * t + c
            left -= t
        held = -(-(r["input_length"] + r["output_length"]) // 16)  # blocks of 16 tokens
        kv += held / blocks * r["output_length"] * step
    span = (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000 / load
    return pf / 1e3 / span, kv / 1e3 / span


def scenario_demo_disagg():
    """kvrouter demo --disagg, small: the split it chose from the slice's modelled work (and
    why), the trade-off sentence filled with the table's own figures, each pool's legs spread
    over its workers, nothing left behind; and --disagg's usage errors."""
    for bad, why in ((["--disagg", "3P"], "auto, or PxD"),
                     (["--disagg", "--workers", "1"], "needs --workers 2"),
                     (["--disagg", "2P2D", "--policy", "kv"], "no --routers or --policy")):
        p = subprocess.run([KVR, "demo", *bad], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=30)
        check(f"demo {' '.join(bad)}: usage error", p.returncode == 2 and why in p.stderr,
              (p.returncode, p.stderr))
    n, workers, blocks, load = 60, 4, 65536, 2
    args = [KVR, "demo", "--disagg", "--workers", str(workers), "--requests", str(n),
            "--num-gpu-blocks", str(blocks), "--mocker-speedup", "20", "--load", str(load),
            "--quiet", "--trace", SLICE, "--plot", os.path.join(TMP, "disagg.png")]
    rc, out, err, seen = run_watched(args)
    no_sanitizer("demo --disagg", err)
    check("demo --disagg exits 0", rc == 0, (rc, err[-3000:]))
    lines = out.splitlines()
    split = next((l for l in lines if l.startswith("split ")), "")
    m = re.match(r"split (\d+)P(\d+)D \(auto\): the slice's modelled work at load x[\d.]+ keeps "
                 r"([\d.]+) workers busy with prefill and ([\d.]+) with decode", split)
    check("demo --disagg: the split line, with the two estimates", m is not None, out[:2000])
    if m is None:
        return
    p, d, pf, dec = int(m[1]), int(m[2]), float(m[3]), float(m[4])
    check("demo --disagg: the split uses every worker, at least one of each", p + d == workers
          and p >= 1 and d >= 1, split)
    best = min(range(1, workers), key=lambda k: (max(pf / k, dec / (workers - k)), k))
    check("demo --disagg: the split loads the busier pool least", p == best, (split, best))
    with open(SLICE) as f:
        rows = [json.loads(line) for line, _ in zip(f, range(n))]
    want = expected_work(out, rows, blocks, load)
    check("demo --disagg: the estimates are the slice's work under the stated model",
          want is not None and abs(pf - want[0]) <= 0.01 + 0.01 * want[0]
          and abs(dec - want[1]) <= 0.01 + 0.01 * want[1], (split, want))
    label = f"kv/{p}P{d}D"
    agg, dis = table_row(lines, "kv"), table_row(lines, label)
    check("demo --disagg: a row for kv and one for the split", agg and dis, out)
    text = " ".join(out.split())
    t = re.search(r"Disaggregation trades TTFT for ITL: the decode workers never run a prefill, "
                  r"so inter-token latency is smoother[^(]*\(ITL p90 (\d+) ms against (\d+) ms "
                  r"aggregated.*while each request pays the KV transfer and the prefill pool's "
                  r"queue \(TTFT p50 (\d+) ms against (\d+) ms aggregated", text)
    check("demo --disagg: the trade-off sentence", t is not None, out[-2500:])
    if t and agg and dis:
        check("demo --disagg: the sentence quotes the table (ITL p90, TTFT p50 of both rows)",
              (float(t[1]), float(t[2]), float(t[3]), float(t[4]))
              == (dis[1], agg[1], dis[0], agg[0]), (t.groups(), agg, dis))
    per = next((l for l in lines if l.startswith(label + ": requests per worker")), "")
    pm = re.search(r"prefill (.*); decode (.*)$", per)
    check("demo --disagg: requests per worker of each pool", pm is not None, out[-2500:])
    if pm:
        legs = [[float(x.split(":")[1]) for x in g.split(",")] for g in pm.groups()]
        check("demo --disagg: every request had a prefill and a decode leg",
              [len(legs[0]), len(legs[1])] == [p, d] and sum(legs[0]) == n and sum(legs[1]) == n,
              per)
        # spread by active KV blocks, so near 1/D; 1.5/D allows the small run's luck
        check("demo --disagg: no decode worker takes more than 1.5/D of the decode legs",
              max(legs[1]) <= 1.5 * n / d, per)
    check("demo --disagg: the shares are per pool", "P/D: the busiest prefill worker's share"
          in out, out[-2500:])
    check("demo --disagg: no process left behind", not alive(seen), alive(seen))


def scenario_demo_keep_up():
    """kvrouter demo --keep-up: each run's live-view URL printed while it runs; after the
    comparison the kv run's router stays up serving /ui and its history, until Ctrl-C, which
    stops everything and exits 0."""
    trace = os.path.join(TMP, "keepup.jsonl")
    with open(trace, "w") as f:
        for i in range(6):
            f.write(json.dumps({"timestamp": 500 * i, "input_length": 1024,
                                "output_length": 2, "hash_ids": [0, i]}) + "\n")
    q = subprocess.Popen([KVR, "demo", "--policy", "kv,round-robin", "--workers", "2",
                          "--requests", "6", "--num-gpu-blocks", "4096", "--mocker-speedup",
                          "20", "--load", "1", "--keep-up", "--trace", trace, "--plot",
                          os.path.join(TMP, "keepup.png")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True)
    CHILDREN.append(q)
    lines, seen = [], set()
    t_err = threading.Thread(target=lambda: lines.extend(iter(q.stderr.readline, "")),
                             daemon=True)
    t_out = threading.Thread(target=q.stdout.read, daemon=True)
    t_err.start()
    t_out.start()
    def up_url():
        seen.update(children_of(q.pid))
        for ln in list(lines):
            m = re.search(r"still up: its live view at (\S+)/ui", ln)
            if m:
                return m.group(1)
        return None
    up = eventually(lambda: up_url() is not None or q.poll() is not None, timeout=240)
    url = up_url() if up else None
    check("demo --keep-up: each run's live view URL printed while it runs",
          sum(1 for ln in lines if re.search(r"demo: (kv|round-robin): live view at "
                                             r"http://127\.0\.0\.1:\d+/ui", ln)) == 2,
          "".join(lines)[-2000:])
    check("demo --keep-up: after the comparison the kv router is still up", url is not None
          and q.poll() is None, "".join(lines)[-2000:])
    if url is not None:
        with urllib.request.urlopen(url + "/ui", timeout=10) as r:
            page = r.read()
            check("demo --keep-up: its /ui answers the page", r.status == 200 and
                  r.headers.get("Content-Type", "").startswith("text/html") and
                  b"<html" in page.lower(), r.status)
        def decided():
            with urllib.request.urlopen(url + "/v1/stats", timeout=10) as r:
                pts = json.loads(r.read())["points"]
            return sum(p["decisions_per_s"] or 0 for p in pts) > 0
        # the first point comes a second after the router started: the run may be shorter
        check("demo --keep-up: its history holds the run's decisions",
              eventually(decided, timeout=10))
    q.send_signal(signal.SIGINT)
    try:
        rc = q.wait(timeout=60)
    except subprocess.TimeoutExpired:
        q.kill()
        rc = None
    t_err.join(timeout=10)
    no_sanitizer("demo --keep-up", "".join(lines))
    check("demo --keep-up: Ctrl-C ends it with status 0", rc == 0, (rc, "".join(lines)[-1500:]))
    check("demo --keep-up: no process left behind", not alive(seen), alive(seen))


def main():
    try:
        scenario_bad_input()
        scenario_failures()
        scenario_mocker()
        scenario_interrupt()
        scenario_demo()
        scenario_demo_kv_events()
        scenario_demo_disagg()
        scenario_demo_keep_up()
    finally:
        for p in CHILDREN:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        shutil.rmtree(TMP, ignore_errors=True)
    print(f"{results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
