#!/usr/bin/python3
"""The approximate-mode table of docs/sim.md: kv mode (KV events) against approximate mode
(no events: the router's own cache model), same default policy, at given loads.

For each workload (a trace file, or a `kvrouter trace gen` workload made as policy_table.py
makes it) and each speedup, one row: kv hit and TTFT p50; approx hit (and % of kv's), TTFT
p50 (and x kv's), and approx's predicted hit ratio (and % of its measured one).

Usage: approx_table.py KVROUTER --load NAME=SPEEDUP[,SPEEDUP...] ... [--trace NAME=FILE ...]
       [--rate R] [--duration S] [--seed N]
e.g. --trace conversation=data/traces/conversation_trace.jsonl --load conversation=2.456,2.641
     --load chat=7.815,8.410
"""
import argparse
import tempfile

from policy_table import gen_trace, sim


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
    print("| workload | speedup | kv hit | kv TTFT p50 | approx hit (% of kv) "
          "| approx TTFT p50 (x kv) | approx predicted hit (% of measured) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for spec in a.load:
        name, speeds = spec.split("=", 1)
        path = files.get(name) or gen_trace(a.kvrouter, name, tmp, a.rate, a.duration, a.seed)
        for sp in speeds.split(","):
            kv = sim(a.kvrouter, path, sp, ["--policy", "kv"])
            ax = sim(a.kvrouter, path, sp, ["--policy", "approx"])
            kh, ah, pr = kv["hit_ratio"], ax["hit_ratio"], ax["predicted_hit_ratio"]
            kt, at = kv["ttft_ms"]["p50"], ax["ttft_ms"]["p50"]
            pct = lambda x, y: f"{100 * x / y:.1f}%" if y else "-"
            print(f"| {name} | {sp} | {kh:.4f} | {kt:.0f} | {ah:.4f} ({pct(ah, kh)}) "
                  f"| {at:.0f} ({at / kt:.2f}x) | {pr:.4f} ({pct(pr, ah)}) |", flush=True)


if __name__ == "__main__":
    main()
