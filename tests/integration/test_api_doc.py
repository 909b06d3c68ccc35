#!/usr/bin/python3
"""docs/api.md, the HTTP API reference, against the sources and the real binaries.

  - routes: every route the sources answer is a literal compared with the request's path in a
    handler, `strcmp(path, "/x")` (an exact path) or `strncmp(path, "/x/", n)` (a prefix whose
    rest is a path parameter), found in src/**/*.c by ROUTE_RE below. Each must have a heading
    `#### METHOD[, METHOD] /path` in the section of docs/api.md of the server whose source
    answers it (a section starts at `<!-- server: NAME -->`; SERVERS maps source files to
    servers), a prefix route documented with a placeholder (`/v1/requests/{id}`, and
    sub-paths of it). Every heading must name a route its server's sources answer, and every
    URL of an example a route of the server on that URL's port (no stale documentation);
  - examples: the `<!-- setup -->` block's commands (kvrouter mocker, serve, indexer) are
    started with every port of the page rewritten to a free loopback port; once the router is
    ready and the engines see their subscribers, every ```sh block runs with bash, in order
    (`set -eo pipefail`; `curl` and `kvrouter` on PATH: curl through a wrapper that records
    each answer's status line). Each must exit 0 and each HTTP status be 2xx, or the status of
    a preceding `<!-- expect: NNN -->`. A ```json block right after an example is its answer:
    the real answer must have the same fields (names at every depth; maps keyed by ids or
    `model:group` compared by their values). Every ```json block and every -d body is valid
    JSON (but a body an `expect: 400` example sends on purpose); every fence is sh, json or
    text;
  - everything started is stopped with SIGTERM and must exit 0.
Usage: test_api_doc.py <path to kvrouter>. Needs curl (fails naming it when absent).
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvr_harness import Child, check, eventually, free_ports, kill_children, run_main

KVR = os.path.abspath(sys.argv[1])
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "api.md"

# A handler's comparison of the request path with a literal: group 1 "n" for strncmp (a
# prefix), group 2 the literal. The path variable is called `path` in every handler.
ROUTE_RE = re.compile(r'\bstr(n?)cmp\(\s*path\s*,\s*"(/[^"]*)"')
# Which server answers the routes of a source file (the first prefix that matches).
SERVERS = [
    ("src/indexer/ix_api.c", ("serve", "indexer")),  # serve --serve-indexer and the indexer
    ("src/indexer/indexer_server.c", ("indexer",)),
    ("src/api/", ("serve",)),
    ("src/frontend/", ("serve",)),
    ("src/cluster/", ("serve",)),
    ("src/ui/", ("serve",)),
    ("src/http/", ("serve",)),  # access.c: serve's access classes
    ("src/mocker/", ("mocker",)),
]
HEADING_RE = re.compile(r"^#{2,6}\s+((?:GET|POST|DELETE)(?:,\s*(?:GET|POST|DELETE))*)\s+(/\S*)\s*$")
PORT_RE = re.compile(r"(127\.0\.0\.1:|\*:|--port |--http-port |--bootstrap-port )(\d+)\b")
URL_RE = re.compile(r"https?://([^/\s:'\"]+)(?::(\d+))?(/[^\s'\"?]*)?")
SUBCOMMANDS = ("mocker", "serve", "indexer")


# ---- the sources' routes ------------------------------------------------------------------

def source_routes():
    """{server: {(literal, is_prefix): 'file:line'}}; unmapped files are failed checks."""
    out = {"serve": {}, "indexer": {}, "mocker": {}}
    for f in sorted((ROOT / "src").rglob("*.c")):
        rel = f.relative_to(ROOT).as_posix()
        text = f.read_text(errors="replace")
        for m in ROUTE_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            servers = next((s for p, s in SERVERS if rel.startswith(p)), None)
            if not check(f"{rel}:{line} ({m.group(2)}) belongs to a known server", servers,
                         "add the file to SERVERS in tests/integration/test_api_doc.py"):
                continue
            for s in servers:
                out[s].setdefault((m.group(2), m.group(1) == "n"), f"{rel}:{line}")
    return out


def path_matches(doc_path, route):
    """A heading's path against a route: a prefix route's rest is a `{placeholder}`, and may
    go on with a sub-path (`/v1/requests/{id}/first_token`)."""
    literal, prefix = route
    if not prefix:
        return doc_path == literal
    return re.fullmatch(re.escape(literal) + r"\{[a-z_]+\}(/[a-z_]+)?", doc_path) is not None


def url_matches(path, route):
    """An example URL's path against a route (a prefix route's rest is a concrete value)."""
    literal, prefix = route
    return path.startswith(literal) and len(path) > len(literal) if prefix else path == literal


BODY_RE = re.compile(r"-d '[^']*'")


# ---- the page ----------------------------------------------------------------------------

class Block:
    def __init__(self, lang, text, line, marker, server):
        self.lang, self.text, self.line, self.marker, self.server = lang, text, line, marker, server
        self.next = None  # the next fenced block


def parse_doc(text):
    """(headings [(server, methods, path, line)], blocks [Block])."""
    headings, blocks = [], []
    server = None
    lines = text.split("\n")
    i = 0
    last_comment = None  # the HTML comment on the last non-blank line, if it was one
    while i < len(lines):
        ln = lines[i]
        m = re.fullmatch(r"<!--\s*server:\s*(\w+)\s*-->", ln.strip())
        if m:
            server = m.group(1)
        h = HEADING_RE.match(ln)
        if h:
            headings.append((server, h.group(1), h.group(2), i + 1))
        if ln.startswith("```"):
            lang = ln[3:].strip()
            start = i
            body = []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append(Block(lang, "\n".join(body) + "\n", start + 1, last_comment, server))
            last_comment = None
            i += 1
            continue
        if ln.strip():
            c = re.fullmatch(r"<!--\s*(.*?)\s*-->", ln.strip())
            last_comment = c.group(1) if c else None
        i += 1
    for a, b in zip(blocks, blocks[1:]):
        a.next = b
    return headings, blocks


def check_routes(routes, headings, blocks, port_server):
    for server, rs in routes.items():
        mine = [(p, ln) for s, _, p, ln in headings if s == server]
        for route, where in sorted(rs.items()):
            shown = route[0] + ("{...}" if route[1] else "")
            check(f"{server} route {shown} ({where}) has a heading in docs/api.md",
                  any(path_matches(p, route) for p, _ in mine),
                  f"no `#### METHOD {shown}` heading in the section <!-- server: {server} -->")
    for server, methods, path, ln in headings:
        check(f"docs/api.md:{ln} {methods} {path}: a route {server} answers",
              server in routes and any(path_matches(path, r) for r in routes[server]),
              f"no handler of {server} compares the path with {path} (stale documentation?)")
    for b in blocks:
        if b.lang != "sh" or b.marker == "setup":
            continue
        for host, port, path in URL_RE.findall(BODY_RE.sub("", b.text)):  # calls, not bodies
            where = f"docs/api.md:{b.line}: http://{host}:{port}{path}"
            if not check(f"{where} names a server of the set-up",
                         host == "127.0.0.1" and port in port_server,
                         "examples call 127.0.0.1 on a port of the set-up"):
                continue
            srv = port_server[port]
            check(f"{where}: a route {srv} answers",
                  any(url_matches(path or "/", r) for r in routes[srv]), path)


def check_json_text(blocks):
    for b in blocks:
        check(f"docs/api.md:{b.line}: a fence is sh, json or text",
              b.lang in ("sh", "json", "text"), b.lang)
        if b.lang == "json":
            try:
                json.loads(b.text)
                ok = True
            except ValueError as e:
                ok = e
            check(f"docs/api.md:{b.line}: the ```json block is JSON", ok is True, repr(ok))
        if b.lang == "sh" and b.marker != "expect: 400":
            for body in re.findall(r"-d '([^']*)'", b.text):
                try:
                    json.loads(body)
                    ok = True
                except ValueError as e:
                    ok = e
                check(f"docs/api.md:{b.line}: the body {body[:60]}... is JSON", ok is True,
                      repr(ok))


# ---- answers' fields ----------------------------------------------------------------------

def shape(v):
    """Field names at every depth: a dict of shapes, ('list', shape), or None (a scalar, an
    empty container). A map keyed by ids or `model:group` is {'<key>': its values' shape}."""
    if isinstance(v, dict):
        if not v:
            return None
        if all(re.fullmatch(r"\d+", k) or ":" in k for k in v):
            return {"<key>": merge([shape(x) for x in v.values()])}
        return {k: shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return ("list", merge([shape(x) for x in v])) if v else None
    return None


def merge(shapes):
    out = None
    for s in shapes:
        if s is None:
            continue
        if out is None:
            out = s
        elif isinstance(out, dict) and isinstance(s, dict):
            out = {k: merge([out.get(k), s.get(k)]) for k in {**out, **s}}
        elif isinstance(out, tuple) and isinstance(s, tuple):
            out = ("list", merge([out[1], s[1]]))
    return out


def diff(doc, real, where="answer"):
    """Differences in field names between the documented and the real answer."""
    out = []
    if isinstance(doc, dict) and isinstance(real, dict):
        for k in sorted(set(doc) - set(real)):
            out.append(f"{where}.{k}: documented, not in the real answer")
        for k in sorted(set(real) - set(doc)):
            out.append(f"{where}.{k}: in the real answer, not documented")
        for k in sorted(set(doc) & set(real)):
            out += diff(doc[k], real[k], f"{where}.{k}")
    elif isinstance(doc, tuple) and isinstance(real, tuple):
        out += diff(doc[1], real[1], where + "[]")
    return out


# ---- the set-up and the examples ----------------------------------------------------------

def commands(block):
    text = re.sub(r"\\\n\s*", " ", block.text)
    out = []
    for ln in text.split("\n"):
        ln = ln.split(" #", 1)[0].strip() if not ln.strip().startswith("#") else ""
        if not ln:
            continue
        argv = shlex.split(ln.rstrip("&").strip())
        check(f"setup command is kvrouter {'|'.join(SUBCOMMANDS)}: {ln[:60]}",
              argv[:1] == ["kvrouter"] and argv[1:2] and argv[1] in SUBCOMMANDS, argv[:2])
        out.append(argv)
    return out


def rewrite(text, ports):
    """text with every port of the set-up replaced by its free port; a port outside the
    set-up is a KeyError, but inside a -d body (a url that is only stored, never called)."""
    def sub(m):
        p = int(m.group(2))
        if p not in ports:
            raise KeyError(p)
        return m.group(1) + str(ports[p])

    def body(m):
        return PORT_RE.sub(lambda n: n.group(1) + str(ports.get(int(n.group(2)), n.group(2))),
                           m.group(0))
    parts = []
    last = 0
    for m in BODY_RE.finditer(text):
        parts += [PORT_RE.sub(sub, text[last:m.start()]), body(m)]
        last = m.end()
    return "".join(parts + [PORT_RE.sub(sub, text[last:])])


def own_port(argv):
    for flag in ("--http-port", "--port"):
        if flag in argv:
            return int(argv[argv.index(flag) + 1])
    return None


def start(setup_cmds, setup_text):
    """Children of the set-up on free ports: ([(argv, child)], {doc port: free port})."""
    doc_ports = sorted({int(p) for _, p in PORT_RE.findall(setup_text)})
    for attempt in range(6):
        base = free_ports(len(doc_ports))
        ports = {p: base + i for i, p in enumerate(doc_ports)}
        started = []
        try:
            for argv in setup_cmds:
                real = shlex.split(rewrite(shlex.join(argv), ports))
                started.append((argv, Child([KVR] + real[1:], f"{argv[1]} :{own_port(argv)}")))
            return started, ports
        except RuntimeError as e:
            for _, c in started:
                c.kill()
            if "in use" not in str(e) and "bind" not in str(e) or attempt == 5:
                raise
    raise AssertionError("unreachable")


def wait_ready(started):
    for argv, c in started:
        if argv[1] in ("serve", "indexer"):
            ok = eventually(lambda: c.request("GET", "/ready", timeout=5)[0] == 200, timeout=20)
            check(f"{c.what} is ready", ok, c.stderr()[-1500:])
    for argv, c in started:
        if argv[1] != "mocker" or "--kv-events-config" not in argv:
            continue
        cfg = json.loads(argv[argv.index("--kv-events-config") + 1])
        ev = cfg["endpoint"].rsplit(":", 1)[1]
        subs = sum(1 for a, _ in started if a is not argv and
                   f"tcp://127.0.0.1:{ev}" in " ".join(a))
        ok = eventually(lambda: (c.metric("kvr_mocker_kv_event_subscribers") or 0) >= subs,
                        timeout=20)
        check(f"{c.what} sees its {subs} KV-event subscribers", ok,
              c.metric("kvr_mocker_kv_event_subscribers"))


def curl_wrapper(tmp, real_curl):
    d = Path(tmp) / "bin"
    d.mkdir()
    w = d / "curl"
    w.write_text("#!/bin/sh\n"
                 'f=$(mktemp "$KVR_DOC_HEADS/head.XXXXXXXX")\n'
                 f'exec {shlex.quote(real_curl)} -D "$f" "$@"\n')
    w.chmod(0o755)
    (d / "kvrouter").symlink_to(KVR)
    return str(d)


def statuses(heads):
    out = []
    for f in sorted(Path(heads).iterdir()):
        codes = re.findall(r"^HTTP/\S+ (\d{3})", f.read_text(errors="replace"), re.M)
        out.append(int(codes[-1]) if codes else None)
        f.unlink()
    return out


def heading_of(headings, line):
    before = [f"{m} {p}" for _, m, p, ln in headings if ln < line]
    return before[-1] if before else "(top)"


def run_examples(blocks, headings, ports, tmp):
    bindir = curl_wrapper(tmp, shutil.which("curl"))
    heads = Path(tmp) / "heads"
    heads.mkdir()
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
           "KVR_DOC_HEADS": str(heads)}
    n = 0
    for b in blocks:
        if b.lang != "sh" or b.marker == "setup":
            continue
        n += 1
        where = f"docs/api.md:{b.line} ({heading_of(headings, b.line)})"
        try:
            script = "set -eo pipefail\n" + rewrite(b.text, ports)
        except KeyError as e:
            check(f"{where}: every port is one of the set-up's", False, f"port {e}")
            continue
        p = subprocess.run(["bash", "-c", script], cwd=tmp, env=env, capture_output=True,
                           text=True, timeout=60)
        check(f"{where} exits 0", p.returncode == 0,
              f"rc {p.returncode}\nstdout: {p.stdout[-800:]}\nstderr: {p.stderr[-800:]}")
        got = statuses(heads)
        m = re.fullmatch(r"expect:\s*(\d{3})", b.marker or "")
        if "curl" in b.text:
            ok = bool(got) and all(s is not None and (s == int(m.group(1)) if m else 200 <= s < 300)
                                   for s in got)
            check(f"{where} answers {m.group(1) if m else '2xx'}", ok,
                  f"statuses {got}; stdout: {p.stdout[-600:]}")
        if b.next is not None and b.next.lang == "json" and p.returncode == 0:
            try:
                real = json.loads(p.stdout)
            except ValueError:
                check(f"{where}: the answer is one JSON value, as documented", False,
                      p.stdout[-600:])
                continue
            d = diff(shape(json.loads(b.next.text)), shape(real))
            check(f"{where}: the answer has the documented fields (docs/api.md:{b.next.line})",
                  not d, "\n".join(d) + "\nreal answer: " + p.stdout[-1200:])
    return n


def main():
    t0 = time.monotonic()
    text = DOC.read_text()
    headings, blocks = parse_doc(text)
    routes = source_routes()
    n_routes = sum(len(r) for r in routes.values())
    check("the sources answer routes (ROUTE_RE still finds them)", n_routes >= 40, n_routes)
    setup = [b for b in blocks if b.marker == "setup"]
    check("docs/api.md has one <!-- setup --> ```sh block", len(setup) == 1 and
          setup[0].lang == "sh", len(setup))
    cmds = commands(setup[0]) if setup else []
    port_server = {}
    for argv in cmds:
        p = own_port(argv)
        if p is not None:
            port_server[str(p)] = argv[1]
        if "--bootstrap-port" in argv:
            port_server[argv[argv.index("--bootstrap-port") + 1]] = argv[1]
    check_routes(routes, headings, blocks, port_server)
    check_json_text(blocks)
    print(f"  {len(headings)} endpoint headings, {n_routes} (server, route) pairs in the "
          f"sources", flush=True)
    real_curl = shutil.which("curl")
    if not check("curl is installed (the examples are curl commands)", real_curl,
                 "install curl (Debian: apt-get install curl)"):
        return
    started = []
    try:
        with tempfile.TemporaryDirectory(prefix="kvr-apidoc-") as tmp:
            started, ports = start(cmds, setup[0].text)
            wait_ready(started)
            n = run_examples(blocks, headings, ports, tmp)
            print(f"  {n} examples run against {len(started)} processes", flush=True)
            for argv, c in sorted(started, key=lambda x: x[0][1] == "mocker"):
                c.stop()
    finally:
        kill_children()
    print(f"  {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    run_main(main, "test_api_doc")
