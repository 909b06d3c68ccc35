#!/usr/bin/env python3
"""check_layers.py: the tree's dependency rules, checked from the sources.

Each folder of src/ is a layer or a service; CMakeLists.txt lists, per folder, the folders it
may see (set(KVR_SEES_<folder> ...)), and gives each target an include path of exactly those.
This script states the same rules for CI and names the offending line:

  * a quoted include "<folder>/<file>.h" in src/<f>/ must name a folder f may see, and a file
    that exists;
  * the public headers (include/kvrouter.h, include/kvrouter/*.h) include only each other, and
    src/base/ may include only kvrouter/status.h of them (base is under core);
  * another folder of src/ includes http and the services (fleet, api, frontend, cluster,
    indexer, mocker) only through their one header, <folder>/<folder>.h;
  * bench/ may include anything but apps/ other than apps/child.h and apps/cli.h;
  * no cycle between files anywhere in src/: file A depends on B when it includes B, or calls
    a function B defines (a non-static definition); two files that depend on each other,
    directly or through others, are one module in two files: split it by callbacks instead;
  * with --docs FILE: every source file under src/ is named in FILE (docs/architecture.md).

Usage: check_layers.py [--root DIR] [--docs FILE] [--self-test]
Exit: 0 clean, 1 a rule broken (each breach on one line), 2 usage or an unreadable tree.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SEES = re.compile(r'set\(KVR_SEES_(\w+)\s+([^)]*)\)')
BASE_PUBLIC = {"kvrouter/status.h"}
# Services an outsider (another folder of src/) reaches through one header, <folder>/<folder>.h.
CONTRACTS = {"http", "fleet", "api", "frontend", "cluster", "indexer", "ui", "mocker"}


def read_rules(root):
    text = open(os.path.join(root, "CMakeLists.txt")).read()
    text = re.sub(r'#[^\n]*', '', text)
    return {m.group(1): set(m.group(2).split()) for m in SEES.finditer(text)}


def sources(root):
    """{relative path: text} of src/, include/ and bench/."""
    out = {}
    for top in ("src", "include", "bench"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith((".c", ".h")):
                    p = os.path.join(d, f)
                    out[os.path.relpath(p, root)] = open(p, errors="replace").read()
    return out


def resolve(files, path, inc):
    """The file an include names, as a key of files (or None)."""
    here = os.path.normpath(os.path.join(os.path.dirname(path), inc))
    for cand in (here, "src/" + inc, "include/" + inc, "bench/" + inc):
        if cand in files:
            return cand
    return None


def check(files, rules):
    errs, edges = [], {}
    folders = {p.split("/")[1] for p in files if p.startswith("src/") and p.count("/") >= 2}
    for f in sorted(folders - set(rules)):
        errs.append(f"src/{f}/: no KVR_SEES_{f} in CMakeLists.txt (which folders may it see?)")
    for path, text in sorted(files.items()):
        parts = path.split("/")
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            where = f"{path}:{line}: #include \"{inc}\""
            target = resolve(files, path, inc)
            if target is None:
                errs.append(f"{where}: no such file in src/, include/ or bench/")
                continue
            edges.setdefault(path, set()).add(target)
            tparts = target.split("/")
            if parts[0] == "include":
                if tparts[0] != "include":
                    errs.append(f"{where}: a public header includes a private one")
            elif parts[0] == "bench":
                if target.startswith("src/apps/") and tparts[2] not in ("child.h", "cli.h"):
                    errs.append(f"{where}: bench uses apps/child.h and apps/cli.h only")
            elif parts[0] == "src" and len(parts) >= 3:
                mine = parts[1]
                if tparts[0] == "include":
                    if mine == "base" and "/".join(tparts[1:]) not in BASE_PUBLIC:
                        errs.append(f"{where}: base is under core: of the public headers it may "
                                    f"include only {', '.join(sorted(BASE_PUBLIC))}")
                elif tparts[0] == "bench":
                    errs.append(f"{where}: the product never includes the benchmarks")
                elif tparts[0] == "src" and tparts[1] not in rules.get(mine, ()):
                    errs.append(f"{where}: src/{mine} may not see src/{tparts[1]} (it sees: "
                                f"{' '.join(sorted(rules.get(mine, ())))})")
                elif (tparts[0] == "src" and tparts[1] != mine and tparts[1] in CONTRACTS and
                      tparts[2] != tparts[1] + ".h"):
                    errs.append(f"{where}: outside src/{tparts[1]}, include its one header, "
                                f"{tparts[1]}/{tparts[1]}.h")
    add_call_edges(files, edges)
    errs += cycles(edges)
    return errs


COMMENT = re.compile(r'/\*.*?\*/|//[^\n]*', re.S)
DEFINITION = re.compile(r'^(?!static\b)[A-Za-z_][\w \*]*?[\s\*](\w+)\s*\([^;{]*\)\s*\{', re.M | re.S)
CALL = re.compile(r'\b(\w+)\s*\(')


def add_call_edges(files, edges):
    """A .c file calling a function another .c file of src/ defines depends on that file."""
    code = {p: COMMENT.sub('', t) for p, t in files.items()
            if p.startswith("src/") and p.endswith(".c")}
    where = {}
    for p, t in sorted(code.items()):
        for m in DEFINITION.finditer(t):
            where.setdefault(m.group(1), p)
    for p, t in code.items():
        for m in CALL.finditer(t):
            q = where.get(m.group(1))
            if q is not None and q != p:
                edges.setdefault(p, set()).add(q)


def cycles(edges):
    """The groups of files that depend on each other (strongly connected, Tarjan), one line
    each; a file including itself counts."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in edges.get(v, ()):
                out.append("dependency cycle (includes or calls): " + " <-> ".join(sorted(group)))

    for n in sorted(edges):
        if n not in index:
            visit(n)
    return out


def check_docs(files, doc_path):
    """Each source file of src/ named on the page (its name, as `name` or in a list of
    names); a header also counts as named when its .c is (one module, two files)."""
    text = open(doc_path).read()
    named = set(re.findall(r'[A-Za-z0-9_]+\.[ch]\b', text))
    errs = []
    for p in sorted(files):
        if not p.startswith("src/"):
            continue
        base = os.path.basename(p)
        if base in named or (base.endswith(".h") and base[:-2] + ".c" in named):
            continue
        errs.append(f"{p}: not named in {os.path.relpath(doc_path)}")
    return errs


def self_test(root, rules):
    """The checker must catch what it exists for: plant each breach in a copy of the tree."""
    files = sources(root)
    base_errs = check(files, rules)
    core = next(p for p in sorted(files) if p.startswith("src/core/") and p.endswith(".c"))
    plants = {
        "wrong direction": (core, '#include "api/api.h"\n'),
        "peer services": ("src/frontend/frontend.c", '#include "cluster/replicas.h"\n'),
        "missing file": (core, '#include "core/no_such_header.h"\n'),
        "public to private": ("include/kvrouter.h", '#include "core/endpoint.h"\n'),
        "past a contract": ("src/apps/cmd_serve.c", '#include "fleet/fleet_int.h"\n'),
        "cycle": ("src/base/grow.h", '#include "base/grow.h"\n'),
    }
    failed = 0
    for name, (path, line) in plants.items():
        if path not in files:
            print(f"self-test: {name}: {path} is not in the tree", file=sys.stderr)
            failed += 1
            continue
        planted = dict(files)
        planted[path] = line + files[path]
        errs = [e for e in check(planted, rules) if e not in base_errs]
        if not errs:
            print(f"self-test: a planted {name} include in {path} was not caught",
                  file=sys.stderr)
            failed += 1
        else:
            print(f"self-test: planted {name}: caught: {errs[0]}")
    doc = os.path.join(root, "docs", "architecture.md")
    if os.path.exists(doc):
        planted = dict(files)
        planted["src/core/planted_unnamed.c"] = "int kvr_planted(void);\n"
        errs = check_docs(planted, doc)
        if not any("planted_unnamed.c" in e for e in errs):
            print("self-test: a source file missing from the page was not caught",
                  file=sys.stderr)
            failed += 1
        else:
            print(f"self-test: planted an unnamed file: caught: {errs[-1]}")
    return 1 if failed else 0


def main(argv):
    root, docs, selftest = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), None, False
    args = iter(argv)
    for a in args:
        if a == "--root":
            root = next(args, None)
        elif a == "--docs":
            docs = next(args, None)
        elif a == "--self-test":
            selftest = True
        else:
            print(__doc__, file=sys.stderr)
            return 2
    if root is None or (docs is None and "--docs" in argv):
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.normpath(root)
    rules = read_rules(root)
    if not rules:
        print("check_layers: no KVR_SEES_* rules in CMakeLists.txt", file=sys.stderr)
        return 2
    if selftest:
        return self_test(root, rules)
    files = sources(root)
    errs = check(files, rules)
    if docs is not None:
        errs += check_docs(files, os.path.join(root, docs) if not os.path.isabs(docs) else docs)
    for e in errs:
        print(e)
    if not errs:
        print(f"check_layers: {len(files)} files, {len(rules)} folders: every include goes down "
              f"the layers, no cycle" + (f", every source named in {docs}" if docs else ""))
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
