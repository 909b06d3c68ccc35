#!/usr/bin/python3
"""Integration test of `kvrouter sim` (standard library only).

usage: test_sim_cli.py <path to kvrouter>   (env KVR_TEST_DATA: tests/data, with the 300-row
conversation slice)

Checks: --json prints one object per policy with the keys the issue names (and the same keys
`replay --json` uses), in --policy order, with sane values; two runs with one seed print the
same figures; the table form; the default trace is found from the repository root; usage
errors name the flag and exit 2; a broken trace names its line and exits 1; --help.
Kept small (--requests) so it runs in a few seconds.
"""
import json
import shutil
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/kvrouter"
DATA = os.environ.get("KVR_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
TRACE = os.path.join(DATA, "conversation_trace_300.jsonl")
REPO = os.path.abspath(os.path.join(DATA, "..", ".."))

KEYS = ["policy", "workers", "requests", "ttft_ms", "itl_ms", "e2e_ms", "hit_ratio",
        "ceiling_infinite", "ceiling_pooled", "max_worker_share"]
POLICIES = ["kv", "round-robin", "random", "least-loaded", "approx"]

passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}: {detail}"[:2000])


def run(args, cwd=None, timeout=120):
    p = subprocess.run([BIN, "sim"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, cwd=cwd)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def sim_json(extra):
    rc, out, err = run(["--trace", TRACE, "--requests", "80", "--workers", "4", "--json"] + extra)
    rows = []
    for line in out.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            check("json line", False, line)
    return rc, rows, err


def test_json():
    rc, rows, err = sim_json(["--seed", "5"])
    check("json exit 0", rc == 0, f"rc={rc} {err}")
    check("json one line per policy", [r.get("policy") for r in rows] == POLICIES,
          str([r.get("policy") for r in rows]))
    for r in rows:
        name = r.get("policy")
        check(f"{name} keys", all(k in r for k in KEYS), str(sorted(r)))
        if not all(k in r for k in KEYS):
            continue
        check(f"{name} workers", r["workers"] == 4, r["workers"])
        check(f"{name} requests", r["requests"] == 80, r["requests"])
        for k in ("ttft_ms", "itl_ms", "e2e_ms"):
            p = r[k]
            check(f"{name} {k} percentiles",
                  isinstance(p, dict) and sorted(p) == ["p50", "p90", "p99"] and
                  0 < p["p50"] <= p["p90"] <= p["p99"], str(p))
        check(f"{name} hit <= infinite", 0 <= r["hit_ratio"] <= r["ceiling_infinite"] + 1e-12,
              f'{r["hit_ratio"]} {r["ceiling_infinite"]}')
        check(f"{name} pooled <= infinite", 0 <= r["ceiling_pooled"] <= r["ceiling_infinite"],
              f'{r["ceiling_pooled"]} {r["ceiling_infinite"]}')
        check(f"{name} share", 0.25 <= r["max_worker_share"] <= 1, r["max_worker_share"])
    # determinism: the same seed gives the same figures (run_s is wall time)
    rc2, rows2, _ = sim_json(["--seed", "5"])
    strip = lambda rs: [{k: v for k, v in r.items() if k != "run_s"} for r in rs]
    check("same seed, same figures", rc2 == 0 and strip(rows) == strip(rows2))
    # one policy, in the order given
    rc, rows, err = sim_json(["--policy", "round-robin,kv"])
    check("policy order", rc == 0 and [r["policy"] for r in rows] == ["round-robin", "kv"],
          str(rows)[:300])


def test_table():
    rc, out, err = run(["--trace", TRACE, "--requests", "40", "--workers", "2",
                        "--policy", "kv,least-loaded"])
    check("table exit 0", rc == 0, err)
    lines = out.splitlines()
    head = [i for i, l in enumerate(lines) if l.startswith("policy")]
    check("table header", len(head) == 1, out)
    if head:
        body = lines[head[0] + 1:head[0] + 3]
        check("table rows", [l.split()[0] for l in body] == ["kv", "least-loaded"], out)
        check("table requests column", all(l.split()[1] == "40" for l in body), out)
    check("table ceilings line", "ceilings (block 16)" in out, out)
    legend = out[out.find("columns:"):]
    check("table: every column explained after it",
          all(f" {c}" in legend.replace("\n", " ") for c in
              ("ttft", "itl", "e2e", "hit:", "c_inf", "c_pool", "share:", "virt_s:", "run_s:")),
          out)
    check("table: a short run prints no progress", "done," not in err, err)
    rc, out, err = run(["--trace", TRACE, "--requests", "40", "--workers", "2", "--policy", "kv",
                        "--quiet"])
    check("--quiet accepted", rc == 0 and "done," not in err, err)


def test_default_trace():
    if not os.path.exists(os.path.join(REPO, "data", "traces", "conversation_trace.jsonl")):
        return
    rc, out, err = run(["--requests", "30", "--policy", "round-robin", "--json"], cwd=REPO)
    check("default trace from the repo root", rc == 0 and '"requests":30' in out, err + out)
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.abspath(BIN)
        beside = os.path.exists(os.path.join(os.path.dirname(exe), "..", "data", "traces",
                                             "conversation_trace.jsonl"))
        rc, out, err = run(["--requests", "5", "--policy", "kv"], cwd=d)
        if beside:
            check("default trace beside the binary", rc == 0, err)
        else:
            check("no trace: exit 2 with advice", rc == 2 and "--trace FILE" in err, err)


def test_errors():
    cases = [
        (["--workers", "0"], "--workers"),
        (["--workers", "x"], "--workers"),
        (["--policy", "kv,best"], "--policy"),
        (["--policy", "kv,"], "--policy"),
        (["--speedup", "0"], "--speedup"),
        (["--speedup", "nan"], "--speedup"),
        (["--block-size", "24"], "--block-size"),
        (["--num-gpu-blocks", "-1"], "--num-gpu-blocks"),
        (["--prefill-poly", "1,2"], "--prefill-poly"),
        (["--router-mode", "kv"], "--policy"),
        (["--router-temperature", "-1"], "router_temperature"),
        (["--overlap-score-weight", "-2"], "--overlap-score-weight"),
        (["--max-model-len", "1"], "--max-model-len"),
        (["--max-num-batched-tokens", "8", "--no-enable-chunked-prefill"],
         "max_num_batched_tokens"),
        (["--frobnicate"], "--frobnicate"),
        (["--trace", "/nonexistent/trace.jsonl"], "/nonexistent/trace.jsonl"),
    ]
    for args, needle in cases:
        rc, out, err = run(["--trace", TRACE, "--requests", "5"] + args
                           if args[0] != "--trace" else args)
        check(f"usage error {args}", rc == 2 and needle in err and out == "",
              f"rc={rc} err={err!r} out={out[:200]!r}")
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write('{"timestamp":0,"input_length":600,"output_length":1,"hash_ids":[1,2]}\n')
        f.write('{"timestamp":0,"input_length":600,"output_length":1,"hash_ids":[1]}\n')
        bad = f.name
    try:
        rc, out, err = run(["--trace", bad])
        check("bad trace: exit 1 naming the line",
              rc == 1 and "line 2: hash_ids: 1 ids for input_length 600 (expected 2)" in err, err)
    finally:
        os.unlink(bad)
    rc, out, err = run(["--help"])
    check("--help", rc == 0 and out.startswith("usage: kvrouter sim") and "--policy" in out, err)


def test_sessions():
    """--sessions infers conversations from successive turns: a turn that repeats all but the
    last block of an earlier one continues it; a shared first block alone does not."""
    import tempfile
    rows = [[0, 1, 2, 3],          # conversation A, turn 1
            [0, 7, 8],             # conversation B, turn 1 (shares only block 0 with A)
            [0, 1, 2, 4, 5, 6],    # A, turn 2: repeats A's [0, 1, 2] (all but its last block)
            [0, 7, 9],             # B, turn 2: repeats [0, 7]
            [0, 1, 2, 4, 5, 10]]   # A, turn 3
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for k, ids in enumerate(rows):
            f.write(json.dumps({"timestamp": k * 1000, "input_length": 512 * len(ids),
                                "output_length": 4, "hash_ids": ids}) + "\n")
        path = f.name
    try:
        rc, out, err = run(["--trace", path, "--workers", "2", "--policy", "kv", "--sessions"])
        check("sessions: two conversations inferred from five turns",
              rc == 0 and "sessions: 2 inferred" in out, out + err)
    finally:
        os.unlink(path)


def trace_stats(args):
    p = subprocess.run([BIN, "trace", "stats"] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def test_trace_stats():
    """`kvrouter trace stats`: its figures against an independent computation from the file
    (lengths, rate, repeats) and the ceilings the reference script gives for this slice
    (tests/tools/trace_ceilings_ref.py: 345952 and 159232 hit tokens of 4269971)."""
    rc, out, err = trace_stats([TRACE, "--workers", "1", "--blocks-per-worker", "65536",
                                "--block-size", "16", "--json"])
    check("trace stats --json exits 0", rc == 0, err)
    try:
        got = json.loads(out)
    except ValueError:
        check("trace stats prints one JSON object", False, out)
        return
    rows = [json.loads(l) for l in open(TRACE) if l.strip()]
    seen, rep, tot = set(), 0, 0
    for r in rows:
        for k in range(len(r["hash_ids"])):
            key = tuple(r["hash_ids"][:k + 1])
            tot += 1
            rep += key in seen
            seen.add(key)
    ins = sorted(r["input_length"] for r in rows)
    check("rows", got["rows"] == len(rows), got["rows"])
    check("prompt tokens", got["prompt_tokens"] == sum(ins), got["prompt_tokens"])
    check("span", abs(got["span_s"] - (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000) < 1e-6)
    check("input mean", abs(got["input_length"]["mean"] - sum(ins) / len(ins)) < 0.1)
    check("distinct prefix blocks", got["distinct_prefix_blocks"] == len(seen),
          (got["distinct_prefix_blocks"], len(seen)))
    check("repeat fraction", abs(got["repeat_fraction"] - rep / tot) < 1e-6,
          (got["repeat_fraction"], rep / tot))
    check("infinite ceiling = the reference's", abs(got["ceiling_infinite"] - 345952 / 4269971)
          < 1e-6, got["ceiling_infinite"])
    check("pooled ceiling = the reference's", abs(got["ceiling_pooled"] - 159232 / 4269971)
          < 1e-6, got["ceiling_pooled"])
    rc, out, _ = trace_stats([TRACE, "--rows", "10"])
    check("the table form names the ceilings", rc == 0 and "hit-ratio ceilings" in out and
          "10 requests" in out, out)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
        f.write('{"timestamp": 1, "input_length": "x"}\n')
        bad = f.name
    rc, _, err = trace_stats([bad])
    os.unlink(bad)
    check("a broken trace names its line, exit 1", rc == 1 and "2" in err, (rc, err))
    rc, _, err = trace_stats([TRACE, "--block-size", "24"])
    check("a block size not dividing 512 is refused, exit 2", rc == 2 and "--block-size" in err,
          (rc, err))
    rc, _, err = trace_stats([])
    check("no file: exit 2 naming it", rc == 2 and "FILE" in err, (rc, err))


def test_trace_gen_synth():
    """`kvrouter trace gen` and `trace synth`: seeded files that `trace stats` and `sim` read,
    the rate asked for, a synth of the slice with every scale 1 having its stats, and usage
    errors naming the flag (exit 2)."""
    def gen(args):
        p = subprocess.run([BIN, "trace", "gen"] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120)
        return p.returncode, p.stdout.decode(), p.stderr.decode()
    rc, a, err = gen(["--workload", "mix", "--rate", "5", "--duration", "120", "--seed", "3"])
    rc2, b, _ = gen(["--workload", "mix", "--rate", "5", "--duration", "120", "--seed", "3"])
    check("trace gen: exit 0, the same file for the same seed", rc == 0 and rc2 == 0 and a == b
          and a.count("\n") > 300, err)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "g.jsonl")
        open(path, "w").write(a)
        rc, out, err = trace_stats([path, "--json"])
        got = json.loads(out) if rc == 0 else {}
        check("trace stats reads it: about 5 requests/s",
              rc == 0 and 4.0 < got.get("rate_per_s", 0) < 6.0, (rc, err, got.get("rate_per_s")))
        rc, out, err = run(["--trace", path, "--requests", "60", "--workers", "2", "--json"])
        check("sim runs it", rc == 0 and '"requests":60' in out, err)
        p = subprocess.run([BIN, "trace", "synth", "--from", TRACE, "--output",
                            os.path.join(d, "s.jsonl")], stderr=subprocess.PIPE, timeout=60)
        rc1, s1, _ = trace_stats([TRACE, "--json"])
        rc2, s2, _ = trace_stats([os.path.join(d, "s.jsonl"), "--json"])
        check("trace synth with every scale 1: the same stats as its source",
              p.returncode == 0 and rc1 == 0 and rc2 == 0 and json.loads(s1) == json.loads(s2),
              (p.stderr, s1, s2))
    rc, _, err = gen(["--workload", "video"])
    check("trace gen: an unknown workload names the flag, exit 2", rc == 2 and "--workload" in err,
          (rc, err))
    rc, _, err = gen(["--rate", "0"])
    check("trace gen: rate 0 refused, exit 2", rc == 2 and "--rate" in err, (rc, err))
    p = subprocess.run([BIN, "trace", "synth"], stderr=subprocess.PIPE, timeout=60)
    check("trace synth without --from: exit 2 naming it",
          p.returncode == 2 and b"--from" in p.stderr, p.stderr)


def test_bench_mooncake():
    """`kvrouter bench mooncake` on the 300-row slice: one JSON point with the reference's
    keys, every lookup of every copy made, events applied without error; too many worker
    ranks refused naming the flags."""
    p = subprocess.run([BIN, "bench", "mooncake", "--trace", TRACE, "--workers", "20",
                        "--duplication", "3", "--window-s", "1", "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    try:
        pt = json.loads(p.stdout.splitlines()[0])
    except (ValueError, IndexError):
        check("bench mooncake prints a JSON point", False, (p.returncode, p.stdout, p.stderr))
        return
    keys = ["workers", "duplication", "offered_per_s", "achieved_per_s", "block_ops_per_s",
            "p50_us", "p99_us", "p999_us", "bytes_per_pair"]
    check("bench mooncake: exit 0 and the reference's keys",
          p.returncode == 0 and all(k in pt for k in keys), (p.returncode, pt))
    check("every row's lookup made for each copy, events applied cleanly",
          pt.get("lookups") == 300 * 3 and pt.get("events", 0) > 300 * 3 and
          pt.get("event_errors") == 0 and pt.get("workers") == 60, pt)
    # the reference's --trace-duplication-factor: twice the rows in disjoint hash spaces,
    # lookups taken by two reader threads, each made once per copy
    p2 = subprocess.run([BIN, "bench", "mooncake", "--trace", TRACE, "--workers", "20",
                         "--duplication", "3", "--trace-duplication", "2", "--readers", "2",
                         "--window-s", "1", "--json"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    try:
        pt2 = json.loads(p2.stdout.splitlines()[0])
    except (ValueError, IndexError):
        pt2 = {}
    check("trace duplication: twice the lookups, each made by one of two readers",
          p2.returncode == 0 and pt2.get("lookups") == 300 * 2 * 3 and
          pt2.get("trace_duplication") == 2 and pt2.get("readers") == 2 and
          pt2.get("event_errors") == 0, (p2.returncode, pt2, p2.stderr[-300:]))
    check("trace duplication: disjoint hash spaces (over 1.5x the pairs)",
          pt2.get("pairs", 0) > 1.5 * pt.get("pairs", 0), (pt2.get("pairs"), pt.get("pairs")))
    p = subprocess.run([BIN, "bench", "mooncake", "--workers", "1000", "--duplication", "224"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    check("224,000 worker ranks refused, exit 2 naming the flags",
          p.returncode == 2 and "--duplication" in p.stderr, (p.returncode, p.stderr))


def test_disagg():
    """--prefill-workers P --decode-workers D: every finished request was transferred, the
    label says so, TTFT is at least the prefill's, and the flags are checked."""
    rc, rows, err = sim_json(["--policy", "kv,round-robin", "--prefill-workers", "1",
                              "--decode-workers", "3"])
    check("disagg: exit 0", rc == 0, f"rc={rc} {err}")
    check("disagg: one row per policy, labelled",
          [r.get("policy") for r in rows] == ["kv/disagg", "round-robin/disagg"], rows)
    for r in rows:
        check(f"disagg {r['policy']}: 4 workers, 1 of them prefill",
              r["workers"] == 4 and r["prefill_workers"] == 1, r)
        check(f"disagg {r['policy']}: every finished request transferred",
              r["requests"] > 0 and r["transfers"] == r["requests"] and r["bypassed"] == 0, r)
        check(f"disagg {r['policy']}: TTFT covers the prefill",
              r["ttft_ms"]["p50"] >= r["prefill_ms"]["p50"] > 0, r)
        check(f"disagg {r['policy']}: the router ends with nothing in flight",
              r["router_live_at_end"] == 0 and r["router_unknown_ids"] == 0, r)
    rc, out, err = run(["--trace", TRACE, "--prefill-workers", "2"])
    check("disagg: --prefill-workers alone is a usage error naming both",
          rc == 2 and "--prefill-workers and --decode-workers" in err, (rc, err))
    rc, out, err = run(["--trace", TRACE, "--prefill-workers", "1", "--decode-workers", "1",
                        "--router-queue-threshold", "0.5"])
    check("disagg: the queue is refused (not modelled)", rc == 2 and "queue" in err, (rc, err))


def test_oracle():
    """--policy oracle: its own row (not part of "all"), every request finished, and no
    worse TTFT p50 than round-robin on the same requests; refused with prefill workers."""
    rc, rows, err = sim_json(["--policy", "oracle,round-robin"])
    check("oracle: exit 0", rc == 0, f"rc={rc} {err}")
    check("oracle: labelled", [r.get("policy") for r in rows] == ["oracle", "round-robin"], rows)
    if rc == 0 and len(rows) == 2:
        o, rr = rows
        check("oracle: every request finished", o["requests"] == 80 and o["rejected"] == 0, o)
        check("oracle: TTFT p50 no worse than round-robin's",
              o["ttft_ms"]["p50"] <= rr["ttft_ms"]["p50"], (o["ttft_ms"], rr["ttft_ms"]))
        check("oracle: the router ends with nothing in flight",
              o["router_live_at_end"] == 0 and o["router_unknown_ids"] == 0, o)
    rc, out, err = run(["--trace", TRACE, "--policy", "oracle", "--prefill-workers", "1",
                        "--decode-workers", "1"])
    check("oracle: refused with prefill workers, named", rc != 0 and "oracle" in err, (rc, err))


def test_event_link():
    """--event-delay-ms / --event-loss: KV-mode rows report the batches, losses and mean delay;
    bad settings are usage errors naming the flag."""
    rc, rows, err = sim_json(["--policy", "kv,round-robin", "--event-delay-ms", "100",
                              "--event-loss", "0.02"])
    check("event link: exit 0", rc == 0, f"rc={rc} {err}")
    if rc == 0 and len(rows) == 2:
        kv, rr = rows
        check("event link: kv reports its batches, some lost",
              kv.get("event_batches", 0) > 0 and 0 < kv.get("events_lost", 0) < kv["event_batches"],
              kv)
        check("event link: mean delay at least the jittered delay's floor (50 ms)",
              kv.get("event_delay_ms", 0) >= 50, kv.get("event_delay_ms"))
        check("event link: round-robin has no events to delay", "event_batches" not in rr, rr)
    for args, flag in ((["--event-loss", "1"], "event-loss"),
                       (["--event-delay-ms", "5", "--event-jitter-ms", "6"], "event-jitter-ms"),
                       (["--event-delay-ms", "-1"], "--event-delay-ms")):
        rc, out, err = run(["--trace", TRACE, "--requests", "5"] + args)
        check(f"event link: {' '.join(args)} refused naming {flag}", rc != 0 and flag in err,
              (rc, err))


def test_sweep_plot():
    """--speedup A,B and --sweep N run every policy at each load (JSON rows say which);
    --plot draws the sweep (a PNG when gnuplot is installed, an error naming it when not);
    a plot without a sweep, or a sweep with a list, is a usage error."""
    rc, rows, err = sim_json(["--policy", "kv,round-robin", "--speedup", "0.5,2"])
    check("speedup list: a row per policy per load",
          rc == 0 and [(r["policy"], r["speedup"]) for r in rows] ==
          [("kv", 0.5), ("round-robin", 0.5), ("kv", 2), ("round-robin", 2)], (rc, err, rows))
    rc, rows, err = sim_json(["--policy", "kv", "--speedup", "3", "--sweep", "3"])
    check("--sweep 3 up to 3: loads 1, 2, 3",
          rc == 0 and [r["speedup"] for r in rows] == [1, 2, 3], (rc, err, rows))
    with tempfile.TemporaryDirectory() as d:
        png = os.path.join(d, "sweep.png")
        rc, out, err = run(["--trace", TRACE, "--requests", "80", "--workers", "4", "--policy",
                            "kv,round-robin", "--speedup", "4", "--sweep", "2", "--plot", png])
        if shutil.which("gnuplot"):
            ok = rc == 0 and os.path.exists(png)
            with open(png, "rb") if ok else open(os.devnull, "rb") as f:
                head = f.read(8)
            check("--plot writes a PNG", ok and head == b"\x89PNG\r\n\x1a\n", (rc, err, head))
            check("--plot names it", f"plot: {png}" in out, out[-300:])
        else:
            check("--plot without gnuplot: an error naming it", rc != 0 and "gnuplot" in err,
                  (rc, err))
    for args, want in ((["--plot", "x.png"], "sweep"),
                       (["--speedup", "1,2", "--sweep", "3"], "--sweep"),
                       (["--speedup", "1,,2"], "--speedup"),
                       (["--speedup", "1,2", "--plot", "x.jpg"], ".png or .svg")):
        rc, out, err = run(["--trace", TRACE, "--requests", "5", "--policy", "kv"] + args)
        check(f"{' '.join(args)}: refused, naming {want}", rc != 0 and want in err, (rc, err))


def test_cost_policies():
    """--policy dynamo / lmetric / locality: kv mode with that cost function, labelled so;
    locality is the default, so its row equals kv's."""
    rc, rows, err = sim_json(["--policy", "kv,dynamo,lmetric,locality"])
    check("cost policies: labelled", rc == 0 and [r.get("policy") for r in rows] ==
          ["kv", "dynamo", "lmetric", "locality"], (rc, err, rows))
    if rc == 0 and len(rows) == 4:
        strip = lambda r: {k: v for k, v in r.items() if k not in ("run_s", "policy")}
        check("cost policies: locality is kv's default", strip(rows[0]) == strip(rows[3]))


def test_records():
    """--records writes every request's story, one JSON line per run and row, agreeing with the
    run's summary; a file it cannot write is named, exit 2."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rec.jsonl")
        rc, rows, err = sim_json(["--policy", "kv,round-robin", "--rate-scale", "1,3",
                                  "--records", path])
        check("sim --records runs", rc == 0 and len(rows) == 4, (rc, err[-500:]))
        recs = [json.loads(l) for l in open(path)]
        check("a line per run and row", len(recs) == 4 * 80, len(recs))
        for r in rows:
            mine = [x for x in recs if x["policy"] == r["policy"] and x["speedup"] == r["speedup"]]
            done = [x for x in mine if x["outcome"] == "done"]
            check(f"{r['policy']} at {r['speedup']}: rows 0..79 in order",
                  [x["row"] for x in mine] == list(range(80)))
            check(f"{r['policy']} at {r['speedup']}: finished as the summary says",
                  len(done) == r["requests"], (len(done), r["requests"]))
            mean = sum(x["first_ms"] - x["arrival_ms"] for x in done) / len(done)
            check(f"{r['policy']} at {r['speedup']}: TTFT mean as the summary's",
                  abs(mean - r["ttft_mean_ms"]) <= 1e-6 * max(1.0, mean),
                  (mean, r["ttft_mean_ms"]))
            hit = sum(x["cached_tokens"] for x in done) / sum(x["prompt_tokens"] for x in done)
            check(f"{r['policy']} at {r['speedup']}: hit ratio as the summary's",
                  abs(hit - r["hit_ratio"]) < 1e-9, (hit, r["hit_ratio"]))
            check(f"{r['policy']} at {r['speedup']}: times in order",
                  all(x["arrival_ms"] <= x["routed_ms"] <= x["first_ms"] <= x["finish_ms"]
                      and 0 <= x["worker"] < 4 for x in done))
        arr1 = [x["arrival_ms"] for x in recs if x["speedup"] == 1 and x["policy"] == "kv"]
        arr3 = [x["arrival_ms"] for x in recs if x["speedup"] == 3 and x["policy"] == "kv"]
        check("arrivals scale with the load", all(abs(a - 3 * b) < 1e-6 * max(1, a)
                                                  for a, b in zip(arr1, arr3)))
    rc, out, err = run(["--trace", TRACE, "--requests", "5", "--records", "/nonexistent/r.jsonl"])
    check("an unwritable --records names it, exit 2",
          rc == 2 and "/nonexistent/r.jsonl" in err, (rc, err))


def main():
    test_records()
    test_cost_policies()
    test_sweep_plot()
    test_event_link()
    test_oracle()
    test_disagg()
    test_trace_stats()
    test_bench_mooncake()
    test_trace_gen_synth()
    test_json()
    test_sessions()
    test_table()
    test_default_trace()
    test_errors()
    print(f"test_sim_cli: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
