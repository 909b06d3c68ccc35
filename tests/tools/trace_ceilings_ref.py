#!/usr/bin/python3
"""Independent reference for kvr_trace_ceilings (wire/trace.c), from the hash ids alone: no
tokens, no hashing, no kvcache code. At a block size bs dividing 512, block p of a row is the
prefix (ids[0 .. p*bs//512], p % (512//bs)), since equal ids mean equal tokens. The pooled cache
is modelled as vLLM's free queue reduces to when one request runs at a time: unhashed free
blocks at the head, hashed ones in LRU order behind them; a request takes its hits out, pops
new blocks from the head (unhashed first, then the least recently released hashed ones),
commits its full blocks (a hash already cached is shared, the copy goes back unhashed) and
releases last block first to the tail.

usage: trace_ceilings_ref.py TRACE [ROWS]   prints the figures tests/wire/test_trace.c uses.
"""
import json, sys
from collections import OrderedDict

def rows_of(path, nmax=0):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return rows[:nmax] if nmax else rows

def blocks(r, bs):
    n = r["input_length"]; ids = r["hash_ids"]; per = 512 // bs
    out = []; pref = ()
    for p in range(n // bs):
        k = p // per
        if len(pref) < k + 1: pref = tuple(ids[:k + 1])
        out.append((pref, p % per))
    return out

def infinite(rows, bs):
    seen = set(); hit = 0; tot = 0
    for r in rows:
        n = r["input_length"]; b = blocks(r, bs); cap = (n - 1) // bs
        m = 0
        while m < len(b) and b[m] in seen: m += 1
        hit += min(m, cap) * bs; tot += n
        seen.update(b)
    return hit, tot

def pooled(rows, bs, N):
    U = N; lru = OrderedDict(); hit = 0; tot = 0
    for r in rows:
        n = r["input_length"]; b = blocks(r, bs); cap = (n - 1) // bs
        tot += n
        m = 0
        while m < len(b) and b[m] in lru: m += 1
        h = min(m, cap); hit += h * bs
        total = -(-n // bs)
        if total > N: continue
        for x in b[:h]: del lru[x]
        need = total - h
        u = min(need, U); U -= u
        for _ in range(need - u): lru.popitem(last=False)
        for x in b[h:]:
            if x in lru: del lru[x]; U += 1      # dedup: own copy back unhashed
        if n % bs: U += 1                         # partial last block, unhashed
        for x in reversed(b): lru[x] = None       # release last to first, to the tail
    return hit, tot

if __name__ == "__main__":
    path = sys.argv[1]; nmax = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rows = rows_of(path, nmax)
    print("rows", len(rows), "ids", sum(len(r["hash_ids"]) for r in rows),
          "first_ts", rows[0]["timestamp"], "last_ts", rows[-1]["timestamp"],
          "max_len", max(r["input_length"] for r in rows))
    for bs in (512, 16):
        print("inf", bs, infinite(rows, bs))
    for bs, N in ((16, 2048), (16, 65536), (16, 131072), (16, 1 << 30), (512, 40)):
        print("pool", bs, N, pooled(rows, bs, N))
