#!/usr/bin/python3
"""The router as an attacker or a broken neighbour meets it: API keys and the admin listener,
every per-connection limit (connections, head size, head/body/idle deadlines), errors always in
JSON, and a router out of file descriptors. Every check runs `kvrouter serve` for real on
loopback; waits are bounded polls. Usage: test_hardening.py <path to kvrouter>.
(Registration safety, worker credentials and the upstream answer limit are in
test_serve_events.py; the SIGTERM drain in test_frontend.py.)
"""
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvr_harness import (Child, FloodHttp, check, eventually, proc_kib, read_line,  # noqa: E402
                         run_scenarios)

KVR = sys.argv[1]
SEED = int(os.environ.get("KVR_TEST_SEED", "1"))


def router(*extra, what="router", preexec_fn=None):
    args = [KVR, "serve", "--http-port", "0", "--router-mode", "round-robin",
            "--log-level", "warn"] + [str(a) for a in extra]
    return Child(args, what) if preexec_fn is None else _child_with(args, what, preexec_fn)


def _child_with(args, what, preexec_fn):
    """A Child whose process runs preexec_fn first (a resource limit)."""
    real = subprocess.Popen

    def popen(*a, **k):
        k["preexec_fn"] = preexec_fn
        return real(*a, **k)
    subprocess.Popen = popen
    try:
        return Child(args, what)
    finally:
        subprocess.Popen = real


def raw(host, port, data, timeout=10):
    """Sends data on a new connection and reads until the router closes it."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(data)
        got = b""
        while True:
            c = s.recv(65536)
            if not c:
                return got
            got += c
    except OSError:
        return got
    finally:
        s.close()


def split_answer(b):
    """(status, headers text, parsed JSON body or None) of one raw HTTP answer."""
    head, _, body = b.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    try:
        st = int(lines[0].split()[1])
    except (IndexError, ValueError):
        st = 0
    try:
        return st, "\n".join(lines[1:]), json.loads(body)
    except ValueError:
        return st, "\n".join(lines[1:]), None


def is_oai_error(doc, code):
    return (isinstance(doc, dict) and isinstance(doc.get("error"), dict)
            and isinstance(doc["error"].get("message"), str) and doc["error"].get("code") == code)


def key_file(token):
    f = tempfile.NamedTemporaryFile("w", suffix=".key", delete=False)
    f.write(token + "\n")
    f.close()
    return f.name


def metric(r, name, headers=None, **labels):
    st, _, raw_ = r.request("GET", "/metrics", headers=headers, timeout=10)
    if st != 200:
        return None
    total, seen = 0.0, False
    for line in raw_.decode().splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return total if seen else None


# ------------------------------------------------------------------------------------------

def scenario_tokens():
    api, admin = key_file("client-secret-1"), key_file("admin-secret-2")
    r = router("--api-key-file", api, "--admin-key-file", admin, what="router(keys)")
    A = {"Authorization": "Bearer client-secret-1"}
    D = {"Authorization": "Bearer admin-secret-2"}
    try:
        st, _, _ = r.request("GET", "/health")
        check("tokens: /health needs none", st == 200, st)
        st, body, h = r.call_h("POST", "/v1/query", {"tokens": [1, 2, 3]})
        check("tokens: no key: 401 in OpenAI's shape with the Bearer challenge",
              st == 401 and body["error"]["code"] == "invalid_api_key"
              and body["error"]["type"] == "invalid_request_error" and "param" in body["error"]
              and h.get("WWW-Authenticate") == "Bearer", (st, body, dict(h)))
        for bad in ("Bearer client-secret-2", "Bearer client-secret-1x", "Bearer client-secret-",
                    "Basic client-secret-1", "client-secret-1", "Bearer "):
            st, _ = r.call("POST", "/v1/query", {"tokens": [1]}, {"Authorization": bad})
            check(f"tokens: a wrong key ({bad!r}) is refused", st == 401, st)
        st, _ = r.call("POST", "/v1/query", {"tokens": [1, 2, 3]}, A)
        check("tokens: the api key is accepted", st == 200, st)
        st, _ = r.call("POST", "/v1/query", {"tokens": [1, 2, 3]}, D)
        check("tokens: the admin key is accepted for client calls", st == 200, st)
        st, _ = r.call("GET", "/v1/models", None, None)
        check("tokens: the OpenAI front end needs the key too", st == 401, st)
        w = {"worker_id": 7, "url": "http://127.0.0.1:9"}
        st, body = r.call("POST", "/v1/workers", w, A)
        check("tokens: the api key cannot change the fleet", st == 401 and "admin" in
              body["error"]["message"], (st, body))
        st, body = r.call("POST", "/v1/workers", w, D)
        check("tokens: the admin key can", st == 201, (st, body))
        st, _ = r.call("DELETE", "/v1/workers/7", None, A)
        check("tokens: nor remove a worker with the api key", st == 401, st)
        st, _ = r.call("GET", "/v1/dump", None, A)
        check("tokens: nor dump the index", st == 401, st)
        for method, path, body in (("POST", "/busy_threshold", {"model": "m"}),
                                   ("POST", "/v1/log-level", {"level": "debug"}),
                                   ("POST", "/record_routing_decision",
                                    {"instance_id": 1, "local_hashes": [1],
                                     "sequence_hashes": [1]})):
            st, _ = r.call(method, path, body, A)
            check(f"tokens: nor {method} {path} (an admin call) with the api key", st == 401, st)
        st, _, _ = r.request("GET", "/metrics")
        check("tokens: /metrics needs the key", st == 401, st)
        n = metric(r, "kvr_http_unauthorized_total", A)
        check("tokens: refusals are counted", n is not None and n >= 10, n)
        check("tokens: no key is ever logged", "secret" not in r.stderr())
    finally:
        r.stop()
        os.unlink(api)
        os.unlink(admin)
    bad = key_file("two words")
    p = subprocess.run([KVR, "serve", "--http-port", "0", "--api-key-file", bad],
                       capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    check("tokens: a bad key file is refused at start naming the field",
          p.returncode != 0 and "--api-key-file" in p.stderr, (p.returncode, p.stderr[-300:]))
    os.unlink(bad)


def scenario_admin_plane():
    r = router("--admin-port", 0, what="router(admin)")
    try:
        line = read_line(r.proc)
        check("admin: the listener is announced", line.startswith("admin listening 127.0.0.1:"),
              line)
        aport = int(line.rsplit(":", 1)[1])
        adm = http.client.HTTPConnection("127.0.0.1", aport, timeout=10)

        def admin_call(method, path, body=None):
            adm.request(method, path, body=json.dumps(body) if body is not None else None,
                        headers={"Content-Type": "application/json"})
            resp = adm.getresponse()
            return resp.status, json.loads(resp.read() or b"null")

        w = {"worker_id": 5, "url": "http://127.0.0.1:9"}
        st, body = r.call("POST", "/v1/workers", w)
        check("admin: fleet changes are not served on the client port",
              st == 404 and "admin" in body["error"]["message"], (st, body))
        st, _ = r.call("DELETE", "/v1/workers/5")
        check("admin: nor removals", st == 404, st)
        st, _ = r.call("GET", "/v1/dump")
        check("admin: nor the dump", st == 404, st)
        st, body = admin_call("POST", "/v1/workers", w)
        check("admin: the admin listener serves them", st == 201, (st, body))
        st, body = admin_call("GET", "/v1/workers")
        check("admin: GET /v1/workers on the admin listener",
              st == 200 and any(x["worker_id"] == 5 for x in body["workers"]), (st, body))
        st, body = r.call("GET", "/v1/workers")
        check("admin: and on the client port", st == 200, st)
        st, body = admin_call("POST", "/v1/route", {"tokens": [1, 2, 3]})
        check("admin: client calls are not served on the admin listener", st == 404, (st, body))
        st, body = r.call("POST", "/v1/route", {"tokens": [1, 2, 3]})
        check("admin: the client port routes", st == 200 and body["worker_id"] == 5, (st, body))
        st, body = admin_call("DELETE", "/v1/workers/5")
        check("admin: removal on the admin listener", st in (200, 204), (st, body))
        adm.close()
    finally:
        r.stop()


def scenario_connection_limit():
    cap = 8
    r = router("--http-max-connections", cap, what="router(max connections)")
    socks = []
    try:
        for _ in range(cap):
            socks.append(socket.create_connection((r.host, r.port), timeout=10))
        got = raw(r.host, r.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        st, _, body = split_answer(got)
        check("connections: one past the cap is answered 503 in JSON and closed",
              st == 503 and is_oai_error(body, 503)
              and "http_max_connections" in body["error"]["message"], got[:300])
        for s in socks:
            s.close()
        socks = []
        check("connections: served again once they close",
              eventually(lambda: r.request("GET", "/health", timeout=5)[0] == 200, 10))
        n = metric(r, "kvr_http_connections_refused_total", listener="client")
        check("connections: the refusal is counted", n is not None and n >= 1, n)
        check("connections: the gauge comes back down",
              eventually(lambda: metric(r, "kvr_http_connections", listener="client") == 1, 10))
    finally:
        for s in socks:
            s.close()
        r.stop()


def drip(r, first, rest):
    """Sends first, then rest one byte every 100 ms until the router answers or closes;
    (what it answered, seconds from the first dripped byte)."""
    s = socket.create_connection((r.host, r.port), timeout=10)
    got = b""
    t0 = time.monotonic()
    try:
        s.sendall(first)
        for b in rest:
            s.sendall(bytes([b]))
            time.sleep(0.1)  # the drip is the client under test, not a wait for the router
            s.setblocking(False)
            try:
                got += s.recv(4096)
            except BlockingIOError:
                pass
            s.setblocking(True)
            if got:
                break
    except OSError:
        pass
    s.settimeout(5)
    try:
        while True:
            c = s.recv(4096)
            if not c:
                break
            got += c
    except OSError:
        pass
    s.close()
    return got, time.monotonic() - t0


def scenario_deadlines():
    r = router("--http-header-timeout-ms", 500, "--http-body-timeout-ms", 500,
               "--http-idle-timeout-ms", 400, what="router(deadlines)")
    try:
        # a head dripped one byte every 100 ms: cut off by the head deadline
        got, took = drip(r, b"", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200)
        st, _, body = split_answer(got)
        check("deadlines: a slow-drip head gets 408 in JSON", st == 408 and is_oai_error(body, 408)
              and "http_header_timeout_ms" in body["error"]["message"], got[:300])
        check("deadlines: within the head deadline (plus a drip)", took < 3.0, took)
        # a body dripped one byte every 100 ms: cut off by the body deadline
        got, took = drip(r, b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Length: 400\r\n\r\n",
                         b" " * 400)
        st, _, body = split_answer(got)
        check("deadlines: a slow-drip body gets 408 in JSON", st == 408 and is_oai_error(body, 408)
              and "http_body_timeout_ms" in body["error"]["message"], got[:300])
        check("deadlines: cut off in time", took < 3.0, took)
        # a kept-alive connection left idle is closed
        c = http.client.HTTPConnection(r.host, r.port, timeout=10)
        c.request("GET", "/health")
        resp = c.getresponse()
        resp.read()
        t0 = time.monotonic()
        c.sock.settimeout(5)
        try:
            closed = c.sock.recv(1) == b""
        except OSError:
            closed = False
        check("deadlines: an idle kept-alive connection is closed", closed
              and time.monotonic() - t0 < 3.0, time.monotonic() - t0)
        c.close()
        # a connection that never sends anything is closed by the head deadline, silently
        s = socket.create_connection((r.host, r.port), timeout=5)
        try:
            silent = s.recv(100) == b""
        except OSError:
            silent = False
        s.close()
        check("deadlines: a silent connection is closed", silent)
        for phase in ("header", "body", "idle"):
            n = metric(r, "kvr_http_timeouts_total", listener="client", phase=phase)
            check(f"deadlines: {phase} timeouts counted", n is not None and n >= 1, n)
        st, _, _ = r.request("GET", "/health")
        check("deadlines: a normal request still passes", st == 200, st)
    finally:
        r.stop()


def scenario_json_errors():
    r = router("--http-max-header-bytes", 4096, "--http-max-body-bytes", 2048,
               what="router(errors)")
    try:
        cases = (
            ("a malformed request line", b"GARBAGE\r\n\r\n", 400),
            ("a method evhttp does not serve", b"PUT /v1/route HTTP/1.1\r\nHost: x\r\n\r\n", 501),
            ("a body over the limit", b"POST /v1/route HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: 100000000\r\n\r\n", 413),
            ("a body over a lowered limit", b"POST /v1/query HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: 3000\r\n\r\n" + b" " * 3000, 413),
            ("a head over the limit", b"GET /health HTTP/1.1\r\nX: " + b"a" * 5000 + b"\r\n\r\n", 431),
        )
        for what, data, code in cases:
            got = raw(r.host, r.port, data)
            st, head, body = split_answer(got)
            check(f"errors: {what}: {code} in JSON, not an HTML page",
                  st == code and "application/json" in head and is_oai_error(body, code)
                  and b"<HTML" not in got.upper(), got[:300])
        n = metric(r, "kvr_http_rewritten_errors_total", listener="client")
        check("errors: evhttp's own answers are counted", n is not None and n >= 3, n)
        n = metric(r, "kvr_http_header_too_large_total", listener="client")
        check("errors: the oversized head is counted", n == 1, n)
        n = metric(r, "kvr_http_body_too_large_total", listener="client")
        check("errors: the oversized bodies are counted", n == 2, n)
    finally:
        r.stop()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scenario_fd_exhaustion():
    """Out of file descriptors, the router used to spin a core and write hundreds of MB of log.
    Now the listener pauses, the log is rate-limited, and a connection already open is served."""
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
    r = router(what="router(nofile 128)", preexec_fn=limit)
    keep = http.client.HTTPConnection(r.host, r.port, timeout=10)
    socks = []
    try:
        keep.request("GET", "/health")
        check("fds: the kept-alive connection works", keep.getresponse().read() == b"OK\n")
        log0 = len(r.stderr())
        cpu0, t0 = cpu_seconds(r.proc.pid), time.monotonic()
        for _ in range(200):
            socks.append(socket.create_connection((r.host, r.port), timeout=10))
        served, t1 = 0, time.monotonic()
        while time.monotonic() - t1 < 5.0:
            keep.request("GET", "/health")
            served += keep.getresponse().read() == b"OK\n"
            time.sleep(0.25)  # the measurement window, not a synchronisation
        cpu = cpu_seconds(r.proc.pid) - cpu0
        wall = time.monotonic() - t0
        log = len(r.stderr()) - log0
        check("fds: /health keeps answering on an open connection", served >= 10, served)
        check("fds: the router's CPU stays below 20%", cpu / wall < 0.20, (cpu, wall))
        check("fds: its log stays below 1 MB", log < 1_000_000, log)
        check("fds: accept failures are logged", "raise the file-descriptor limit" in r.stderr())
        n = metric(r, "kvr_http_accept_errors_total", listener="client")
        check("fds: and counted", n is not None and n >= 1, n)
        for s in socks:
            s.close()
        socks = []
        check("fds: new connections are served once they close",
              eventually(lambda: r.request("GET", "/health", timeout=5)[0] == 200, 15))
    finally:
        keep.close()
        for s in socks:
            s.close()
        r.stop()


def scenario_hostile_worker():
    """Every answer the router reads from a worker is bounded: a /health (and /metrics) body
    that never ends fails the probe (the worker is fenced), a head of a megabyte fails the
    request (502); the router's peak memory stays small."""
    h = FloodHttp(300 << 20)
    r = router("--worker", f"id=1,url={h.url}", "--health-interval-ms", "200",
               "--health-failures", "1", "--router-mode", "round-robin")
    try:
        base = proc_kib(r.proc.pid, "VmHWM")

        def fenced():
            st, ws = r.call("GET", "/v1/workers")
            return st == 200 and ws["workers"][0]["fenced"]
        check("hostile worker: an endless /health fences it", eventually(fenced, 10))
        check("hostile worker: its flood was cut short (not 300 MiB read)", h.sent < (64 << 20),
              h.sent)
        r2 = router("--worker", f"id=1,url={h.url}", "--health-interval-ms", "600000",
                    what="router without probes")
        try:
            st, b = r2.call("POST", "/v1/completions", {"model": "m", "prompt": [1, 2, 3],
                                                        "max_tokens": 1})
            check("hostile worker: a megabyte of headers fails the call (no worker left: 503)",
                  st == 503 and "protocol" in b["error"]["message"], (st, b))
            peak = proc_kib(r2.proc.pid, "VmHWM")
            check("hostile worker: the second router's peak RSS stays under 64 MiB",
                  peak < 65536, peak)
        finally:
            r2.stop()
        peak = proc_kib(r.proc.pid, "VmHWM")
        check("hostile worker: the probing router's peak RSS grew < 32 MiB", peak - base < 32768,
              (base, peak))
    finally:
        r.stop()
        h.close()


def main():
    run_scenarios((("hostile_worker", scenario_hostile_worker), ("tokens", scenario_tokens), ("admin_plane", scenario_admin_plane),
                   ("connection_limit", scenario_connection_limit),
                   ("deadlines", scenario_deadlines), ("json_errors", scenario_json_errors),
                   ("fd_exhaustion", scenario_fd_exhaustion)), SEED)


if __name__ == "__main__":
    main()
