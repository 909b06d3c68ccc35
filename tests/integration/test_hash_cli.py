#!/usr/bin/python3
"""Integration test of `kvrouter hash` (standard library only).

usage: test_hash_cli.py <path to kvrouter>   (env KVR_TEST_DATA: folder with hash-vectors.json)

Checks: every golden case through one process, exact output text; bad lines give one error
line naming the line and the problem while later lines still hash, exit code 1; blank lines
are skipped; a 128K-token prompt; --help and usage errors.
"""
import json
import os
import random
import subprocess
import sys
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/kvrouter"
DATA = os.environ.get("KVR_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))

passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}: {detail}"[:2000])


def run(args, stdin_bytes, timeout=300):
    p = subprocess.run([BIN] + args, input=stdin_bytes, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def expected_line(lbh, seq):
    return json.dumps({"local_block_hashes": lbh, "sequence_hashes": seq}, separators=(",", ":"))


def test_vectors():
    with open(os.path.join(DATA, "hash-vectors.json")) as f:
        cases = json.load(f)["cases"]
    check("vector count", len(cases) == 60, f"{len(cases)} cases")
    # Whole cases (the expected fields and "seed" ride along as unknown keys), then only the
    # input fields, compact, in one process.
    lines = [json.dumps(c) for c in cases]
    inputs = ("block_size", "tokens", "lora_name", "cache_namespace", "is_eagle",
              "block_mm_hashes")
    lines += [json.dumps({k: c[k] for k in inputs}, separators=(",", ":"), ensure_ascii=False)
              for c in cases]
    rc, out, err = run(["hash"], ("\n".join(lines) + "\n").encode())
    check("vectors exit 0", rc == 0, f"rc={rc} stderr={err}")
    got = out.split("\n")
    check("vectors one line each", len(got) == len(lines) + 1 and got[-1] == "",
          f"{len(got) - 1} lines for {len(lines)}")
    for i, line in enumerate(lines):
        c = cases[i % len(cases)]
        want = expected_line(c["local_block_hashes"], c["sequence_hashes"])
        have = got[i] if i < len(got) else "<missing>"
        check(f"vector case {i % len(cases)} ({'full' if i < len(cases) else 'inputs'})",
              have == want, f"\n  got  {have[:300]}\n  want {want[:300]}")


def test_bad_lines():
    good = {"tokens": list(range(8)), "block_size": 4}
    good_out = expected_line(["9143094415614847814", "12124091508212882195"],
                             ["9143094415614847814", "9510318385840434533"])
    lines = [
        json.dumps(good),                                                   # 1 ok
        "",                                                                 # 2 blank: skipped
        "{\"tokens\": [1, 2,",                                              # 3 truncated
        json.dumps({"tokens": [1, 2], "block_size": 0}),                    # 4
        json.dumps({"tokens": [0, 1, 2, -1], "block_size": 4}),             # 5
        "   \t",                                                            # 6 blank
        json.dumps({"tokens": [1], "block_size": 1, "block_mm_hashes": {"x": [1]}}),  # 7
        json.dumps(good) + "\r",                                            # 8 ok (CRLF)
        json.dumps({"block_size": 4}),                                      # 9
        json.dumps({"tokens": [1], "block_size": 1, "lora_name": 5}),       # 10
        "[1, 2, 3]",                                                        # 11
        "{\"tokens\":[1],\"block_size\":1,\"is_eagle\":\"yes\\\"\"}",      # 12
        json.dumps(good),                                                   # 13 ok, no newline
    ]
    rc, out, err = run(["hash"], "\n".join(lines).encode())
    check("bad lines exit 1", rc == 1, f"rc={rc} stderr={err}")
    got = out.split("\n")
    check("bad lines: one output line per non-blank line", len(got) == 12 and got[-1] == "",
          f"{len(got) - 1} lines: {out[:500]}")
    want = [
        ("ok",),
        (3, "invalid JSON at byte"),
        (4, "block_size: must be >= 1"),
        (5, "tokens[3]: not an integer in [0, 4294967295]"),
        (7, "block_mm_hashes: key 'x' is not a block index"),
        ("ok",),
        (9, "tokens: missing"),
        (10, "lora_name: must be a string or null"),
        (11, "expected a JSON object"),
        (12, "is_eagle: must be true, false or null"),
        ("ok",),
    ]
    for i, w in enumerate(want):
        have = got[i] if i < len(got) else ""
        if w[0] == "ok":
            check(f"bad lines: output {i} ok", have == good_out, have)
            continue
        try:
            e = json.loads(have)["error"]
            ok = e["line"] == w[0] and e["message"].startswith(w[1]) and set(e) == {"line", "message"}
        except (ValueError, KeyError, TypeError):
            ok = False
        check(f"bad lines: output {i} is the error of line {w[0]}", ok, f"{have!r}")

    rc, out, err = run(["hash"], b"")
    check("empty input", rc == 0 and out == "", f"rc={rc} out={out!r}")
    rc, out, err = run(["hash"], b"\n\n  \n")
    check("blank input", rc == 0 and out == "", f"rc={rc} out={out!r}")
    rc, out, err = run(["hash"], b"{\"tokens\":[1],\"block_size\":1}\x00\n")
    check("NUL byte in a line", rc == 1 and '"line":1' in out, out)


def test_long_prompt():
    rng = random.Random(7)
    n = 128 * 1024
    tokens = list(range(8)) + [rng.randrange(0, 1 << 32) for _ in range(n - 8)]
    big = json.dumps({"tokens": tokens, "block_size": 4})
    prefix = json.dumps({"tokens": tokens[:1003], "block_size": 4})
    t0 = time.monotonic()
    rc, out, err = run(["hash"], (big + "\n" + prefix + "\n" + big + "\n").encode())
    dt = time.monotonic() - t0
    check("128K tokens: exit 0", rc == 0, f"rc={rc} stderr={err[:500]}")
    got = out.split("\n")
    check("128K tokens: three lines", len(got) == 4, f"{len(got) - 1} lines")
    if len(got) < 4:
        return
    a, p, b = (json.loads(x) for x in got[:3])
    lbh, seq = a["local_block_hashes"], a["sequence_hashes"]
    check("128K tokens: block count", len(lbh) == n // 4 and len(seq) == n // 4, f"{len(lbh)}")
    check("128K tokens: first blocks match the reference vector",
          lbh[:2] == ["9143094415614847814", "12124091508212882195"]
          and seq[:2] == ["9143094415614847814", "9510318385840434533"], f"{lbh[:2]} {seq[:2]}")
    check("128K tokens: a prefix hashes to a prefix",
          p["local_block_hashes"] == lbh[:250] and p["sequence_hashes"] == seq[:250], "")
    check("128K tokens: deterministic", a == b, "")
    check("128K tokens: decimal u64 strings",
          all(s.isdigit() and int(s) < (1 << 64) for s in lbh + seq), "")
    check("128K tokens: distinct sequence hashes", len(set(seq)) == len(seq), "")
    check("128K tokens: time", dt < 60, f"{dt:.1f}s")


def test_usage():
    rc, out, err = run(["hash", "--help"], b"")
    check("--help exit 0", rc == 0 and "usage: kvrouter hash" in out, f"rc={rc} {out[:200]}")
    rc, out, err = run(["hash", "--bogus"], b"")
    check("unknown option exit 2", rc == 2 and "--bogus" in err, f"rc={rc} {err[:200]}")
    rc, out, err = run(["hash", "--line-buffered"], b"{\"tokens\":[0,1],\"block_size\":2}\n")
    check("--line-buffered", rc == 0 and out.startswith("{\"local_block_hashes\":[\""), out)


def main():
    for t in (test_vectors, test_bad_lines, test_long_prompt, test_usage):
        try:
            t()
        except Exception as e:  # a crash of the test itself is a failure, not an abort
            check(t.__name__, False, f"exception {type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
