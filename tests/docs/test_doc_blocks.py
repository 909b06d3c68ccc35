#!/usr/bin/python3
"""Every shell block of the README and docs/ runs as written, or says why it cannot.

  - each fenced block whose language is sh (or bash, shell, console) in README.md and
    docs/*.md carries, on the line before it, either `<!-- doc-run -->` (this test runs it) or
    `<!-- illustration: WHY -->` (it needs what a test machine has not: GPUs and vLLM, other
    hosts); an unlabelled block that starts with a command (kvrouter, curl, make, ...) is a
    failure too: label it. docs/api.md is left to test_api_doc.py, which runs all of its own;
  - the doc-run blocks of a page run in the page's order, each with bash (`set -eo pipefail`)
    in one scratch directory per page where `./build/kvrouter` and `kvrouter` are the binary
    under test, with every port the page's run blocks use (host:port, port flags, a `for p in`
    list of ports) moved to a free loopback port and
    the absolute paths a recipe writes (/etc/kvrouter, /tmp/nats) moved into the scratch
    directory. A block must exit 0; a curl in it must get a 2xx (the wrapper fails it
    otherwise). A command the block leaves running (a line ending in `&`: a mocker, a router,
    an indexer, nats-server) must be answering on its port before the next block runs
    (polled, with a bound); everything is stopped when the page is done.
Usage: test_doc_blocks.py <path to kvrouter>. Needs curl and nats-server (installed by
scripts/install-deps.sh; the test fails naming what is missing).
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from kvr_harness import check, eventually, free_ports, run_main  # noqa: E402

KVR = os.path.abspath(sys.argv[1])
SHELL_LANGS = ("sh", "bash", "shell", "console")
COMMANDS = ("kvrouter", "./build/kvrouter", "curl", "make", "nats-server", "vllm", "python",
            "echo", "cmake", "sudo", "apt-get", "git")
# Ports a page's commands use: host:port (loopback and wildcard binds), and port flags.
PORT_RE = re.compile(r"((?:127\.0\.0\.1|localhost|\*|0\.0\.0\.0):|"
                     r"(?:--port|--http-port|--admin-port|--bootstrap-port|-p)[ =])(\d{2,5})\b")
PATHS = ("/etc/kvrouter", "/tmp/nats")


class Block:
    def __init__(self, path, lang, text, line, marker):
        self.path, self.lang, self.text, self.line, self.marker = path, lang, text, line, marker

    @property
    def where(self):
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse(path):
    blocks, last_comment = [], None
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("```"):
            lang, start, body = ln[3:].strip(), i, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append(Block(path, lang, "\n".join(body) + "\n", start + 1, last_comment))
            last_comment = None
        elif ln.strip():
            c = re.fullmatch(r"<!--\s*(.*?)\s*-->", ln.strip())
            last_comment = c.group(1) if c else None
        i += 1
    return blocks


def first_word(text):
    for ln in text.split("\n"):
        ln = ln.strip()
        if ln and not ln.startswith("#"):
            return ln.split()[0]
    return ""


def classify(blocks):
    """The page's doc-run blocks; every other shell block must be an illustration."""
    runs = []
    for b in blocks:
        if b.lang in SHELL_LANGS:
            marker = b.marker or ""
            if marker == "doc-run":
                runs.append(b)
            else:
                check(f"{b.where}: the shell block is run (<!-- doc-run -->) or says why not "
                      f"(<!-- illustration: why -->)",
                      marker.startswith("illustration:") and len(marker) > 20, marker)
        elif b.lang == "":
            check(f"{b.where}: an unlabelled block is no command (label it sh or text)",
                  first_word(b.text) not in COMMANDS, b.text[:120])
    return runs


# ---- running a page ------------------------------------------------------------------------

def port_map(runs):
    ports = sorted({int(p) for b in runs for _, p in PORT_RE.findall(b.text)} |
                   {int(x) for b in runs for m in LOOP_RE.finditer(b.text) for x in m.group(2).split()})
    base = free_ports(len(ports)) if ports else 0
    return {p: (base if len(ports) == 1 else base + i) for i, p in enumerate(ports)}


# A shell loop over ports (`for p in 8001 8002; do ... localhost:$p ...`): its list is ports too.
LOOP_RE = re.compile(r"(for \w+ in )([\d ]+)(;)")


def rewrite(text, ports, scratch):
    text = PORT_RE.sub(lambda m: m.group(1) + str(ports[int(m.group(2))]), text)
    text = LOOP_RE.sub(lambda m: m.group(1) + " ".join(str(ports[int(x)]) for x in
                                                       m.group(2).split()) + m.group(3), text)
    for p in PATHS:
        text = text.replace(p, os.path.join(scratch, p.strip("/").replace("/", "-")))
    return text


def tools(scratch):
    """A bin directory: kvrouter (the binary under test) and a curl that fails on >= 400."""
    d = Path(scratch) / "bin"
    d.mkdir()
    (d / "kvrouter").symlink_to(KVR)
    real = shutil.which("curl")
    (d / "curl").write_text("#!/bin/sh\n"
                            f'exec {real} --fail-with-body --max-time 60 "$@"\n')
    (d / "curl").chmod(0o755)
    b = Path(scratch) / "build"
    b.mkdir()
    (b / "kvrouter").symlink_to(KVR)
    (Path(scratch) / "data").symlink_to(ROOT / "data")  # the pages run from the repository root
    return str(d)


def answers(port, http):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            if not http:
                return True
            s.sendall(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.")
    except OSError:
        return False


def left_running(text):
    """(port, http?) of each command the block leaves running (a line ending in '&')."""
    out = []
    joined = re.sub(r"\\\n\s*", " ", text)
    for ln in joined.split("\n"):
        ln = ln.split(" #", 1)[0].strip()
        if not ln.endswith("&"):
            continue
        m = re.search(r"(?:--port|--http-port|-p)[ =](\d+)", ln)
        if m:
            out.append((int(m.group(1)), "nats-server" not in ln))
    return out


def run_page(path, runs):
    scratch = tempfile.mkdtemp(prefix="kvr-docs-")
    groups = []
    try:
        ports = port_map(runs)
        env = {**os.environ, "PATH": tools(scratch) + os.pathsep + os.environ.get("PATH", "")}
        for b in runs:
            script = "set -eo pipefail\n" + rewrite(b.text, ports, scratch)
            log = open(os.path.join(scratch, f"block-{b.line}.log"), "w+")
            t0 = time.monotonic()
            p = subprocess.Popen(["bash", "-c", script], cwd=scratch, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
            groups.append(p.pid)
            try:
                rc = p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                rc = "timed out after 300 s"
            log.seek(0)
            out = log.read()
            took = time.monotonic() - t0
            check(f"{b.where} exits 0 ({took:.1f} s)", rc == 0, f"rc {rc}\n{out[-1500:]}")
            print(f"  {b.where}: {took:.1f} s", flush=True)
            for port, http in left_running(rewrite(b.text, ports, scratch)):
                ok = eventually(lambda: answers(port, http), timeout=30, interval=0.05)
                check(f"{b.where}: what it leaves running answers on its port", ok,
                      f"port {port}\n{out[-1500:]}")
    finally:
        for g in groups:
            try:
                os.killpg(g, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for g in groups:
            while time.monotonic() < deadline:
                try:
                    os.killpg(g, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)  # noqa: waiting for exits, bounded by the deadline
            try:
                os.killpg(g, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(scratch, ignore_errors=True)


def main():
    t0 = time.monotonic()
    for tool in ("curl", "nats-server", "bash"):
        check(f"{tool} is installed (scripts/install-deps.sh installs it)",
              shutil.which(tool) is not None)
    pages = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md")
                                          if p.name != "api.md")
    total = 0
    for path in pages:
        runs = classify(parse(path))
        if runs:
            run_page(path, runs)
            total += len(runs)
    check("the pages have blocks that run", total >= 8, total)
    print(f"  {total} blocks run from {len(pages)} pages, {time.monotonic() - t0:.1f} s",
          flush=True)


if __name__ == "__main__":
    run_main(main, "test_doc_blocks")
