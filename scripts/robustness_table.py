#!/usr/bin/python3
"""The event-delay table of docs/sim.md: how each KV-event policy degrades when the engines'
events reach the index late (--event-delay-ms, jitter half the delay) or are lost and
replayed (--event-loss, --event-replay-ms), at given loads.

Usage: robustness_table.py KVROUTER --load NAME=SPEEDUP ... [--trace NAME=FILE ...]
       [--rate R] [--duration S] [--seed N]
"""
import argparse
import tempfile

from policy_table import gen_trace, sim

POLICIES = [("locality (default)", ["--policy", "kv"]),
            ("dynamo", ["--policy", "kv", "--router-selection-policy", "dynamo"]),
            ("lmetric", ["--policy", "kv", "--router-selection-policy", "lmetric"])]
LINKS = [("at once", []), ("10 ms", ["--event-delay-ms", "10"]),
         ("100 ms", ["--event-delay-ms", "100"]), ("1 s", ["--event-delay-ms", "1000"]),
         ("1% lost, 1 s replay", ["--event-loss", "0.01"])]


def main():
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
    print("| workload | speedup | events | policy | hit | % of at once | TTFT p50 | p90 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for spec in a.load:
        name, sp = spec.split("=", 1)
        path = files.get(name) or gen_trace(a.kvrouter, name, tmp, a.rate, a.duration, a.seed)
        base = {}
        for lname, largs in LINKS:
            for pname, pargs in POLICIES:
                r = sim(a.kvrouter, path, sp, pargs + largs)
                h = r["hit_ratio"]
                base.setdefault(pname, h)
                pct = f"{100 * h / base[pname]:.1f}%" if base[pname] else "-"
                print(f"| {name} | {sp} | {lname} | {pname} | {h:.3f} | {pct} "
                      f"| {r['ttft_ms']['p50']:.0f} | {r['ttft_ms']['p90']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
