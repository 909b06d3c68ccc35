#!/usr/bin/python3
"""The routing-policy table of docs/sim.md: every workload at three loads, every policy.

For each trace (the generated workloads of `kvrouter trace gen`, and any trace given), the
loads are found with round-robin in `kvrouter sim`: "unloaded" is round-robin's TTFT p50 at
--rate-scale 0.01; the "2x" and "4x" loads are the speedups at which round-robin's TTFT p50 is
about twice and four times that (bisection on the speedup); "light" is half the 2x speedup.
Then each policy runs at each load, and one row is printed per (trace, load, policy): hit
ratio, % of the pooled ceiling, TTFT p50 / p90 / p99, ITL p50, the busiest worker's share.

Usage: policy_table.py KVROUTER [--trace FILE ...] [--gen chat,agent,rag,mix] [--rate R]
       [--duration S] [--seed N] [--arrival poisson|gamma] [--cv X] [--policy NAME=ARGS ...]
       [--markdown]
--seed, --arrival and --cv are `kvrouter trace gen`'s (the generated workloads; the runs keep
`kvrouter sim`'s seed 1).
A policy is a name and `kvrouter sim` arguments, e.g. "kv=--policy kv" or
"lmetric=--policy kv --router-selection-policy lmetric".
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

FLEET = ["--workers", "8", "--num-gpu-blocks", "16384", "--block-size", "16"]


def sim(kvr, trace, speedup, args):
    cmd = [kvr, "sim", "--trace", trace, "--rate-scale", str(speedup), "--json"] + FLEET + args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: {p.stderr}")
    return json.loads(p.stdout.splitlines()[0])


def gen_trace(kvr, workload, directory, rate, duration, seed, arrival=()):
    """`kvrouter trace gen --workload W` into directory/W.jsonl; its path. arrival: more
    `trace gen` arguments (--arrival, --cv)."""
    path = os.path.join(directory, workload + ".jsonl")
    subprocess.run([kvr, "trace", "gen", "--workload", workload, "--rate", str(rate),
                    "--duration", str(duration), "--seed", str(seed), "--output", path]
                   + list(arrival), check=True)
    return path


def workloads_at_loads():
    """The command line of the tables that run given workloads at given loads: KVROUTER,
    --load NAME=SPEEDUP[,...] (repeatable), --trace NAME=FILE (else `trace gen`), --rate,
    --duration, --seed. Yields (parsed arguments, name, trace path, speedups)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("kvrouter")
    ap.add_argument("--trace", action="append", default=[])
    ap.add_argument("--load", action="append", default=[], required=True)
    ap.add_argument("--rate", type=float, default=8)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--seed", default="1")
    a = ap.parse_args()
    files = dict(t.split("=", 1) for t in a.trace)
    tmp = tempfile.mkdtemp()
    for spec in a.load:
        name, speeds = spec.split("=", 1)
        path = files.get(name) or gen_trace(a.kvrouter, name, tmp, a.rate, a.duration, a.seed)
        yield a, name, path, speeds.split(",")


def rr_p50(kvr, trace, speedup):
    return sim(kvr, trace, speedup, ["--policy", "round-robin"])["ttft_ms"]["p50"]


def find_load(kvr, trace, target, lo=0.05, hi=64.0):
    """The speedup at which round-robin's TTFT p50 is target (bisection in log space)."""
    for _ in range(14):
        mid = (lo * hi) ** 0.5
        if rr_p50(kvr, trace, mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvrouter")
    ap.add_argument("--trace", action="append", default=[])
    ap.add_argument("--gen", default="chat,agent,rag,mix")
    ap.add_argument("--rate", type=float, default=8)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--seed", default="1")
    ap.add_argument("--arrival", choices=["poisson", "gamma"])
    ap.add_argument("--cv")
    ap.add_argument("--policy", action="append", default=[])
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    arrival = (["--arrival", a.arrival] if a.arrival else []) + (["--cv", a.cv] if a.cv else [])
    policies = [p.split("=", 1) for p in a.policy] or [
        ["locality (default)", "--policy kv"],
        ["dynamo", "--policy kv --router-selection-policy dynamo"],
        ["lmetric", "--policy kv --router-selection-policy lmetric"],
        ["round-robin", "--policy round-robin"],
        ["least-loaded", "--policy least-loaded"],
    ]
    tmp = tempfile.mkdtemp()
    traces = [(os.path.basename(t), t) for t in a.trace]
    for w in [x for x in a.gen.split(",") if x]:
        traces.append((w, gen_trace(a.kvrouter, w, tmp, a.rate, a.duration, a.seed, arrival)))
    if a.markdown:
        print("| workload | load | policy | hit | % of pooled | TTFT p50 | p90 | p99 | ITL p50 "
              "| max share |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, path in traces:
        unloaded = rr_p50(a.kvrouter, path, 0.01)
        s2 = find_load(a.kvrouter, path, 2 * unloaded)
        s4 = find_load(a.kvrouter, path, 4 * unloaded)
        loads = [("light", s2 / 2), ("2x", s2), ("4x", s4)]
        print(f"# {name}: unloaded RR TTFT p50 {unloaded:.1f} ms; speedups light {s2 / 2:.3f}, "
              f"2x {s2:.3f}, 4x {s4:.3f}", file=sys.stderr, flush=True)
        for load, sp in loads:
            for pname, pargs in policies:
                r = sim(a.kvrouter, path, sp, pargs.split())
                pooled = r["ceiling_pooled"]
                row = [name, load, pname, f"{r['hit_ratio']:.3f}",
                       f"{100 * r['hit_ratio'] / pooled:.1f}%" if pooled else "-",
                       f"{r['ttft_ms']['p50']:.0f}", f"{r['ttft_ms']['p90']:.0f}",
                       f"{r['ttft_ms']['p99']:.0f}", f"{r['itl_ms']['p50']:.1f}",
                       f"{r['max_worker_share']:.3f}"]
                if a.markdown:
                    print("| " + " | ".join(row) + " |", flush=True)
                else:
                    print(json.dumps({"trace": name, "load": load, "speedup": sp,
                                      "policy": pname, "hit": r["hit_ratio"],
                                      "pooled": pooled, "ttft_p50": r["ttft_ms"]["p50"],
                                      "ttft_p90": r["ttft_ms"]["p90"],
                                      "ttft_p99": r["ttft_ms"]["p99"],
                                      "itl_p50": r["itl_ms"]["p50"],
                                      "share": r["max_worker_share"]}), flush=True)


if __name__ == "__main__":
    main()
