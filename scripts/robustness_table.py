#!/usr/bin/python3
"""The event-delay table of docs/sim.md: how each KV-event policy degrades when the engines'
events reach the index late (--event-delay-ms, jitter half the delay) or are lost and
replayed (--event-loss, --event-replay-ms), at given loads.

Usage: robustness_table.py KVROUTER --load NAME=SPEEDUP ... [--trace NAME=FILE ...]
       [--rate R] [--duration S] [--seed N]
"""
from policy_table import sim, workloads_at_loads

POLICIES = [("locality (default)", ["--policy", "kv"]),
            ("dynamo", ["--policy", "kv", "--router-selection-policy", "dynamo"]),
            ("lmetric", ["--policy", "kv", "--router-selection-policy", "lmetric"])]
LINKS = [("at once", []), ("10 ms", ["--event-delay-ms", "10"]),
         ("100 ms", ["--event-delay-ms", "100"]), ("1 s", ["--event-delay-ms", "1000"]),
         ("1% lost, 1 s replay", ["--event-loss", "0.01"])]


def main():
    print("| workload | speedup | events | policy | hit | % of at once | TTFT p50 | p90 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for a, name, path, speeds in workloads_at_loads():
        for sp in speeds:
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
