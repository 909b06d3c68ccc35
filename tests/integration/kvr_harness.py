"""Helpers shared by the integration tests (run as /usr/bin/python3 tests/integration/test_X.py,
so this directory is on sys.path): polling with a deadline, free loopback ports, reading a
child's stdout line without hanging, splitting an SSE body strictly, counting checks, a
kvrouter child process (serve or mocker) with its HTTP calls and metrics, and streaming
requests (parsed, or on a socket of their own to leave mid-answer)."""
import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import tempfile
import time

RESULTS = {"passed": 0, "failed": 0}
VERBOSE = bool(os.environ.get("KVR_TEST_VERBOSE"))
SANITIZER_RE = re.compile(r"AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|"
                          r"ThreadSanitizer|runtime error:")


def check(name, cond, detail=""):
    """Counts one assertion in RESULTS; prints failures (and passes with KVR_TEST_VERBOSE)."""
    if cond:
        RESULTS["passed"] += 1
        if VERBOSE:
            print(f"ok   {name}", flush=True)
    else:
        RESULTS["failed"] += 1
        d = detail if isinstance(detail, str) else repr(detail)
        print(f"FAIL {name} {d[:1500]}", flush=True)
    return bool(cond)


def finish():
    """The closing line test runners read, and the exit status."""
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed", flush=True)
    raise SystemExit(1 if RESULTS["failed"] else 0)


def run_main(main, name):
    """main() with a crash counted as a failed check (children killed), then finish()."""
    try:
        main()
    except Exception as e:  # noqa: BLE001 - a crash is a failed check
        import traceback
        traceback.print_exc()
        check(f"{name} ran to the end", False, repr(e))
        kill_children()
    finish()


def eventually(fn, timeout=10.0, interval=0.03):
    """Poll until fn() is truthy or the deadline passes; returns the last value."""
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > end:
            return v
        time.sleep(interval)


def _ephemeral_low():
    """The lowest port the kernel hands out for outgoing connections (and for bind to 0)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n=1):
    """A base port P with P .. P+n-1 free on 127.0.0.1 (bound then closed; racy but short).
    Drawn below the kernel's ephemeral range: ports there are taken and left in TIME_WAIT by
    every outgoing connection (a test's own HTTP clients make thousands), so a run of n
    consecutive free ones there can be impossible to find while another suite runs."""
    import random
    rng = random.SystemRandom()
    low, high = 10000, _ephemeral_low() - n
    for _ in range(500):
        socks = []
        try:
            p = rng.randrange(low, high) if high > low else 0
            if p == 0:  # no room below the ephemeral range: let the kernel pick
                s0 = socket.socket()
                socks.append(s0)
                s0.bind(("127.0.0.1", 0))
                p = s0.getsockname()[1]
                if p + n > 65535:
                    continue
            for k in range(len(socks), n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p + k))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def with_free_ports(start, *sizes, tries=8):
    """(ports, start(*ports)) with a fresh free range of each size; if a child could not bind
    because another process took a port after free_ports chose it (the check is racy on a
    busy machine), again with new ports."""
    for i in range(tries):
        ports = [free_ports(n) for n in sizes]
        try:
            return ports, start(*ports)
        except RuntimeError as e:
            if "Address already in use" not in str(e) or i == tries - 1:
                raise
    raise AssertionError("unreachable")


def read_line(proc, timeout=30.0):
    """One stdout line of a child, without hanging if it never comes."""
    fd = proc.stdout.fileno()
    buf = b""
    end = time.monotonic() + timeout
    while not buf.endswith(b"\n"):
        left = end - time.monotonic()
        if left <= 0:
            break
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            break
        c = os.read(fd, 1)
        if not c:
            break
        buf += c
    return buf.decode(errors="replace")


def sse_events(raw):
    """Splits an SSE body into its events; (events, problems) where each event is the text after
    `data: ` and problems lists every deviation from `data: <one line>\\n\\n`."""
    text = raw.decode(errors="replace")
    problems = []
    if not text.endswith("\n\n"):
        problems.append("stream does not end with a blank line: %r" % text[-40:])
    parts = text.split("\n\n")
    if parts and parts[-1] == "":
        parts = parts[:-1]
    events = []
    for p in parts:
        if not p.startswith("data: "):
            problems.append("event not starting with 'data: ': %r" % p[:80])
            continue
        if "\n" in p:
            problems.append("event spans several lines: %r" % p[:120])
        events.append(p[len("data: "):])
    return events, problems


def stream(r, path, body, headers=None):
    """(status, headers, [parsed chunks], problems) of a streaming request to child r; on a
    non-200 answer, (status, headers, raw body, [])."""
    st, h, raw = r.request("POST", path, dict(body, stream=True), headers)
    if st != 200:
        return st, h, raw, []
    evs, problems = sse_events(raw)
    if not evs or evs[-1] != "[DONE]":
        problems.append("no [DONE] at the end")
    chunks = []
    for e in evs[:-1]:
        try:
            chunks.append(json.loads(e))
        except ValueError:
            problems.append("not JSON: %r" % e[:100])
    return st, h, chunks, problems


def raw_request(r, path, body):
    """A POST to child r on a socket of our own (to close it mid-answer)."""
    s = socket.create_connection((r.host, r.port), timeout=10)
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def read_events(s, n, got=b"", limit_s=30.0):
    """Reads from socket s until n `data: ` events arrived, EOF, or limit_s passed."""
    end = time.monotonic() + limit_s
    while got.count(b"data: ") < n and time.monotonic() < end:
        s.settimeout(max(0.01, end - time.monotonic()))
        try:
            c = s.recv(65536)
        except socket.timeout:
            break
        if not c:
            break
        got += c
    return got


CHILDREN = []  # every Child started, killed by kill_children() if still running


def terminate(proc, what, timeout=30.0):
    """SIGTERM, then SIGKILL after timeout s: a process that needs the kill is a failed check
    (it must exit on SIGTERM)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        check(f"{what} exits on SIGTERM", False, f"killed after {timeout:.0f} s")


class Child:
    """A kvrouter process on loopback that prints `listening host:port`; stderr goes to a file
    scanned for sanitizer reports when it stops."""

    def __init__(self, args, what, env=None):
        self.what = what
        self.args = [str(a) for a in args]
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.err,
                                     stdin=subprocess.DEVNULL,
                                     env=None if env is None else {**os.environ, **env})
        CHILDREN.append(self)
        line = read_line(self.proc)
        if not line.startswith("listening "):
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise RuntimeError(f"{what} did not start ({self.args}): {line!r} {self.stderr()}")
        self.addr = line.split()[1]
        self.host, port = self.addr.rsplit(":", 1)
        self.port = int(port)
        self.url = self.base = f"http://{self.addr}"
        self.stopped = False

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def kill(self, sig=signal.SIGKILL):
        """A process that dies (nothing of its exit is checked)."""
        self.stopped = True
        self.proc.send_signal(sig)
        self.proc.wait(timeout=10)

    def stop(self, expect_rc=0):
        """SIGTERM; checks the exit status and that stderr holds no sanitizer report."""
        if self.stopped:
            return self.proc.returncode
        self.stopped = True
        terminate(self.proc, self.what)
        err = self.stderr()
        m = SANITIZER_RE.search(err)
        check(f"{self.what} stderr free of sanitizer reports", m is None,
              err[max(0, (m.start() if m else 0) - 300):][:3000])
        check(f"{self.what} exits {expect_rc} on SIGTERM", self.proc.returncode == expect_rc,
              (self.proc.returncode, err[-2000:]))
        return self.proc.returncode

    def request(self, method, path, body=None, headers=None, timeout=30.0):
        """(status, headers, raw bytes); body: dict/list (JSON), str or bytes (as is)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            h = {"Content-Type": "application/json"} if body is not None else {}
            h.update(headers or {})
            data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
            if isinstance(data, str):
                data = data.encode()
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            return r.status, r.headers, r.read()
        finally:
            conn.close()

    def call_h(self, method, path, body=None, headers=None, timeout=30.0):
        """(status, parsed JSON or text, headers)."""
        st, h, raw = self.request(method, path, body, headers, timeout)
        text = raw.decode(errors="replace")
        try:
            return st, json.loads(text), h
        except ValueError:
            return st, text, h

    def call(self, method, path, body=None, headers=None, timeout=30.0):
        """(status, parsed JSON or text)."""
        st, body, _ = self.call_h(method, path, body, headers, timeout)
        return st, body

    def metrics(self):
        """[(name, labels, value)] of the Prometheus text at /metrics."""
        st, _, raw = self.request("GET", "/metrics", timeout=10)
        out = []
        for line in raw.decode(errors="replace").splitlines() if st == 200 else ():
            if not line or line.startswith("#"):
                continue
            m = re.match(r"^([^{\s]+)(\{(.*)\})?\s+(\S+)$", line)
            if m:
                labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
                out.append((m.group(1), labels, float(m.group(4))))
        return out

    def metric(self, name, **labels):
        """The sum of a metric's samples whose labels include `labels`; None when absent."""
        vals = [v for n, l, v in self.metrics()
                if n == name and all(l.get(k) == str(x) for k, x in labels.items())]
        return sum(vals) if vals else None


def kill_children():
    for c in CHILDREN:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait(timeout=10)


def run_scenarios(scenarios, seed):
    """Runs (name, fn) pairs; a scenario that raises is one failed check. Kills what is left
    running, prints the closing line and exits 1 on any failure. TEST_ONLY=a,b runs only the
    scenarios named (not a KVR_ variable: serve reads those as settings)."""
    t0 = time.monotonic()
    only = [n for n in os.environ.get("TEST_ONLY", "").split(",") if n]
    try:
        for name, fn in scenarios:
            if only and name not in only:
                continue
            ts = time.monotonic()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a crashed scenario is a failed check
                import traceback
                traceback.print_exc()
                check(f"scenario {name} ran to the end", False, repr(e))
                for c in CHILDREN:  # what the processes said, for the failure's cause
                    if not getattr(c, "stopped", False):
                        rc = c.proc.poll()
                        print(f"--- {c.what} ({'running' if rc is None else f'exited {rc}'}), "
                              f"stderr tail:\n{c.stderr()[-1500:]}", flush=True)
            print(f"  {name}: {time.monotonic() - ts:.1f} s, {RESULTS['passed']} passed, "
                  f"{RESULTS['failed']} failed so far", flush=True)
    finally:
        kill_children()
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed "
          f"(seed {seed}, {time.monotonic() - t0:.1f} s)", flush=True)
    raise SystemExit(1 if RESULTS["failed"] else 0)


def proc_kib(pid, field="VmRSS"):
    """A /proc/PID/status size in KiB: VmRSS (now) or VmHWM (the peak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class FloodHttp:
    """An HTTP server playing a hostile peer or worker: a GET is answered 200 with `flood` bytes
    of body (with that Content-Length when `length`, else read to the close), a POST with a head
    of a megabyte of headers. It records each GET's (path, Authorization) and counts the body
    bytes it managed to send (a client that hangs up early keeps that small)."""

    def __init__(self, flood, host="127.0.0.1", length=False):
        import http.server
        import socketserver
        import threading
        outer = self
        self.seen, self.sent = [], 0

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if length else "HTTP/1.0"

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(200)
                if length:
                    self.send_header("Content-Length", str(flood))
                self.end_headers()
                chunk = b"\xab" * 65536
                try:
                    while outer.sent < flood:
                        self.wfile.write(chunk)
                        outer.sent += len(chunk)
                except OSError:
                    pass  # the client hung up

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(200)
                try:
                    for i in range(1000):
                        self.send_header(f"X-Junk-{i}", "y" * 1000)
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    pass

        class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.srv = S((host, 0), H)
        self.port = self.srv.server_address[1]
        self.url = f"http://{host}:{self.port}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


class NatsServer:
    """A real nats-server (Debian's) on a free loopback port, JetStream on, its store in a
    temporary directory; restartable on the same port and store (a NATS outage)."""

    def __init__(self, conf=None):
        """conf: a server configuration (its text; {port} and {store} are filled in) for
        authorization, permissions or TLS; None = none of them."""
        self.dir = tempfile.mkdtemp(prefix="kvr-nats-")
        self.port = free_ports(1)
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc = None
        self.conf = conf
        self.start()

    def start(self):
        self.log = open(os.path.join(self.dir, "server.log"), "ab")
        import shutil
        exe = shutil.which("nats-server") or "/usr/sbin/nats-server"  # Debian puts it in sbin
        args = [exe, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd",
                os.path.join(self.dir, "js")]
        if self.conf is not None:
            path = os.path.join(self.dir, "server.conf")
            with open(path, "w") as f:
                f.write(self.conf.replace("{port}", str(self.port)).replace(
                    "{store}", os.path.join(self.dir, "js")))
            args = [exe, "-c", path]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL)
        if not eventually(self._accepts, timeout=20):
            raise RuntimeError("nats-server did not start: " + self.server_log()[-2000:])

    def _accepts(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                return s.recv(4096).startswith(b"INFO ")
        except OSError:
            return False

    def server_log(self):
        with open(os.path.join(self.dir, "server.log"), "rb") as f:
            return f.read().decode(errors="replace")

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()

    def stop(self):
        self.kill()
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)

    def publish(self, subject, payload, reply=None, headers=None):
        """Publishes raw bytes with NATS's text protocol (no client library: the test is a
        stranger on the bus) and waits for the server's PONG, so the message is in. headers:
        {name: value} sent with HPUB (a KV delete is an empty message with KV-Operation: DEL)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            f = s.makefile("rb")
            f.readline()  # INFO
            rp = reply + " " if reply else ""
            if headers is None:
                head = f"PUB {subject} {rp}{len(payload)}\r\n".encode()
            else:
                hdr = ("NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) +
                       "\r\n").encode()
                head = f"HPUB {subject} {rp}{len(hdr)} {len(hdr) + len(payload)}\r\n".encode()
                payload = hdr + payload
            s.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n' + head +
                      payload + b"\r\nPING\r\n")
            line = f.readline()
            return line.startswith(b"PONG")
