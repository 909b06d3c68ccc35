"""Helpers shared by the integration tests (run as /usr/bin/python3 tests/integration/test_X.py,
so this directory is on sys.path): polling with a deadline, free loopback ports, reading a
child's stdout line without hanging, and splitting an SSE body strictly."""
import os
import select
import socket
import time


def eventually(fn, timeout=10.0, interval=0.03):
    """Poll until fn() is truthy or the deadline passes; returns the last value."""
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > end:
            return v
        time.sleep(interval)


def free_ports(n=1):
    """A base port P with P .. P+n-1 free on 127.0.0.1 (bound then closed; racy but short)."""
    for _ in range(200):
        socks = []
        try:
            s0 = socket.socket()
            s0.bind(("127.0.0.1", 0))
            socks.append(s0)
            p = s0.getsockname()[1]
            if p + n > 65535:
                continue
            for k in range(1, n):
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
