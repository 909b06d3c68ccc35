#!/usr/bin/python3
"""Generates the KV-event batch fixtures of tests/wire/test_kv_events.c.

Independent of the C decoder: batches are built as plain lists and dicts in vLLM / SGLang
declaration order (docs/wire-formats.md 1.3, 1.4, 2) and packed by Debian's
python3-msgpack with use_bin_type=True, which, like msgspec, writes the smallest encoding of
every value. Each case is written as tests/data/kv_events/<name>.bin (the payload frame) and
<name>.json (what a decoder must report, computed here from the Python values).

    /usr/bin/python3 tests/tools/gen_kv_events.py [out_dir]

Deterministic: no clocks, a fixed random seed; re-running rewrites identical files. Append new
cases at the end of build(): the random stream is shared.
"""
import json
import os
import random
import sys

import msgpack

U64 = (1 << 64) - 1
TS = 1789095808.8378847
TOKENS4 = [151644, 872, 198, 9064]
HASH0 = 15760518052499183552

# Section 1.6 of the reference, as hex: the generator checks it reproduces these bytes, so the
# fixtures are byte-exact with what vLLM sends.
DOC_ARRAY7 = ("93cb41daa8dbe0359fe79197ab426c6f636b53746f72656491cfdab89baa7b5857c0c0"
              "94ce0002505ccd0368ccc6cd2368 04 c0 a3475055 00").replace(" ", "")
DOC_V090 = ("92 cb 41 da a8 db e0 35 9f e7 91 96 ab 42 6c 6f 63 6b 53 74 6f 72 65 64 91 cf da"
            " b8 9b aa 7b 58 57 c0 c0 94 ce 00 02 50 5c cd 03 68 cc c6 cd 23 68 04 c0").replace(" ", "")
DOC_SGLANG = ("93 cb 3f f0 00 00 00 00 00 00 91 98 ab" + " 42 6c 6f 63 6b 53 74 6f 72 65 64"
              " 91 7b c0 92 01 02 02 c0 a3 47 50 55 81 aa" + " 63 61 63 68 65 5f 73 61 6c 74"
              " a8 74 65 6e 61 6e 74 2d 61 c0").replace(" ", "")

TIERS = {None: "device", "": "device", "GPU": "device", "DEVICE": "device",
         "CPU": "host", "CPU_PINNED": "host", "CPU_TIER1": "host",
         "CPU_TIER2": "disk", "DISK": "disk", "NVME": "disk", "STORAGE": "disk", "FS": "disk",
         "OBJ": "disk", "EXTERNAL": "external", "NETWORK": "external", "REMOTE": "external",
         "SHARED": "external"}


def pack(obj, single_float=False):
    return msgpack.packb(obj, use_bin_type=True, use_single_float=single_float)


def fold(h):
    """An engine hash as the decoder must report it: ints mod 2^64, bytes' last 8 BE."""
    if isinstance(h, (bytes, bytearray)):
        return int.from_bytes(h, "big") & U64
    return h & U64


def name_or_none(s):
    return s if s else None


def expect(kind, hashes=(), parent=None, tokens=(), block_size=0, medium=None, lora=None,
           salt=None, eagle=False, group=None, remote=False):
    """The expected decoded event. tokens: plain ids or EAGLE pairs (unfolded here)."""
    toks = list(tokens)
    is_eagle = eagle
    if toks and isinstance(toks[0], (list, tuple)):
        toks = [p[0] for p in toks] + [toks[-1][1]]
        is_eagle = True
    return {
        "kind": kind, "status": "ok",
        "hashes": [str(fold(h)) for h in hashes],
        "parent": None if parent is None else str(fold(parent)),
        "tokens": toks, "block_size": block_size,
        "tier": TIERS.get(medium, "device"), "unknown_medium": medium not in TIERS,
        "lora_name": name_or_none(lora), "cache_salt": name_or_none(salt),
        "is_eagle": is_eagle, "group_idx": group, "remote": remote,
    }


def bad(kind, contains):
    return {"kind": kind, "status": "error", "error_contains": contains}


def ignored():
    return {"kind": "ignored", "status": "ok"}


CASES = []


def case(name, description, payload, events=None, ts=None, dp_rank=None, error=None):
    side = {"description": description}
    if error is not None:
        side["status"] = "error"
        side["error_contains"] = error
    else:
        side.update(status="ok", ts=ts, dp_rank=dp_rank, events=events)
    CASES.append((name, payload, side))


# ---- vLLM events, array era ---------------------------------------------------------------

def stored(hashes, parent, tokens, bs, lora_id=None, *tail):
    return ["BlockStored", list(hashes), parent, list(tokens), bs, lora_id, *tail]


def build():
    rng = random.Random(20260611)

    def rh():
        return rng.getrandbits(64)

    # Section 1.6, reproduced and checked against the document's bytes.
    ev7 = stored([HASH0], None, TOKENS4, 4, None, "GPU")
    b = pack([TS, [ev7], 0])
    assert b.hex() == DOC_ARRAY7 and len(b) == 56, b.hex()
    case("vllm_doc_array7", "docs/wire-formats.md 1.6: array-era batch, 7-element BlockStored (56 bytes)",
         b, [expect("stored", [HASH0], None, TOKENS4, 4, "GPU")], TS, 0)

    ev6 = stored([HASH0], None, TOKENS4, 4)
    b = pack([TS, [ev6]])
    assert b.hex() == DOC_V090, b.hex()
    case("vllm_doc_v090", "docs/wire-formats.md 1.6: v0.9.0 2-element batch, 6-element BlockStored",
         b, [expect("stored", [HASH0], None, TOKENS4, 4)], TS, None)

    # v0.9.0 everything: stored 6, removed 2, cleared 1.
    h = [rh(), rh()]
    toks = [rng.randrange(0, 150000) for _ in range(8)]
    b = pack([TS, [stored(h, None, toks, 4), ["BlockRemoved", [h[1]]], ["AllBlocksCleared"]]])
    case("vllm_v090_all_kinds", "v0.9.0: stored (6), removed (2), cleared (1), no dp rank", b,
         [expect("stored", h, None, toks, 4), expect("removed", [h[1]]), expect("cleared")],
         TS, None)

    # Every array length of BlockStored and BlockRemoved.
    def series(length):
        hs = [rh(), rh()]
        par = rh()
        tk = [rng.randrange(0, 1 << 17) for _ in range(8)]
        full = stored(hs, par, tk, 4, None, "GPU", "adapter-a", [None, None], 1,
                      "full_attention", None, "LOCAL")
        ev = full[:length]
        kw = dict(medium="GPU" if length >= 7 else None,
                  lora="adapter-a" if length >= 8 else None,
                  group=1 if length >= 10 else None)
        return ev, expect("stored", hs, par, tk, 4, **kw)

    for length in (6, 7, 8, 9, 10, 12, 13):
        ev, exp = series(length)
        b = pack([TS, [ev], 1])
        case("vllm_stored_arr%d" % length, "BlockStored as a %d-element array" % length, b,
             [exp], TS, 1)

    for length, medium, group in ((2, None, None), (3, "GPU", None), (4, "CPU", 2),
                                  (5, "CPU", 2)):
        hs = [rh(), rh(), rh()]
        ev = ["BlockRemoved", hs, medium, group, "LOCAL"][:length]
        b = pack([TS, [ev], 0])
        case("vllm_removed_arr%d" % length, "BlockRemoved as a %d-element array" % length, b,
             [expect("removed", hs, medium=medium, group=group)], TS, 0)

    # Trailing extra elements are ignored (a future vLLM field).
    hs = [rh()]
    tk = list(range(100, 104))
    ev = stored(hs, None, tk, 4, 7, "GPU", None, None, 3, "sliding_window", 4096, None,
                "engine", {"future": [1, 2, 3]}, 42)
    case("vllm_stored_arr16", "BlockStored with 3 trailing unknown elements (16)",
         pack([TS, [ev], 0]), [expect("stored", hs, None, tk, 4, "GPU", group=3)], TS, 0)

    # 16-token blocks: a 16-element token array is dc 00 10; u32 token ids (ce).
    hs = [rh()]
    tk = [rng.randrange(65536, 1 << 32) for _ in range(16)]
    b = pack([TS, [stored(hs, None, tk, 16, None, "GPU")], 0])
    assert bytes.fromhex("dc0010ce") in b
    case("vllm_block16", "one 16-token block: token_ids encoded dc 00 10, u32 ids", b,
         [expect("stored", hs, None, tk, 16, "GPU")], TS, 0)

    # A typical batch: 32 blocks of 16 tokens (Qwen-size vocabulary).
    hs = [rh() for _ in range(32)]
    tk = [rng.randrange(0, 151936) for _ in range(512)]
    par = rh()
    case("vllm_typical_32x16", "32 blocks x 16 tokens in one BlockStored (the common case)",
         pack([TS, [stored(hs, par, tk, 16, None, "GPU", None, None, 0)], 0]),
         [expect("stored", hs, par, tk, 16, "GPU", group=0)], TS, 0)

    # bin hashes: 32-byte digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), folded to u64.
    digs = [rng.randbytes(32) for _ in range(2)]
    pdig = rng.randbytes(32)
    short = bytes.fromhex("0102030405")
    tk = list(range(8))
    b = pack([TS, [stored(digs, pdig, tk, 4, None, "GPU"),
                   ["BlockRemoved", [digs[0], short], "GPU"]], 0])
    assert bytes.fromhex("c420") in b
    case("vllm_bin_hashes", "32-byte bin hashes and parent (last 8 bytes BE); a 5-byte bin",
         b, [expect("stored", digs, pdig, tk, 4, "GPU"),
             expect("removed", [digs[0], short], medium="GPU")], TS, 0)

    # Signed hashes (SGLang's Python hash()): negative fixint, int8..int64.
    hs = [-1, -(1 << 63), -5, -200, -40000, -(1 << 40), 5, (1 << 63) + 7]
    tk = list(range(32))
    case("signed_hashes", "negative and signed hashes in every width -> u64 two's complement",
         pack([TS, [stored(hs, -12345, tk, 4, None, "GPU")], 0]),
         [expect("stored", hs, -12345, tk, 4, "GPU")], TS, 0)

    # EAGLE bigram pairs.
    base = [rng.randrange(0, 150000) for _ in range(9)]
    pairs = [[base[i], base[i + 1]] for i in range(8)]
    hs = [rh(), rh()]
    case("vllm_eagle_pairs", "token_ids as EAGLE pairs [[t0,t1],[t1,t2],...]",
         pack([TS, [stored(hs, None, pairs, 4, None, "GPU")], 0]),
         [expect("stored", hs, None, pairs, 4, "GPU")], TS, 0)

    # Unknown tags between good events; Dynamo's "Ignored".
    h1, h2 = rh(), rh()
    case("unknown_tag", "unknown tags (array and map) are ignored, their neighbours decode",
         pack([TS, [stored([h1], None, [1, 2, 3, 4], 4),
                    ["BlockUpdated", [1, 2], {"x": [1.5, None]}, "whatever"],
                    {"type": "KVCacheResized", "blocks": 12, "token_ids": "not tokens"},
                    ["Ignored"],
                    ["BlockRemoved", [h2]]], 0]),
         [expect("stored", [h1], None, [1, 2, 3, 4], 4), ignored(), ignored(), ignored(),
          expect("removed", [h2])], TS, 0)

    # Locality (map era field, also position 12 of a 13-element array).
    hs = [[rh()] for _ in range(5)]
    tk = [9, 8, 7, 6]
    case("locality", "locality LOCAL kept; REMOTE and unknown dropped (remote=true)",
         pack([TS, [
             stored(hs[0], None, tk, 4, None, "STORAGE", None, None, None, None, None, "LOCAL"),
             stored(hs[1], None, tk, 4, None, "STORAGE", None, None, None, None, None,
                    "REMOTE"),
             stored(hs[2], None, tk, 4, None, "FS", None, None, None, None, None, "MARS"),
             {"type": "BlockStored", "block_hashes": hs[3], "parent_block_hash": None,
              "token_ids": tk, "block_size": 4, "lora_id": None, "medium": "OBJ",
              "lora_name": None, "locality": "REMOTE"},
             {"type": "BlockRemoved", "block_hashes": hs[4], "medium": "STORAGE",
              "locality": "LOCAL"}], 0]),
         [expect("stored", hs[0], None, tk, 4, "STORAGE"),
          expect("stored", hs[1], None, tk, 4, "STORAGE", remote=True),
          expect("stored", hs[2], None, tk, 4, "FS", remote=True),
          expect("stored", hs[3], None, tk, 4, "OBJ", remote=True),
          expect("removed", hs[4], medium="STORAGE")], TS, 0)

    # Media: every name of the mapping, empty and unknown.
    media = list(TIERS.keys()) + ["TAPE", "gpu", "cpu_pinned"]
    evs, exps = [], []
    for m in media:
        hs = [rh()]
        evs.append(["BlockRemoved", hs, m])
        e = expect("removed", hs, medium=m)
        if m in ("gpu", "cpu_pinned"):  # case-insensitive
            e.update(tier=TIERS[m.upper()], unknown_medium=False)
        exps.append(e)
    case("media", "medium strings -> tiers (unknown -> device + warning, case-insensitive)",
         pack([TS, evs, 0]), exps, TS, 0)

    # One corrupt event between two good ones (Dynamo PR #14530 dropped the whole batch).
    g1, g2 = [rh(), rh()], [rh()]
    case("corrupt_middle", "a bad event between two good ones: only it fails",
         pack([TS, [stored(g1, None, list(range(8)), 4, None, "GPU"),
                    stored([rh()], None, [1, 2, "three", 4], 4, None, "GPU"),
                    stored(g2, g1[1], list(range(8, 12)), 4, None, "GPU")], 0]),
         [expect("stored", g1, None, list(range(8)), 4, "GPU"),
          bad("stored", "events[1].token_ids[2]: expected an integer, found a string"),
          expect("stored", g2, g1[1], list(range(8, 12)), 4, "GPU")], TS, 0)

    # Many kinds of bad events, each alone in its failure, good ones around them.
    good = stored([77], None, [1, 2, 3, 4], 4)
    bads = [
        (stored([rh()], None, [1, 1 << 32, 3, 4], 4),
         bad("stored", "events[1].token_ids[1]: 4294967296 is not in [0, 4294967295]")),
        (stored([rh()], None, [1, -2, 3, 4], 4),
         bad("stored", "events[2].token_ids[1]: -2 is not in [0, 4294967295]")),
        (stored(["abc"], None, [1, 2, 3, 4], 4),
         bad("stored", "events[3].block_hashes[0]: expected an integer or non-empty binary")),
        (stored([1], None, [1, 2, 3, 4], 0),
         bad("stored", "events[4].block_size: expected an integer in [1, 4294967295]")),
        (["BlockStored", [1], None],
         bad("stored", "events[5]: BlockStored array of 3 elements, need at least 5")),
        ([7, [1]], bad("ignored", "events[6][0] (tag): expected a string, found an integer")),
        ({"block_hashes": [1]}, bad("ignored", "events[7]: map without a \"type\" key")),
        (stored([1], None, [1, 2, 3, 4], 4, None, 5),
         bad("stored", "events[8].medium: expected a string or nil, found an integer")),
        ("BlockStored", bad("ignored", "events[9]: expected an array or a map, found a string")),
        ([], bad("ignored", "events[10]: empty array (no tag)")),
        (stored([1], None, [[1, 2], 3], 4),
         bad("stored", "events[11].token_ids[1]: expected an [a, b] pair like token_ids[0]")),
        (stored([1], None, [[1, 2, 3]], 4),
         bad("stored", "events[12].token_ids[0]: expected an [a, b] pair")),
        (stored([1], 2.5, [1, 2, 3, 4], 4),
         bad("stored", "events[13].parent_block_hash: expected an integer, non-empty binary")),
        (stored([1], None, [1, 2, 3, 4], 4, None, None, 12),
         bad("stored", "events[14].lora_name: expected a string or nil, found an integer")),
        (stored([1], None, [1, 2, 3, 4], 4, None, None, None, None, -1),
         bad("stored", "events[15].group_idx: expected an integer in [0, 4294967295] or nil, "
             "found -1")),
        ({"type": "BlockRemoved"}, bad("removed", "events[16]: BlockRemoved without")),
        ({"type": "BlockStored", "block_hashes": [1], "token_ids": [1], "block_size": 4,
          "medium": "GPU", "medium2": 1, "block_size2": 0, "parent_block_hash": None,
          "lora_name": None, "lora_id": None, "extra_keys": None, "group_idx": None,
          "locality": None, "cache_salt": None, "is_eagle": 3},
         bad("stored", "events[17].is_eagle: expected a boolean or nil, found an integer")),
        (stored([b""], None, [1, 2, 3, 4], 4),
         bad("stored", "events[18].block_hashes[0]: expected an integer or non-empty binary, "
             "found binary")),
        (["BlockStored", 5, None, [1], 4],
         bad("stored", "events[19].block_hashes: expected an array, found an integer")),
        ({"type": "BlockStored", "block_hashes": [1], "block_size": 4},
         bad("stored", "events[20]: BlockStored without \"token_ids\"")),
        (stored([1], None, [1, 2, 3, 4], 4, None, None, {"cache_salt": 5}),
         bad("stored", "events[21].metadata.cache_salt: expected a string or nil")),
    ]
    evs = [good]
    exps = [expect("stored", [77], None, [1, 2, 3, 4], 4)]
    for ev, e in bads:
        evs.append(ev)
        exps.append(e)
    evs.append(good)
    exps.append(expect("stored", [77], None, [1, 2, 3, 4], 4))
    case("bad_events", "each event-level error alone, good events first and last",
         pack([TS, evs, 0]), exps, TS, 0)

    # ts forms and dp rank forms.
    case("ts_float32", "ts as float32 (ca), dp rank nil",
         pack([1.5, [["AllBlocksCleared"]], None], single_float=True), [expect("cleared")],
         1.5, None)
    case("ts_int", "ts as an integer, big dp rank", pack([1700000000, [], 65535]), [],
         1700000000.0, 65535)
    case("ts_nil_extra", "ts nil; a 4th batch element is ignored",
         pack([None, [["AllBlocksCleared"]], 2, "future"]), [expect("cleared")], None, 2)

    # ---- vLLM map era (PR #42892) --------------------------------------------------------

    def map_stored(hs, parent, tk, bs, medium="GPU", lora=None, **extra):
        m = {"type": "BlockStored", "block_hashes": hs, "parent_block_hash": parent,
             "token_ids": tk, "block_size": bs, "lora_id": None, "medium": medium,
             "lora_name": lora}
        m.update(extra)
        return m

    doc_map = map_stored([HASH0], None, TOKENS4, 4, extra_keys=[None], group_idx=0,
                         kv_cache_spec_kind="full_attention")
    b = pack([TS, [doc_map], 0])
    assert len(b) == 197, len(b)
    case("vllm_doc_map", "docs/wire-formats.md 1.6: map-era batch (197 bytes)", b,
         [expect("stored", [HASH0], None, TOKENS4, 4, "GPU", group=0)], TS, 0)

    hs = [rh(), rh()]
    b = pack([TS, [{"type": "BlockRemoved", "block_hashes": [HASH0], "medium": "GPU",
                    "group_idx": 0},
                   {"type": "AllBlocksCleared"},
                   map_stored(hs, HASH0, list(range(16, 24)), 4, "CPU", "adapter-a",
                              group_idx=2)], 0])
    case("vllm_map_kinds", "map era: removed (with group_idx), cleared, stored on CPU with LoRA",
         b, [expect("removed", [HASH0], medium="GPU", group=0), expect("cleared"),
             expect("stored", hs, HASH0, list(range(16, 24)), 4, "CPU", "adapter-a",
                    group=2)], TS, 0)

    hs = [rh()]
    items = list(map_stored(hs, None, [5, 6, 7, 8], 4, "GPU", "adapter-a",
                            cache_salt="tenant-a").items())
    items.reverse()  # "type" last
    items.insert(2, ("some_future_key", {"nested": [[1, 2], {"a": None}], "n": -3}))
    items.insert(0, ("another", b"\x01\x02"))
    b = pack([TS, [dict(items)], 0])
    case("vllm_map_shuffled", "map keys reversed ('type' last), unknown keys, cache_salt",
         b, [expect("stored", hs, None, [5, 6, 7, 8], 4, "GPU", "adapter-a", "tenant-a")],
         TS, 0)

    hs = [rh()]
    b = pack([TS, [{"type": "BlockStored", "block_hashes": hs, "token_ids": [1, 2, 3, 4, 5],
                    "block_size": 4, "is_eagle": True}], 0])
    case("vllm_map_minimal_eagle", "map with only the required keys and is_eagle", b,
         [expect("stored", hs, None, [1, 2, 3, 4, 5], 4, eagle=True)], TS, 0)

    # ---- outer batch as a map (defensive) --------------------------------------------------
    hs = [rh()]
    b = pack({"ts": TS, "events": [stored(hs, None, [1, 2, 3, 4], 4, None, "GPU")],
              "data_parallel_rank": 3})
    case("outer_map_vllm", "outer batch as a map {ts, events, data_parallel_rank}", b,
         [expect("stored", hs, None, [1, 2, 3, 4], 4, "GPU")], TS, 3)
    b = pack({"events": [["AllBlocksCleared"]], "x-unknown": [1, {"y": 2}], "attn_dp_rank": 2,
              "ts": 2.0})
    case("outer_map_sglang", "outer map, SGLang's attn_dp_rank, keys out of order", b,
         [expect("cleared")], 2.0, 2)

    # ---- SGLang ----------------------------------------------------------------------------
    b = pack([1.0, [["BlockStored", [123], None, [1, 2], 2, None, "GPU",
                     {"cache_salt": "tenant-a"}]], None])
    assert b.hex() == DOC_SGLANG and len(b) == 58, b.hex()
    case("sglang_doc_salted", "docs/wire-formats.md 2: SGLang salted store (58 bytes)", b,
         [expect("stored", [123], None, [1, 2], 2, "GPU", salt="tenant-a")], 1.0, None)

    # Per-page events, signed chained hashes, media enum, session_id in metadata.
    page = 2
    hs = [rng.getrandbits(64) - (1 << 63) for _ in range(3)]
    tk = [rng.randrange(0, 150000) for _ in range(6)]
    evs = [["BlockStored", [hs[0]], None, tk[0:2], page, None, "GPU"],
           ["BlockStored", [hs[1]], hs[0], tk[2:4], page, None, "GPU",
            {"cache_salt": "tenant-b", "session_id": "s-1"}],
           ["BlockStored", [hs[2]], hs[1], tk[4:6], page, None],
           ["BlockRemoved", [hs[2]], "CPU_PINNED"],
           ["BlockRemoved", [hs[1]], "DISK"],
           ["BlockRemoved", [hs[0]], "EXTERNAL"],
           ["BlockRemoved", [hs[0]]],
           ["AllBlocksCleared"]]
    case("sglang_pages", "SGLang: one event per page, signed hashes, media enum, attn_dp_rank",
         pack([3.25, evs, 1]),
         [expect("stored", [hs[0]], None, tk[0:2], page, "GPU"),
          expect("stored", [hs[1]], hs[0], tk[2:4], page, "GPU", salt="tenant-b"),
          expect("stored", [hs[2]], hs[1], tk[4:6], page),
          expect("removed", [hs[2]], medium="CPU_PINNED"),
          expect("removed", [hs[1]], medium="DISK"),
          expect("removed", [hs[0]], medium="EXTERNAL"),
          expect("removed", [hs[0]]), expect("cleared")], 3.25, 1)

    hs = [-7]
    b = pack([4.0, [{"type": "BlockStored", "block_hashes": hs, "parent_block_hash": -8,
                     "token_ids": [3, 4], "block_size": 2, "lora_id": None, "medium": "GPU",
                     "metadata": {"session_id": "s-2", "cache_salt": "tenant-c"}},
                    {"type": "BlockRemoved", "block_hashes": hs, "medium": "GPU"}], 0])
    case("sglang_map_era", "SGLang tagged maps with a metadata map", b,
         [expect("stored", hs, -8, [3, 4], 2, "GPU", salt="tenant-c"),
          expect("removed", hs, medium="GPU")], 4.0, 0)

    # ---- batch-level errors -----------------------------------------------------------------
    full = pack([TS, [stored([1, 2], None, list(range(300, 308)), 4, None, "GPU")], 0])
    case("err_truncated", "a valid batch cut inside token_ids", full[:30],
         error="truncated")
    case("err_trailing", "a valid batch followed by one more byte", full + b"\x00",
         error="trailing bytes: 1 after the batch")
    case("err_not_msgpack", "byte 0xc1 is never msgpack", b"\xc1\x93\x00",
         error="invalid msgpack: byte 0xc1 at offset 0")
    case("err_outer_string", "a string, not a batch", pack("hello"),
         error="batch: expected an array [ts, events, dp_rank] or a map, found a string")
    case("err_outer_short", "a 1-element array", pack([1.0]),
         error="batch: array of 1 element, expected")
    case("err_events_not_array", "events is a map", pack([1.0, {}, 0]),
         error="batch[1] (events): expected an array, found a map")
    case("err_dp_rank_negative", "dp rank -1", pack([1.0, [], -1]),
         error="batch[2] (dp_rank): expected an integer in [0, 4294967295] or nil, found -1")
    case("err_ts_string", "ts is a string", pack(["now", [], 0]),
         error="batch[0] (ts): expected a number or nil, found a string")
    case("err_lying_header", "an array claiming 2^32-1 elements in a 16-byte payload",
         bytes.fromhex("93cb3ff0000000000000dd ffffffff 00".replace(" ", "")),
         error="truncated")
    case("err_bad_inside_event", "byte 0xc1 inside an event", bytes.fromhex(
        "93cb3ff000000000000091 93 ac426c6f636b52656d6f766564 91 c1 c0 00".replace(" ", "")),
         error="invalid msgpack: byte 0xc1 at offset 26 (in events[0])")
    case("err_map_no_events", "outer map without events", pack({"ts": 1.0}),
         error="batch: map without an \"events\" key")

    # ---- later additions (append here: the random stream is shared, so inserting a case
    # above would change every fixture after it) ----------------------------------------------

    # A producer with Dynamo's typed tail (block_mm_infos before group_idx): not an integer at
    # group_idx's position, so it is skipped, not an error.
    hs = [rh()]
    tk = [11, 12, 13, 14]
    ev = stored(hs, None, tk, 4, None, "GPU", None, None, [{"mm_objects": []}], 5)
    case("vllm_stored_tail_by_type", "a non-integer where vLLM has group_idx is skipped",
         pack([TS, [ev], 0]), [expect("stored", hs, None, tk, 4, "GPU")], TS, 0)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data", "kv_events")
    os.makedirs(out, exist_ok=True)
    build()
    names = set()
    for name, payload, side in CASES:
        assert name not in names, name
        names.add(name)
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(payload)
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(side, f, indent=1, sort_keys=True)
            f.write("\n")
    for fn in os.listdir(out):  # drop fixtures of cases that no longer exist
        stem, ext = os.path.splitext(fn)
        if ext in (".bin", ".json") and stem not in names:
            os.remove(os.path.join(out, fn))
    print("gen_kv_events: %d cases in %s" % (len(CASES), os.path.normpath(out)))


if __name__ == "__main__":
    main()
