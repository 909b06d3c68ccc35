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
from policy_table import sim, workloads_at_loads


def main():
    print("| workload | speedup | kv hit | kv TTFT p50 | approx hit (% of kv) "
          "| approx TTFT p50 (x kv) | approx predicted hit (% of measured) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for a, name, path, speeds in workloads_at_loads():
        for sp in speeds:
            kv = sim(a.kvrouter, path, sp, ["--policy", "kv"])
            ax = sim(a.kvrouter, path, sp, ["--policy", "approx"])
            kh, ah, pr = kv["hit_ratio"], ax["hit_ratio"], ax["predicted_hit_ratio"]
            kt, at = kv["ttft_ms"]["p50"], ax["ttft_ms"]["p50"]
            pct = lambda x, y: f"{100 * x / y:.1f}%" if y else "-"
            print(f"| {name} | {sp} | {kh:.4f} | {kt:.0f} | {ah:.4f} ({pct(ah, kh)}) "
                  f"| {at:.0f} ({at / kt:.2f}x) | {pr:.4f} ({pct(pr, ah)}) |", flush=True)


if __name__ == "__main__":
    main()
