#!/usr/bin/python3
"""chat_corpus.py: a deterministic, seeded corpus of chat requests for the chat-template oracle.

For every model: system/user/assistant conversations of several turns, empty and unicode
content, content that looks like template syntax ("{{", "{%", "<|im_start|>"), tool definitions
(JSON-schema functions), assistant tool_calls (arguments as objects and as strings) and
tool-role results, add_generation_prompt both ways, enable_thinking true/false/absent,
reasoning_content, list-of-parts content; and malformed ones (roles out of order, no messages,
content None) that make some templates raise. Output: JSON lines
  {"id": N, "model": M, "messages": "<json>", "tools": "<json>"|null, "kwargs": "<json>"|null,
   "add_generation_prompt": bool}
(the JSON-valued fields are strings, byte-exact inputs for both renderers).

Usage: chat_corpus.py [--seed S] [--per-model N] MODEL...   (writes to stdout)
"""
import json
import random
import sys

TEXTS = [
    "Hello!", "What is 2+2?", "", " ", "  padded  ", "line one\nline two\n", "\n\nleading newlines",
    "trailing newlines\n\n", "héllo wörld ✓ — ünïcödé", "中文内容，测试。", "emoji 🎉🚀 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "{{ not a variable }}", "{% if x %}not a block{% endif %}", "{# not a comment #}",
    "<|im_start|>system\nfake<|im_end|>", "<start_of_turn>user", "<｜User｜>sneaky",
    "quotes ' and \" and \\ backslash", "tab\there", "<tool_response>\nsome\n</tool_response>",
    "<think>\nhidden reasoning\n</think>\n\nvisible answer", "before</think>after",
    "nbsp\u00a0inside\u00a0", "\u3000ideographic space\u3000", "a" * 300, "null", "None",
    "<|eot_id|>", "ends with space ", "\ttabbed\t",
]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers: a+b.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number", "minimum": -1.5e10, "maximum": 1e-7},
            "b": {"type": "integer", "default": 0}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search \"docs\" for {{query}} — ünïcode 中文",
        "parameters": {"type": "object", "properties": {
            "q": {"type": "string"}, "limit": {"type": "integer"},
            "filters": {"type": "array", "items": {"type": "string"}},
            "exact": {"type": "boolean", "default": False}, "none": {"default": None}}}}},
]


def text(r):
    return r.choice(TEXTS) if r.random() < 0.7 else " ".join(r.choice(TEXTS) for _ in range(r.randint(1, 3)))


def tool_call(r):
    name = r.choice(["get_weather", "add", "search"])
    args = r.choice([{"city": "Paris"}, {"a": 1, "b": 2.5}, {"q": "x \"y\" ü", "limit": 3},
                     {}, {"nested": {"l": [1, None, True, 0.1]}}])
    if r.random() < 0.5:
        args = json.dumps(args, ensure_ascii=r.random() < 0.5)
    tc = {"type": "function", "function": {"name": name, "arguments": args}}
    if r.random() < 0.3:
        tc["id"] = "call_%d" % r.randint(0, 999)
    return tc


def assistant(r, model, tools_on):
    m = {"role": "assistant", "content": text(r)}
    if model == "qwen3" and r.random() < 0.3:
        m["reasoning_content"] = r.choice(["I think.", "\nstep 1\nstep 2\n", ""])
    if tools_on and r.random() < 0.4:
        m["tool_calls"] = [tool_call(r) for _ in range(r.randint(1, 2))]
        if model == "deepseek_v3" or r.random() < 0.3:
            m["content"] = None if model == "deepseek_v3" else ""
    return m


def conversation(r, model):
    tools_on = r.random() < 0.35
    msgs = []
    if r.random() < 0.5:
        msgs.append({"role": "system", "content": text(r)})
    turns = r.randint(1, 4)
    for t in range(turns):
        msgs.append({"role": "user", "content": text(r)})
        if t < turns - 1 or r.random() < 0.4:
            a = assistant(r, model, tools_on)
            msgs.append(a)
            if a.get("tool_calls"):
                for _ in a["tool_calls"]:
                    msgs.append({"role": "tool", "content": text(r)})
                if r.random() < 0.7:
                    msgs.append({"role": "assistant", "content": text(r)})
    kind = r.random()
    if kind < 0.06:  # roles out of order: gemma raises
        msgs.insert(r.randint(0, len(msgs)), {"role": "assistant", "content": text(r)})
    elif kind < 0.09:
        msgs = []
    elif kind < 0.12 and model == "gemma3":
        msgs.append({"role": "user", "content": [{"type": "text", "text": text(r)},
                                                 {"type": "image"}]})
        if msgs[0]["role"] == "user" and len(msgs) > 1 and msgs[-2]["role"] == "user":
            msgs.insert(-1, {"role": "assistant", "content": "ok"})
    elif kind < 0.14:
        msgs.append({"role": "user", "content": None})
    elif kind < 0.16:
        msgs.append({"role": "user", "content": [{"type": "text", "text": "parts"}]})
    tools = None
    if tools_on:
        tools = r.sample(TOOLS, r.randint(1, 3)) if r.random() < 0.9 else []
    kwargs = None
    k = r.random()
    if model == "qwen3" and k < 0.6:
        kwargs = {"enable_thinking": k < 0.3}
    elif k < 0.1:
        kwargs = {"enable_thinking": True, "custom": "x"}
    elif k < 0.15:
        kwargs = {"bos_token": "<override>"}
    return msgs, tools, kwargs


def main():
    args = sys.argv[1:]
    seed, per = 1234, 220
    while args and args[0].startswith("--"):
        if args[0] == "--seed":
            seed = int(args[1])
        elif args[0] == "--per-model":
            per = int(args[1])
        args = args[2:]
    n = 0
    for mi, model in enumerate(args):
        r = random.Random(seed * 1000 + mi)
        for _ in range(per):
            msgs, tools, kwargs = conversation(r, model)
            row = {"id": n, "model": model,
                   "messages": json.dumps(msgs, ensure_ascii=r.random() < 0.3),
                   "tools": None if tools is None else json.dumps(tools),
                   "kwargs": None if kwargs is None else json.dumps(kwargs),
                   "add_generation_prompt": r.random() < 0.5}
            print(json.dumps(row, ensure_ascii=False))
            n += 1


if __name__ == "__main__":
    main()
