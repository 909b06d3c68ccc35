#!/usr/bin/python3
"""`kvrouter mocker` from the outside: the simulated vLLM engine as OpenAI clients, vLLM KV-event
subscribers and `kvrouter serve` see it.

It starts mockers on loopback (--port 0, event ports picked free) and checks the HTTP shapes
(completions, chat, SSE streams, /v1/models, /tokenize, /health), vLLM's error bodies and
statuses, bad command lines, prefix caching (cached_tokens, a shorter time to first token, the
prefix-cache counters), cancellation on client disconnect, the KV events on the wire (read by an
independent decoder written here with Debian's python3-zmq + python3-msgpack from
docs/wire-formats.md 1.2-1.6: frames, sequence numbers, array and map encodings, parent links,
replay), that replaying every event gives exactly the blocks the engine holds
(/debug/kv_blocks), that `kvrouter serve` subscribed to a mocker sees the same prefixes (through
dropped batches and data-parallel ranks), and vLLM's bind/connect rule.
Every child must exit 0 on SIGTERM with no sanitizer report on stderr.
Usage: test_mocker.py <path to kvrouter>.
"""
import concurrent.futures
import http.client
import json
import os
import random
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

import msgpack
import zmq

from kvr_harness import (RESULTS as results, Child, check, eventually,
                         run_scenarios, sse_events, with_free_ports)

KVR = sys.argv[1]
SEED = int(os.environ.get("KVR_TEST_SEED", str(int(time.time()) % 100000)))
from kvr_harness import SANITIZER_RE, VERBOSE  # noqa: E402
def start_mocker(*extra, what="mocker"):
    args = [KVR, "mocker", "--host", "127.0.0.1", "--port", "0"] + [str(a) for a in extra]
    return Child(args, what)


def sse_request(m, path, body, headers=None, timeout=60.0):
    """POST a streaming request; (status, content type, raw body bytes, seconds to the first
    `data:` line, seconds to the end). Reads the SSE stream line by line as it arrives."""
    conn = http.client.HTTPConnection(m.host, m.port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        t0 = time.monotonic()
        conn.request("POST", path, body=json.dumps(body).encode(), headers=h)
        r = conn.getresponse()
        first = None
        raw = b""
        while True:
            line = r.readline()
            if not line:
                break
            if first is None and line.startswith(b"data: "):
                first = time.monotonic() - t0
            raw += line
        return r.status, r.headers.get("Content-Type"), raw, first, time.monotonic() - t0
    finally:
        conn.close()


def toks(rng, n, lo=1000, hi=30000):
    return [rng.randrange(lo, hi) for _ in range(n)]


def err_shape_ok(body, code):
    return (isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], dict)
            and isinstance(body["error"].get("message"), str) and body["error"]["message"]
            and isinstance(body["error"].get("type"), str) and "param" in body["error"]
            and body["error"]["param"] is None and body["error"].get("code") == code)


# ---------------------------------------------------------------------------------------------
# An independent vLLM KV-event decoder (docs/wire-formats.md 1.2 - 1.6)

class KvState:
    """The blocks a subscriber that saw every event holds, with the faithfulness rules:
    a stored hash is new, a removed hash is present, a parent is nil or was stored before
    (and, since the storing sequence holds it, is still present)."""

    def __init__(self):
        self.present = set()
        self.ever = set()
        self.by_key = {}  # (parent hash or None, block tokens) -> hash
        self.n_stored = self.n_removed = self.n_cleared = 0
        self.bad_parent = []       # parent never stored before
        self.parent_absent = []    # parent stored before but not present now
        self.dup_store = []
        self.remove_absent = []

    def apply(self, ev):
        if ev["type"] == "BlockStored":
            parent = ev["parent"]
            if parent is not None and parent not in self.ever:
                self.bad_parent.append(parent)
            elif parent is not None and parent not in self.present:
                self.parent_absent.append(parent)
            prev = parent
            bs = ev["block_size"]
            for i, h in enumerate(ev["hashes"]):
                if h in self.present:
                    self.dup_store.append(h)
                self.present.add(h)
                self.ever.add(h)
                self.by_key[(prev, tuple(ev["tokens"][i * bs:(i + 1) * bs]))] = h
                prev = h
                self.n_stored += 1
        elif ev["type"] == "BlockRemoved":
            for h in ev["hashes"]:
                if h not in self.present:
                    self.remove_absent.append(h)
                self.present.discard(h)
                self.n_removed += 1
        elif ev["type"] == "AllBlocksCleared":
            self.present.clear()
            self.n_cleared += 1

    def cached_prefix_blocks(self, tokens, bs):
        """Leading full blocks of `tokens` present, following parent links."""
        prev, n = None, 0
        for i in range(len(tokens) // bs):
            h = self.by_key.get((prev, tuple(tokens[i * bs:(i + 1) * bs])))
            if h is None or h not in self.present:
                break
            prev, n = h, n + 1
        return n


def is_u64(x):
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < (1 << 64)


def normalize_event(e, fmt, bs, problems):
    """One event -> {"type", "hashes", "parent", "tokens", "block_size", "medium"}, appending
    every deviation from vLLM's encoding (`fmt` "array" or "map") to problems."""
    if fmt == "array":
        if not isinstance(e, list) or not e or not isinstance(e[0], str):
            problems.append(f"array-format event is not [tag, ...]: {e!r:.200}")
            return None
        tag = e[0]
        if tag == "BlockStored":
            if len(e) < 7:
                problems.append(f"BlockStored has {len(e)} elements, want >= 7: {e!r:.200}")
                return None
            ev = {"type": tag, "hashes": e[1], "parent": e[2], "tokens": e[3],
                  "block_size": e[4], "lora_id": e[5], "medium": e[6]}
        elif tag == "BlockRemoved":
            if len(e) < 3:
                problems.append(f"BlockRemoved has {len(e)} elements, want >= 3: {e!r:.200}")
                return None
            ev = {"type": tag, "hashes": e[1], "medium": e[2]}
        elif tag == "AllBlocksCleared":
            ev = {"type": tag}
        else:
            problems.append(f"unknown tag {tag!r}")
            return None
    else:
        if not isinstance(e, dict) or not e:
            problems.append(f"map-format event is not a map: {e!r:.200}")
            return None
        keys = list(e.keys())
        if keys[0] != "type":
            problems.append(f"first key of a map event is {keys[0]!r}, not 'type'")
        tag = e.get("type")
        need = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                                "lora_id", "medium", "lora_name"],
                "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}.get(tag)
        if need is None:
            problems.append(f"unknown type {tag!r}")
            return None
        missing = [k for k in need if k not in e]
        if missing:
            problems.append(f"{tag} map lacks {missing}: keys {keys}")
            return None
        order = [k for k in keys if k in need]
        if order != need:
            problems.append(f"{tag} map keys not in declaration order: {keys}")
        ev = {"type": tag}
        if tag == "BlockStored":
            ev.update(hashes=e["block_hashes"], parent=e["parent_block_hash"],
                      tokens=e["token_ids"], block_size=e["block_size"], lora_id=e["lora_id"],
                      medium=e["medium"])
        elif tag == "BlockRemoved":
            ev.update(hashes=e["block_hashes"], medium=e["medium"])
    t = ev["type"]
    if t in ("BlockStored", "BlockRemoved"):
        if not isinstance(ev["hashes"], list) or not ev["hashes"] or \
                not all(is_u64(h) for h in ev["hashes"]):
            problems.append(f"{t} block_hashes not a non-empty list of u64: {ev['hashes']!r:.200}")
            return None
        if ev["medium"] != "GPU":
            problems.append(f"{t} medium {ev['medium']!r}, want 'GPU'")
    if t == "BlockStored":
        if ev["parent"] is not None and not is_u64(ev["parent"]):
            problems.append(f"parent_block_hash {ev['parent']!r} not nil or u64")
        if ev["block_size"] != bs:
            problems.append(f"block_size {ev['block_size']!r}, want {bs}")
        if not isinstance(ev["tokens"], list) or len(ev["tokens"]) != bs * len(ev["hashes"]) \
                or not all(isinstance(x, int) and x >= 0 for x in ev["tokens"]):
            problems.append(f"token_ids length {len(ev['tokens'])} != block_size {bs} x "
                            f"{len(ev['hashes'])} hashes (or not ints)")
            return None
        if ev["lora_id"] is not None:
            problems.append(f"lora_id {ev['lora_id']!r}, want nil")
    return ev


class Sub:
    """A SUB socket on one engine rank's PUB, decoding and applying every batch in sequence
    order; with a replay endpoint, fills gaps by a DEALER replay request (1.5)."""

    def __init__(self, ctx, endpoint, fmt="array", bs=16, rank=0, topic=b"", bind=False,
                 replay=None):
        self.ctx, self.fmt, self.bs, self.rank, self.topic = ctx, fmt, bs, rank, topic
        self.replay_ep = replay
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        if bind:
            self.sock.bind(endpoint)
            self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        else:
            mon = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED)
            self.sock.connect(endpoint)
            self.connected = bool(mon.poll(10000))
            self.sock.disable_monitor()
            mon.close(linger=0)
            self.endpoint = endpoint  # the caller waits for subscribed() (slow joiner)
        self.live_seqs = []      # seqs in arrival order
        self.payloads = {}       # seq -> payload bytes (live or replayed)
        self.replayed_seqs = []
        self.last = -1
        self.gaps = 0
        self.state = KvState()
        self.problems = []       # wire-format deviations
        self.frame_problems = []
        self.events = []         # (seq, normalized event)
        self.batch_ranks = set()
        self.batch_ts = []

    def close(self):
        self.sock.close(linger=0)

    def drain(self, timeout=0.0):
        end = time.monotonic() + timeout
        while True:
            left = max(0.0, end - time.monotonic())
            if not self.sock.poll(int(left * 1000)):
                return
            while True:
                try:
                    f = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._live(f)
            if time.monotonic() >= end:
                return

    def wait_seq(self, seq, timeout=10.0):
        end = time.monotonic() + timeout
        while self.last < seq and time.monotonic() < end:
            self.drain(0.05)
        return self.last >= seq

    def _live(self, f):
        if len(f) != 3:
            self.frame_problems.append(f"{len(f)} frames, want 3")
            return
        if f[0] != self.topic:
            self.frame_problems.append(f"topic frame {f[0]!r}, want {self.topic!r}")
        if len(f[1]) != 8:
            self.frame_problems.append(f"seq frame of {len(f[1])} bytes, want 8")
            return
        seq = struct.unpack(">Q", f[1])[0]
        self.live_seqs.append(seq)
        if seq <= self.last:
            if self.payloads.get(seq) != f[2]:
                self.frame_problems.append(f"seq {seq} seen again with other bytes")
            return
        if seq > self.last + 1:
            self.gaps += 1
            if self.replay_ep:
                self.fill(self.last + 1, seq)
        self._apply(seq, f[2])

    def replay(self, start, timeout=10.0):
        """[(seq, payload)] a DEALER gets for start, and whether the end marker came."""
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.setsockopt(zmq.RCVHWM, 0)
        d.connect(self.replay_ep)
        out, ended = [], False
        try:
            d.send_multipart([b"", struct.pack(">Q", start)])
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                if not d.poll(100):
                    continue
                f = d.recv_multipart()
                if len(f) != 3 or f[0] != b"" or len(f[1]) != 8:
                    self.frame_problems.append(f"replay reply of {len(f)} frames: {f!r:.200}")
                    continue
                if f[2] == b"":
                    ended = f[1] == b"\xff" * 8
                    if not ended:
                        self.frame_problems.append(f"replay end marker seq {f[1]!r}")
                    break
                out.append((struct.unpack(">Q", f[1])[0], f[2]))
        finally:
            d.close(linger=0)
        if not ended:
            self.frame_problems.append(f"replay from {start}: no end marker")
        return out, ended

    def fill(self, start, upto):
        got, _ = self.replay(start)
        for seq, payload in got:
            if seq < start or seq >= upto:
                continue
            if seq != self.last + 1:
                self.frame_problems.append(f"replay gave seq {seq} after {self.last}")
            self.replayed_seqs.append(seq)
            self._apply(seq, payload)

    def settle(self, upto, timeout=10.0, quiet=1.0):
        """Takes live batches until seq upto - 1 arrived, or none came for `quiet` seconds
        (the last ones may be dropped ones), then replays what is still missing."""
        end = time.monotonic() + timeout
        heard = time.monotonic()
        while self.last < upto - 1 and time.monotonic() < end:
            n = len(self.live_seqs)
            self.drain(0.05)
            if len(self.live_seqs) != n:
                heard = time.monotonic()
            elif time.monotonic() - heard > quiet:
                break
        if self.replay_ep and self.last + 1 < upto:
            self.fill(self.last + 1, upto)
        return self.last >= upto - 1

    def _apply(self, seq, payload):
        self.payloads[seq] = payload
        self.last = seq
        if payload[:1] != b"\x93":
            self.problems.append(f"seq {seq}: batch is not a 3-element array: {payload[:4]!r}")
        elif payload[1:2] != b"\xcb":
            self.problems.append(f"seq {seq}: ts is not a float64 (0xcb): {payload[1:2]!r}")
        try:
            b = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as e:  # noqa: BLE001 - any decode error is a finding
            self.problems.append(f"seq {seq}: undecodable payload: {e}")
            return
        if not isinstance(b, list) or len(b) != 3:
            self.problems.append(f"seq {seq}: batch {b!r:.200} is not [ts, events, dp_rank]")
            return
        ts, evs, rank = b
        self.batch_ts.append(ts)
        self.batch_ranks.add(rank)
        if not isinstance(ts, float) or abs(ts - time.time()) > 600:
            self.problems.append(f"seq {seq}: ts {ts!r} is not a current time")
        if rank != self.rank:
            self.problems.append(f"seq {seq}: dp_rank {rank!r}, want {self.rank}")
        if not isinstance(evs, list) or not evs:
            self.problems.append(f"seq {seq}: events {evs!r:.100} not a non-empty list")
            return
        for e in evs:
            ev = normalize_event(e, self.fmt, self.bs, self.problems)
            if ev is not None:
                self.events.append((seq, ev))
                self.state.apply(ev)


def kv_blocks(m):
    st, body = m.call("GET", "/debug/kv_blocks")
    if st != 200 or not isinstance(body, dict):
        return None
    return {r["dp_rank"]: set(r["block_hashes"]) for r in body.get("ranks", [])}


def numbered_batches(m, rank=0):
    """Batches the rank numbered: the ones sent plus the ones dropped by fault injection."""
    sent = m.metric("kvr_mocker_kv_event_batches_published_total", engine=rank) or 0
    dropped = m.metric("kvr_mocker_kv_event_batches_dropped_total", engine=rank) or 0
    return int(sent + dropped)


def wait_idle(m, timeout=30.0):
    def idle():
        r = m.metric("vllm:num_requests_running")
        w = m.metric("vllm:num_requests_waiting")
        return r == 0 and w == 0
    return eventually(idle, timeout)


def run_workload(m, reqs, concurrency=4, timeout=60.0):
    """reqs: [(tokens, max_tokens, stream, headers)]; returns [(status, usage or error)]."""
    def one(r):
        tokens, max_tokens, stream, headers = r
        body = {"model": "m", "prompt": tokens, "max_tokens": max_tokens}
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
            st, _, raw, _, _ = sse_request(m, "/v1/completions", body, headers, timeout)
            evs, _ = sse_events(raw)
            usage = None
            for e in evs:
                if e != "[DONE]":
                    j = json.loads(e)
                    usage = j.get("usage") or usage
            return st, usage
        st, res = m.call("POST", "/v1/completions", body, headers, timeout)
        return st, res.get("usage") if isinstance(res, dict) else res
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        return list(ex.map(one, reqs))


def shared_prefix_workload(rng, n, bs, n_prefixes=6, max_prompt=80, max_out=16):
    prefixes = [toks(rng, rng.randrange(bs, 10 * bs)) for _ in range(n_prefixes)]
    reqs = []
    for i in range(n):
        p = list(rng.choice(prefixes))
        p += toks(rng, rng.randrange(0, 6 * bs))
        p = p[:max_prompt]
        reqs.append((p, rng.randrange(1, max_out + 1), rng.random() < 0.3, None))
    return reqs


# ---------------------------------------------------------------------------------------------
# 1. HTTP shapes

def scenario_http_shapes():
    m = start_mocker("--model", "m", "--speedup", "20", "--max-model-len", "4096",
                     what="mocker(http)")
    try:
        # non-streaming completions, text prompt
        st, r = m.call("POST", "/v1/completions",
                       {"model": "m", "prompt": "The quick brown fox jumps", "max_tokens": 5})
        ok = st == 200 and isinstance(r, dict)
        check("completions: 200 JSON", ok, (st, r))
        if ok:
            check("completions: object text_completion", r.get("object") == "text_completion", r)
            check("completions: id and created", isinstance(r.get("id"), str) and r["id"]
                  and isinstance(r.get("created"), int), r)
            check("completions: model echoed", r.get("model") == "m", r)
            ch = r.get("choices") or [{}]
            check("completions: one choice with text, index 0, finish_reason length",
                  len(r.get("choices", [])) == 1 and ch[0].get("index") == 0
                  and isinstance(ch[0].get("text"), str) and ch[0]["text"]
                  and ch[0].get("finish_reason") == "length" and "logprobs" in ch[0], r)
            u = r.get("usage") or {}
            check("completions: usage counts", u.get("completion_tokens") == 5
                  and isinstance(u.get("prompt_tokens"), int) and u["prompt_tokens"] > 0
                  and u.get("total_tokens") == u.get("prompt_tokens", 0) + 5, u)
            check("completions: usage.prompt_tokens_details.cached_tokens",
                  isinstance((u.get("prompt_tokens_details") or {}).get("cached_tokens"), int), u)

        # token-id prompt: prompt_tokens is its length
        ids = list(range(1000, 1037))
        st, r = m.call("POST", "/v1/completions", {"model": "m", "prompt": ids, "max_tokens": 3})
        u = r.get("usage", {}) if isinstance(r, dict) else {}
        check("completions: token-id prompt counted", st == 200 and u.get("prompt_tokens") == 37
              and u.get("completion_tokens") == 3 and u.get("total_tokens") == 40, (st, r))

        # non-streaming chat
        st, r = m.call("POST", "/v1/chat/completions",
                       {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                                   {"role": "user", "content": "Hello there"}],
                        "max_tokens": 4})
        ok = st == 200 and isinstance(r, dict)
        check("chat: 200 JSON", ok, (st, r))
        if ok:
            check("chat: object chat.completion", r.get("object") == "chat.completion", r)
            ch = (r.get("choices") or [{}])[0]
            msg = ch.get("message") or {}
            check("chat: message role assistant with content", msg.get("role") == "assistant"
                  and isinstance(msg.get("content"), str) and msg["content"], r)
            check("chat: finish_reason length", ch.get("finish_reason") == "length", r)
            u = r.get("usage") or {}
            check("chat: usage", u.get("completion_tokens") == 4 and u.get("prompt_tokens", 0) > 0
                  and u.get("total_tokens") == u.get("prompt_tokens", 0) + 4
                  and "cached_tokens" in (u.get("prompt_tokens_details") or {}), u)

        # streaming chat with include_usage
        n = 7
        st, ctype, raw, _, _ = sse_request(
            m, "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "Stream me something"}],
             "max_tokens": n, "stream": True, "stream_options": {"include_usage": True}})
        check("chat stream: 200", st == 200, st)
        check("chat stream: Content-Type text/event-stream",
              (ctype or "").startswith("text/event-stream"), ctype)
        evs, probs = sse_events(raw)
        check("chat stream: every event is 'data: <one line>\\n\\n'", not probs, (probs, raw[:300]))
        check("chat stream: ends with data: [DONE]", evs and evs[-1] == "[DONE]", evs[-2:])
        js = []
        for e in evs[:-1]:
            try:
                js.append(json.loads(e))
            except ValueError:
                check("chat stream: event is JSON", False, e[:200])
        content = [j for j in js if j.get("choices")]
        usage = [j for j in js if "usage" in j and j.get("usage")]
        check("chat stream: chunk object names", all(j.get("object") == "chat.completion.chunk"
                                                     for j in js), [j.get("object") for j in js])
        check("chat stream: one id for every chunk", len({j.get("id") for j in js}) == 1,
              {j.get("id") for j in js})
        check("chat stream: exactly max_tokens content chunks", len(content) == n,
              (len(content), n))
        if content:
            d0 = content[0]["choices"][0].get("delta", {})
            check("chat stream: first chunk delta.role assistant", d0.get("role") == "assistant",
                  content[0])
            check("chat stream: later chunks carry content only",
                  all("role" not in c["choices"][0].get("delta", {})
                      and isinstance(c["choices"][0]["delta"].get("content"), str)
                      for c in content[1:]), content[1:3])
            check("chat stream: last content chunk finish_reason length",
                  content[-1]["choices"][0].get("finish_reason") == "length", content[-1])
            check("chat stream: earlier chunks finish_reason null",
                  all(c["choices"][0].get("finish_reason") is None for c in content[:-1]),
                  [c["choices"][0].get("finish_reason") for c in content])
        check("chat stream: include_usage gives one final chunk with choices [] and usage",
              len(usage) == 1 and js and js[-1] is usage[0] and js[-1].get("choices") == [],
              js[-2:])
        if usage:
            u = usage[0]["usage"]
            check("chat stream: usage numbers", u.get("completion_tokens") == n
                  and u.get("total_tokens") == u.get("prompt_tokens", 0) + n
                  and "cached_tokens" in (u.get("prompt_tokens_details") or {}), u)

        # streaming completions without include_usage
        st, ctype, raw, _, _ = sse_request(m, "/v1/completions",
                                           {"model": "m", "prompt": "Once upon a time",
                                            "max_tokens": 4, "stream": True})
        evs, probs = sse_events(raw)
        check("completions stream: 200 text/event-stream", st == 200
              and (ctype or "").startswith("text/event-stream"), (st, ctype))
        check("completions stream: SSE framing", not probs, probs)
        check("completions stream: ends with [DONE]", evs and evs[-1] == "[DONE]", evs[-2:])
        js = [json.loads(e) for e in evs[:-1]]
        check("completions stream: 4 text_completion chunks, no usage chunk",
              len(js) == 4 and all(j.get("object") == "text_completion" and len(j["choices"]) == 1
                                   and isinstance(j["choices"][0].get("text"), str)
                                   and not j.get("usage") for j in js), js)
        check("completions stream: finish_reason only on the last",
              [j["choices"][0].get("finish_reason") for j in js] == [None, None, None, "length"],
              [j["choices"][0].get("finish_reason") for j in js])

        # streaming completions with include_usage
        st, _, raw, _, _ = sse_request(m, "/v1/completions",
                                       {"model": "m", "prompt": list(range(500, 540)),
                                        "max_tokens": 2, "stream": True,
                                        "stream_options": {"include_usage": True}})
        evs, probs = sse_events(raw)
        js = [json.loads(e) for e in evs[:-1]] if evs and evs[-1] == "[DONE]" else []
        check("completions stream + usage: 2 chunks then usage then [DONE]",
              st == 200 and not probs and len(js) == 3 and js[-1].get("choices") == []
              and js[-1].get("usage", {}).get("prompt_tokens") == 40
              and js[-1]["usage"].get("completion_tokens") == 2, (st, probs, evs))

        # /v1/models
        st, r = m.call("GET", "/v1/models")
        d = (r.get("data") or [{}])[0] if isinstance(r, dict) else {}
        check("/v1/models shape", st == 200 and r.get("object") == "list" and len(r["data"]) == 1
              and d.get("id") == "m" and d.get("object") == "model"
              and isinstance(d.get("created"), int) and isinstance(d.get("owned_by"), str), r)

        # /tokenize
        st, a = m.call("POST", "/tokenize", {"model": "m", "prompt": "Hello tokenizer world"})
        st2, b = m.call("POST", "/tokenize", {"model": "m", "prompt": "Hello tokenizer world"})
        st3, c = m.call("POST", "/tokenize", {"model": "m", "prompt": "Something else entirely"})
        ok = st == 200 and isinstance(a, dict)
        check("/tokenize shape", ok and isinstance(a.get("tokens"), list) and a["tokens"]
              and a.get("count") == len(a["tokens"]) and a.get("max_model_len") == 4096
              and all(isinstance(t, int) for t in a["tokens"]), (st, a))
        check("/tokenize deterministic", ok and st2 == 200 and b.get("tokens") == a.get("tokens"),
              (a, b))
        check("/tokenize differs for other text", st3 == 200 and c.get("tokens") != a.get("tokens"),
              (a, c))
        if ok:
            st, r = m.call("POST", "/v1/completions",
                           {"model": "m", "prompt": "Hello tokenizer world", "max_tokens": 1})
            check("/tokenize count = completions prompt_tokens",
                  st == 200 and r["usage"]["prompt_tokens"] == a["count"], (a, r))

        st, h, raw = m.request("GET", "/health")
        check("/health 200", st == 200, (st, raw))
        st, r = m.call("GET", "/no/such/route")
        check("unknown route 404 in the error shape", st == 404 and err_shape_ok(r, 404), (st, r))

        # metric names and labels
        ms = m.metrics()
        names = {n for n, _, _ in ms}
        want = ["vllm:num_requests_running", "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                "vllm:prefix_cache_hits_total", "kvr_mocker_blocks_active",
                "kvr_mocker_requests_cancelled_total"]
        check("/metrics has the vLLM and mocker families", all(w in names for w in want),
              [w for w in want if w not in names])
        labelled = [l for n, l, _ in ms if n in want]
        check("/metrics labels model_name and engine",
              labelled and all(l.get("model_name") == "m" and l.get("engine") == "0"
                               for l in labelled), labelled[:3])
        check("/metrics requests counted", (m.metric("vllm:request_success_total") or 0) == 7,
              m.metric("vllm:request_success_total"))
    finally:
        m.stop()


# ---------------------------------------------------------------------------------------------
# 2. Errors

def scenario_ids():
    """Response ids are unique across engines and restarts, as vLLM's uuids are: a client or
    a log that keys answers by id never sees two answers with one id."""
    ms = [start_mocker("--model", "m", "--speedup", "50", what=f"mocker(ids {i})")
          for i in range(2)]
    try:
        ids = []
        for m in ms:
            for path, body in (("/v1/completions", {"model": "m", "prompt": "a b", "max_tokens": 1}),
                               ("/v1/chat/completions",
                                {"model": "m", "max_tokens": 1,
                                 "messages": [{"role": "user", "content": "hi"}]})) * 3:
                st, r = m.call("POST", path, body)
                ids.append(r.get("id") if st == 200 and isinstance(r, dict) else None)
        check("ids: every answer has cmpl-/chatcmpl- and 16 hex digits",
              all(isinstance(i, str) and re.fullmatch(r"(chat)?cmpl-[0-9a-f]{16}", i)
                  for i in ids), ids)
        check("ids: 12 answers of two engines, 12 distinct ids", len(set(ids)) == 12, ids)
    finally:
        for m in ms:
            m.stop()


def scenario_errors():
    m = start_mocker("--model", "m", "--speedup", "50", "--max-model-len", "128",
                     what="mocker(errors)")
    try:
        p100 = list(range(2000, 2100))
        st, r = m.call("POST", "/v1/completions", {"model": "m", "prompt": p100, "max_tokens": 28})
        check("prompt + max_tokens = max_model_len accepted", st == 200, (st, r))
        st, r = m.call("POST", "/v1/completions", {"model": "m", "prompt": p100, "max_tokens": 29})
        check("prompt + max_tokens > max_model_len: 400 in vLLM's shape",
              st == 400 and err_shape_ok(r, 400), (st, r))
        check("... the message names the limit", isinstance(r, dict)
              and "128" in r.get("error", {}).get("message", ""), r)
        st, r = m.call("POST", "/v1/chat/completions",
                       {"model": "m", "messages": [{"role": "user", "content": "x " * 300}],
                        "max_tokens": 4})
        check("chat prompt longer than max_model_len: 400", st == 400 and err_shape_ok(r, 400),
              (st, r))
        st, r = m.call("POST", "/v1/completions",
                       {"model": "m", "prompt": list(range(128)), "max_tokens": 1})
        check("prompt = max_model_len: 400", st == 400 and err_shape_ok(r, 400), (st, r))
        st, r = m.call("POST", "/v1/completions", '{"model": "m", "prompt": "hi", "max_tokens": ')
        check("bad JSON: 400 in vLLM's shape", st == 400 and err_shape_ok(r, 400), (st, r))
        check("bad JSON: the message says JSON", isinstance(r, dict)
              and "json" in r.get("error", {}).get("message", "").lower(), r)
        st, r = m.call("POST", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": "x"})
        check("wrong type: 400 naming max_tokens", st == 400 and err_shape_ok(r, 400)
              and "max_tokens" in r["error"]["message"], (st, r))
        st, r = m.call("POST", "/v1/chat/completions", {"model": "m", "messages": "nope"})
        check("chat messages not a list: 400 naming messages", st == 400 and err_shape_ok(r, 400)
              and "messages" in r["error"]["message"], (st, r))
        st, r = m.call("POST", "/v1/completions", {"model": "other", "prompt": "hi",
                                                    "max_tokens": 1})
        check("unknown model: 404 in vLLM's shape", st == 404 and err_shape_ok(r, 404), (st, r))
        check("unknown model: the message names it", isinstance(r, dict)
              and "other" in r.get("error", {}).get("message", ""), r)
        st, r = m.call("POST", "/v1/chat/completions",
                       {"model": "other", "messages": [{"role": "user", "content": "hi"}]})
        check("unknown model (chat): 404", st == 404 and err_shape_ok(r, 404), (st, r))
        errs = m.metric("kvr_mocker_http_errors_total", code="400")
        check("400s counted in /metrics", errs is not None and errs >= 6, errs)
        st, r = m.call("POST", "/v1/completions", {"model": "m", "prompt": [1, 2, 3],
                                                    "max_tokens": 2})
        check("still serving after errors", st == 200, (st, r))
    finally:
        m.stop()

    # 503: the waiting queue is full
    m = start_mocker("--model", "m", "--speedup", "1", "--max-num-seqs", "1", "--max-waiting", "1",
                     what="mocker(queue)")
    conns = []
    try:
        def open_stream(prompt):
            c = http.client.HTTPConnection(m.host, m.port, timeout=30)
            conns.append(c)
            c.request("POST", "/v1/completions",
                      body=json.dumps({"model": "m", "prompt": prompt, "max_tokens": 3000,
                                       "stream": True}).encode(),
                      headers={"Content-Type": "application/json"})
            return c
        a = open_stream(list(range(10, 50)))
        ra = a.getresponse()
        first = ra.readline()
        check("queue: first request streams", ra.status == 200 and first.startswith(b"data: "),
              (ra.status, first))
        open_stream(list(range(60, 100)))  # waits: max_num_seqs 1
        check("queue: second request waits",
              eventually(lambda: m.metric("vllm:num_requests_waiting") == 1, 10),
              m.metric("vllm:num_requests_waiting"))
        res = []
        for k in range(3):
            res.append(m.call("POST", "/v1/completions",
                              {"model": "m", "prompt": [7, 8, 9, k], "max_tokens": 1}, timeout=10))
        check("queue full: 503 in vLLM's shape",
              all(st == 503 and err_shape_ok(r, 503) for st, r in res), res)
        for c in conns:
            c.close()
        check("queue: disconnected requests leave the engine",
              eventually(lambda: m.metric("vllm:num_requests_running") == 0
                         and m.metric("vllm:num_requests_waiting") == 0
                         and m.metric("kvr_mocker_blocks_active") == 0, 10),
              [(n, l, v) for n, l, v in m.metrics() if "requests" in n or "active" in n])
        st, r = m.call("POST", "/v1/completions", {"model": "m", "prompt": [7, 8, 9],
                                                    "max_tokens": 2})
        check("queue: accepts again once drained", st == 200, (st, r))
    finally:
        for c in conns:
            c.close()
        m.stop()

    # bad command lines: exit 2 naming the flag
    bad = [(["--block-size", "0"], "--block-size"),
           (["--speedup", "nan"], "--speedup"),
           (["--speedup", "0"], "--speedup"),
           (["--kv-events-config", '{"bogus":1}'], "bogus"),
           (["--kv-events-config", "{not json"], "kv-events-config"),
           (["--kv-events-config", '{"enable_kv_cache_events":true,"publisher":"kafka"}'],
            "publisher"),
           (["--event-format", "xml"], "--event-format"),
           (["--port", "70000"], "--port"),
           (["--max-num-seqs", "-1"], "--max-num-seqs"),
           (["--data-parallel-size", "0"], "--data-parallel-size"),
           (["--kv-events-drop-every", "1"], "--kv-events-drop-every"),
           (["--no-such-flag"], "--no-such-flag")]
    for args, flag in bad:
        try:
            p = subprocess.run([KVR, "mocker", "--port", "0", "--host", "127.0.0.1"] + args,
                               capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
        except subprocess.TimeoutExpired:
            check(f"bad command line {args}", False, "did not exit within 30 s (it started?)")
            continue
        check(f"bad command line {args}: exit 2 naming {flag}",
              p.returncode == 2 and flag in p.stderr and not SANITIZER_RE.search(p.stderr),
              (p.returncode, p.stderr[-500:], p.stdout[-200:]))
    p = subprocess.run([KVR, "mocker", "--help"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=30)
    check("--help exits 0", p.returncode == 0 and "--kv-events-config" in p.stdout,
          (p.returncode, p.stderr))


# ---------------------------------------------------------------------------------------------
# 3. Prefix caching and 4. cancellation

def scenario_prefix_and_cancel():
    bs = 16
    m = start_mocker("--model", "m", "--speedup", "1", "--block-size", bs,
                     what="mocker(prefix)")
    rng = random.Random(SEED + 3)
    try:
        for n in (1000, 1024):
            p = toks(rng, n)
            body = {"model": "m", "prompt": p, "max_tokens": 2}
            st1, r1 = m.call("POST", "/v1/completions", body)
            st2, r2 = m.call("POST", "/v1/completions", body)
            c1 = (r1.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens") \
                if isinstance(r1, dict) else None
            c2 = (r2.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens") \
                if isinstance(r2, dict) else None
            want = (n - 1) // bs * bs
            check(f"prefix {n} tokens: first request has no cached tokens", st1 == 200 and c1 == 0,
                  (st1, r1))
            check(f"prefix {n} tokens: repeat reports cached_tokens = {want}",
                  st2 == 200 and c2 == want, (st2, r2))

        # TTFT: a 4K-token prompt, prefill 85.8 ms modelled, vs ~16.7 ms once cached
        n = 4096
        h0 = m.metric("vllm:prefix_cache_hits_total")
        q0 = m.metric("vllm:prefix_cache_queries_total")
        cold, warm, cached = [], [], []
        for k in range(3):
            p = toks(rng, n)
            body = {"model": "m", "prompt": p, "max_tokens": 1, "stream": True,
                    "stream_options": {"include_usage": True}}
            st, _, raw, t, _ = sse_request(m, "/v1/completions", body)
            cold.append(t if st == 200 and t else 99)
            for _ in range(2):
                st, _, raw, t, _ = sse_request(m, "/v1/completions", body)
                warm.append(t if st == 200 and t else 99)
                for e in sse_events(raw)[0]:
                    if e != "[DONE]" and json.loads(e).get("usage"):
                        cached.append(json.loads(e)["usage"]["prompt_tokens_details"]
                                      ["cached_tokens"])
        if VERBOSE:
            print(f"     TTFT cold {[round(x, 4) for x in cold]}, "
                  f"cached {[round(x, 4) for x in warm]}", flush=True)
        check("TTFT: a cold 4K-token prefill takes at least its modelled 85 ms",
              min(cold) >= 0.080, cold)
        check("TTFT: a cached 4K-token prompt answers sooner (min and median)",
              min(warm) < min(cold) - 0.03 and sorted(warm)[3] < sorted(cold)[1],
              {"cold": cold, "cached": warm})
        check("TTFT: cached stream usage reports 4080 cached tokens", cached == [4080] * 6, cached)
        h1 = m.metric("vllm:prefix_cache_hits_total")
        q1 = m.metric("vllm:prefix_cache_queries_total")
        check("vllm:prefix_cache_hits_total moved by the cached tokens",
              h0 is not None and h1 - h0 == 6 * 4080, (h0, h1))
        check("vllm:prefix_cache_queries_total moved by the prompt tokens",
              q0 is not None and q1 - q0 == 9 * n, (q0, q1))

        # 4. a streaming client that goes away
        c0 = m.metric("kvr_mocker_requests_cancelled_total")
        d0 = m.metric("kvr_mocker_requests_disconnected_total")
        g0 = m.metric("vllm:generation_tokens_total")
        conn = http.client.HTTPConnection(m.host, m.port, timeout=30)
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"model": "m", "prompt": toks(rng, 300), "max_tokens": 4000,
                                      "stream": True}).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        line = resp.readline()
        check("cancel (stream): first chunk arrives", resp.status == 200
              and line.startswith(b"data: "), (resp.status, line))
        check("cancel (stream): the request holds blocks while running",
              (m.metric("kvr_mocker_blocks_active") or 0) > 0
              and m.metric("vllm:num_requests_running") == 1,
              (m.metric("kvr_mocker_blocks_active"), m.metric("vllm:num_requests_running")))
        conn.close()
        ok = eventually(lambda: m.metric("kvr_mocker_blocks_active") == 0
                        and m.metric("vllm:num_requests_running") == 0
                        and m.metric("kvr_mocker_requests_cancelled_total") == c0 + 1, 10)
        check("cancel (stream): blocks freed, nothing running, one cancellation counted", ok,
              {k: m.metric(k) for k in ("kvr_mocker_blocks_active", "vllm:num_requests_running",
                                        "kvr_mocker_requests_cancelled_total")})
        check("cancel (stream): disconnect counted",
              m.metric("kvr_mocker_requests_disconnected_total") == d0 + 1,
              m.metric("kvr_mocker_requests_disconnected_total"))
        g1 = m.metric("vllm:generation_tokens_total")
        check("cancel (stream): generation stopped early", g1 - g0 < 4000, (g0, g1))

        # a non-streaming client that goes away
        conn = http.client.HTTPConnection(m.host, m.port, timeout=30)
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"model": "m", "prompt": toks(rng, 300),
                                      "max_tokens": 4000}).encode(),
                     headers={"Content-Type": "application/json"})
        check("cancel (whole): request running",
              eventually(lambda: m.metric("vllm:num_requests_running") == 1
                         and (m.metric("kvr_mocker_blocks_active") or 0) > 0, 10))
        conn.close()
        ok = eventually(lambda: m.metric("kvr_mocker_blocks_active") == 0
                        and m.metric("vllm:num_requests_running") == 0
                        and m.metric("kvr_mocker_requests_cancelled_total") == c0 + 2, 10)
        check("cancel (whole): blocks freed, nothing running, cancellation counted", ok,
              {k: m.metric(k) for k in ("kvr_mocker_blocks_active", "vllm:num_requests_running",
                                        "kvr_mocker_requests_cancelled_total",
                                        "kvr_mocker_requests_disconnected_total")})
        check("cancel (whole): disconnect counted",
              m.metric("kvr_mocker_requests_disconnected_total") == d0 + 2,
              m.metric("kvr_mocker_requests_disconnected_total"))
        g2 = m.metric("vllm:generation_tokens_total")
        check("cancel (whole): generation stopped early", g2 - g1 < 4000, (g1, g2))
        st, r = m.call("POST", "/v1/completions", {"model": "m", "prompt": [5, 6, 7],
                                                    "max_tokens": 2})
        check("cancel: still serving", st == 200, (st, r))
    finally:
        m.stop()


# ---------------------------------------------------------------------------------------------
# 5. + 6. events on the wire, and their faithfulness

def events_config(port, replay=None, topic=None, star=True):
    host = "*" if star else "127.0.0.1"
    c = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://{host}:{port}"}
    if replay:
        c["replay_endpoint"] = f"tcp://*:{replay}"
    if topic is not None:
        c["topic"] = topic
    return json.dumps(c)


def check_stream_rules(tag, sub, expect_contiguous=True):
    check(f"{tag}: frames are [topic, 8-byte seq, payload]", not sub.frame_problems,
          sub.frame_problems[:5])
    check(f"{tag}: batches and events in vLLM's encoding", not sub.problems, sub.problems[:5])
    if expect_contiguous:
        check(f"{tag}: seq starts at 0 and grows by 1 per batch",
              sub.live_seqs == list(range(len(sub.live_seqs))), sub.live_seqs[:20])
    s = sub.state
    check(f"{tag}: every BlockStored parent is nil or stored before", not s.bad_parent,
          s.bad_parent[:5])
    check(f"{tag}: every BlockStored parent is still cached when a child is stored",
          not s.parent_absent, s.parent_absent[:5])
    check(f"{tag}: no BlockStored for a hash already cached", not s.dup_store, s.dup_store[:5])
    check(f"{tag}: BlockRemoved only for cached hashes", not s.remove_absent, s.remove_absent[:5])


def compare_with_engine(tag, m, sub, rank=0, timeout=15.0):
    """Waits for idle and for every numbered batch, then compares the replayed set with
    /debug/kv_blocks; returns the engine's set."""
    check(f"{tag}: engine idle", wait_idle(m, timeout))
    pub = numbered_batches(m, rank)
    got = sub.settle(pub, timeout)
    check(f"{tag}: all {pub} batches received", got, (sub.last, pub))
    eng = (kv_blocks(m) or {}).get(rank)
    diff_a = sub.state.present - (eng or set())
    diff_b = (eng or set()) - sub.state.present
    check(f"{tag}: replayed events = /debug/kv_blocks exactly",
          eng is not None and not diff_a and not diff_b,
          f"events-only {len(diff_a)} {sorted(diff_a)[:5]}, engine-only {len(diff_b)} "
          f"{sorted(diff_b)[:5]}, |events| {len(sub.state.present)}, |engine| "
          f"{len(eng) if eng is not None else None}")
    cached = m.metric("kvr_mocker_blocks_cached", engine=rank)
    check(f"{tag}: kvr_mocker_blocks_cached = cached hashes when idle", eng is not None
          and cached == len(eng), (cached, len(eng or ())))
    return eng


def subscribed(m, n, engine=None):
    """Bounded wait until n subscriptions have reached the mocker's publisher (engine: one
    rank's, else all ranks' together): nothing is published into the slow-joiner window."""
    labels = {"engine": engine} if engine is not None else {}
    return eventually(lambda: (m.metric("kvr_mocker_kv_event_subscribers", **labels) or 0) >= n,
                      10)


def scenario_events(ctx, fmt, n_requests):
    bs = 4
    tag = f"events[{fmt}]"
    (port, rport), m = with_free_ports(lambda port, rport: start_mocker(
        "--model", "m", "--speedup", "5", "--block-size", bs, "--num-gpu-blocks", "64",
        "--event-format", fmt, "--kv-events-config",
        events_config(port, rport, topic="kv-events"), what=f"mocker({tag})"), 1, 1)
    sub = None
    rng = random.Random(SEED + (5 if fmt == "array" else 6))
    try:
        sub = Sub(ctx, f"tcp://127.0.0.1:{port}", fmt=fmt, bs=bs, topic=b"kv-events",
                  replay=None)
        check(f"{tag}: SUB connected", sub.connected)
        check(f"{tag}: its subscription reached the publisher", subscribed(m, 1))
        # warm-up: one request, its events are batch 0
        wp = toks(rng, 3 * bs + 1)
        st, r = m.call("POST", "/v1/completions", {"model": "m", "prompt": wp, "max_tokens": 1})
        check(f"{tag}: warm-up request", st == 200, (st, r))
        check(f"{tag}: warm-up batch received", sub.wait_seq(0, 10), sub.live_seqs)
        check(f"{tag}: topic is frame 0", not sub.frame_problems, sub.frame_problems[:3])
        first = [ev for s, ev in sub.events if s == 0]
        check(f"{tag}: first batch stores the warm-up prompt's 3 full blocks with a nil root",
              first and first[0]["type"] == "BlockStored" and first[0]["parent"] is None
              and sum(len(e["hashes"]) for e in first if e["type"] == "BlockStored") == 3
              and first[0]["tokens"] == wp[:len(first[0]["tokens"])], first)
        # the raw bytes of the first batch, as in 1.6
        raw0 = sub.payloads.get(0, b"")
        if fmt == "array":
            check(f"{tag}: batch bytes start 93 cb (array(3), float64 ts)", raw0[:2] == b"\x93\xcb",
                  raw0[:16].hex())
            check(f"{tag}: first event is array(7) 'BlockStored'",
                  raw0[10:11] == b"\x91" and raw0[11:12] == b"\x97" and raw0[12:24] ==
                  b"\xabBlockStored", raw0[:40].hex())
        else:
            check(f"{tag}: first event is a map whose first key is 'type'",
                  raw0[10:11] == b"\x91" and (raw0[11] & 0xF0) == 0x80
                  and raw0[12:17] == b"\xa4type", raw0[:40].hex())

        # up to 8 requests of up to 31 blocks at once in 64 blocks: evictions and preemptions
        reqs = shared_prefix_workload(rng, n_requests, bs, max_prompt=100, max_out=24)
        out = run_workload(m, reqs, concurrency=8)
        bad = [(i, o) for i, o in enumerate(out) if o[0] != 200]
        check(f"{tag}: workload of {n_requests} requests answered", not bad, bad[:5])
        eng = compare_with_engine(tag, m, sub)
        check(f"{tag}: non-trivial (blocks cached, evictions happened)",
              eng and len(eng) > 0 and sub.state.n_removed > 0,
              (len(eng or ()), sub.state.n_stored, sub.state.n_removed))
        if VERBOSE:
            print(f"     {tag}: {len(sub.live_seqs)} batches, {len(sub.events)} events, "
                  f"{sub.state.n_stored} stored, {sub.state.n_removed} removed, "
                  f"{len(eng or ())} cached, preemptions "
                  f"{m.metric('vllm:num_preemptions_total')}", flush=True)
        check(f"{tag}: the BlockRemoved count matches kvr_mocker_blocks_removed_total",
              m.metric("kvr_mocker_blocks_removed_total") == sub.state.n_removed,
              (m.metric("kvr_mocker_blocks_removed_total"), sub.state.n_removed))
        check(f"{tag}: the BlockStored count matches kvr_mocker_blocks_stored_total",
              m.metric("kvr_mocker_blocks_stored_total") == sub.state.n_stored,
              (m.metric("kvr_mocker_blocks_stored_total"), sub.state.n_stored))
        # the subscriber's view predicts the cache hits of the next requests
        preds = []
        for q in (reqs[-1][0], reqs[0][0], reqs[len(reqs) // 2][0], toks(rng, 20)):
            want = min(sub.state.cached_prefix_blocks(q, bs), (len(q) - 1) // bs) * bs
            st, res = m.call("POST", "/v1/completions", {"model": "m", "prompt": q,
                                                          "max_tokens": 1})
            got = res["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else None
            preds.append((want, got))
            wait_idle(m)
            sub.settle(numbered_batches(m))
        check(f"{tag}: the events predict cached_tokens", all(w == g for w, g in preds), preds)
        check(f"{tag}: ... and some of them hit", any(w > 0 for w, _ in preds), preds)

        # replay of everything: same bytes, end marker
        sub.replay_ep = f"tcp://127.0.0.1:{rport}"
        got, ended = sub.replay(0)
        seqs = [s for s, _ in got]
        check(f"{tag}: replay from 0 returns every batch in order with the end marker",
              ended and seqs == list(range(sub.last + 1)),
              (ended, seqs[:10], len(seqs), sub.last))
        check(f"{tag}: replayed payloads are the published bytes",
              all(sub.payloads.get(s) == pl for s, pl in got if s in sub.payloads),
              [s for s, pl in got if s in sub.payloads and sub.payloads[s] != pl][:5])
        got, ended = sub.replay(sub.last + 1000)
        check(f"{tag}: replay from the future is just the end marker", ended and not got, got[:3])
        sub.replay_ep = None

        check_stream_rules(tag, sub)

        # reset: AllBlocksCleared, then empty
        st, r = m.call("POST", "/reset_prefix_cache")
        check(f"{tag}: /reset_prefix_cache 200", st == 200, (st, r))
        before = sub.state.n_cleared
        eventually(lambda: (sub.drain(0.05), sub.state.n_cleared > before)[1], 10)
        check(f"{tag}: AllBlocksCleared received", sub.state.n_cleared == before + 1,
              sub.events[-3:])
        eng = compare_with_engine(tag + " after reset", m, sub)
        check(f"{tag}: empty after reset", eng == set() and sub.state.present == set(),
              (len(eng or ()), len(sub.state.present)))
        check(f"{tag}: kvr_mocker_blocks_cached 0 after reset",
              m.metric("kvr_mocker_blocks_cached") == 0, m.metric("kvr_mocker_blocks_cached"))
        # and consistent again after more traffic
        out = run_workload(m, shared_prefix_workload(rng, 30, bs), concurrency=3)
        check(f"{tag}: traffic after reset answered", all(o[0] == 200 for o in out),
              [o for o in out if o[0] != 200][:3])
        eng = compare_with_engine(tag + " after reset + traffic", m, sub)
        check(f"{tag}: blocks again after reset", eng and len(eng) > 0, len(eng or ()))
        check_stream_rules(tag + " (whole run)", sub)
    finally:
        if sub:
            sub.close()
        m.stop()


# ---------------------------------------------------------------------------------------------
# 7. the router reads the mocker's events

class Router(Child):
    def __init__(self, bs, workers):
        args = [KVR, "serve", "--http-port", "0", "--block-size", str(bs), "--log-level", "warn"]
        for w in workers:
            args += ["--worker", w]
        super().__init__(args, "router")

    def device_blocks(self, tokens):
        st, q = self.call("POST", "/v1/query", {"tokens": tokens}, timeout=10)
        if st != 200 or not isinstance(q, dict):
            return {}
        return {(s["worker_id"], s["dp_rank"]): s["device_blocks"] for s in q.get("scores", [])}


def scenario_router(ctx, fmt, drop_every=0, n_requests=40):
    bs = 4
    tag = f"router[{fmt}{', drop every %d' % drop_every if drop_every else ''}]"
    extra = ["--kv-events-drop-every", drop_every] if drop_every else []
    (port, rport), m = with_free_ports(lambda port, rport: start_mocker(
        "--model", "m", "--speedup", "50", "--block-size", bs,
        "--num-gpu-blocks", "64", "--event-format", fmt,
        "--kv-events-config", events_config(port, rport), *extra,
        what=f"mocker({tag})"), 1, 1)
    r = sub = None
    rng = random.Random(SEED + 7 + drop_every)
    try:
        r = Router(bs, [f"id=1,events=tcp://127.0.0.1:{port},replay=tcp://127.0.0.1:{rport}"])
        sub = Sub(ctx, f"tcp://127.0.0.1:{port}", fmt=fmt, bs=bs,
                  replay=f"tcp://127.0.0.1:{rport}")
        check(f"{tag}: the router's and the test's subscriptions arrived", subscribed(m, 2))
        p = toks(rng, 10 * bs + 3)
        st, res = m.call("POST", "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 2})
        check(f"{tag}: request answered", st == 200, (st, res))
        got = eventually(lambda: r.device_blocks(p).get((1, 0)) == 10, 10)
        check(f"{tag}: router sees the prompt's 10 full blocks", got, r.device_blocks(p))

        reqs = shared_prefix_workload(rng, n_requests, bs, max_prompt=80, max_out=12)
        out = run_workload(m, reqs, concurrency=3)
        check(f"{tag}: workload answered", all(o[0] == 200 for o in out),
              [o for o in out if o[0] != 200][:3])
        wait_idle(m)
        if drop_every:
            # the last batch must not be a dropped one, or nobody can notice the gap
            for _ in range(10):
                if numbered_batches(m) % drop_every != 0:
                    break
                st, _ = m.call("POST", "/v1/completions",
                               {"model": "m", "prompt": toks(rng, 2 * bs), "max_tokens": 1})
                wait_idle(m)
        eng = compare_with_engine(tag, m, sub)
        prompts = [p] + [q[0] for q in reqs]
        want = {i: sub.state.cached_prefix_blocks(q, bs) for i, q in enumerate(prompts)}

        def router_matches():
            got = {i: r.device_blocks(q).get((1, 0)) for i, q in enumerate(prompts)}
            return got if got == want else None
        ok = eventually(router_matches, 15, 0.1)
        got = {i: r.device_blocks(q).get((1, 0)) for i, q in enumerate(prompts)}
        diff = {i: (want[i], got[i]) for i in want if want[i] != got[i]}
        check(f"{tag}: router overlaps = the engine's cached prefixes for all "
              f"{len(prompts)} prompts", ok, f"(want, got) by prompt: {diff}")
        check(f"{tag}: overlaps non-trivial", sum(want.values()) > 0 and eng,
              (sum(want.values()), len(eng or ())))
        if drop_every:
            dropped = m.metric("kvr_mocker_kv_event_batches_dropped_total")
            pub = numbered_batches(m)
            check(f"{tag}: the mocker dropped every {drop_every}th batch",
                  dropped == pub // drop_every and dropped > 0, (dropped, pub))
            never_live = [s for s in sub.live_seqs if (s + 1) % drop_every == 0]
            check(f"{tag}: every {drop_every}th batch is never sent live", not never_live,
                  never_live[:5])
            check(f"{tag}: the Python subscriber filled its gaps by replay",
                  sub.gaps > 0 and sorted(sub.replayed_seqs + sub.live_seqs) ==
                  list(range(int(pub))) and sub.last == int(pub) - 1,
                  (sub.gaps, sub.replayed_seqs[:10], sub.last, pub))
            check(f"{tag}: router kvr_kv_gaps_total > 0",
                  eventually(lambda: (r.metric("kvr_kv_gaps_total") or 0) > 0, 5),
                  r.metric("kvr_kv_gaps_total"))
            check(f"{tag}: router kvr_kv_replayed_batches_total > 0",
                  eventually(lambda: (r.metric("kvr_kv_replayed_batches_total") or 0) > 0, 5),
                  r.metric("kvr_kv_replayed_batches_total"))
            check(f"{tag}: mocker answered replay requests",
                  (m.metric("kvr_mocker_replay_requests_total") or 0) >= 2,
                  m.metric("kvr_mocker_replay_requests_total"))
            def rank0():
                st, ws = r.call("GET", "/v1/workers")
                return ws["workers"][0]["ranks"][0] if st == 200 else {}
            # /v1/workers is current (no tick's copy): the overlaps above already match, so
            # the state says exact at once; the bounded wait only absorbs the microseconds
            # between the ingest thread applying a batch and republishing its snapshot.
            rk = eventually(lambda: (lambda k: k if k.get("index_state") == "exact" else None)
                            (rank0()), 2, 0.01) or rank0()
            check(f"{tag}: router's rank is exact with no gap lost",
                  rk.get("index_state") == "exact" and rk.get("gaps_lost", 0) == 0, rk)
        check_stream_rules(tag, sub, expect_contiguous=not drop_every)
    finally:
        if sub:
            sub.close()
        if r:
            r.stop()
        m.stop()


def scenario_router_dp(ctx, fmt):
    bs = 4
    tag = f"router dp=2 [{fmt}]"
    (port, rport), m = with_free_ports(lambda port, rport: start_mocker(
        "--model", "m", "--speedup", "50", "--block-size", bs, "--data-parallel-size", "2",
        "--event-format", fmt, "--kv-events-config", events_config(port, rport),
        what=f"mocker({tag})"), 2, 2)
    r = None
    subs = []
    rng = random.Random(SEED + 9)
    try:
        r = Router(bs, [f"id=1,events=tcp://127.0.0.1:{port},replay=tcp://127.0.0.1:{rport},"
                        "dp_size=2"])
        subs = [Sub(ctx, f"tcp://127.0.0.1:{port + k}", fmt=fmt, bs=bs, rank=k) for k in (0, 1)]
        check(f"{tag}: every rank has the router's and the test's subscriptions",
              subscribed(m, 2, engine=0) and subscribed(m, 2, engine=1))
        p1, p0 = toks(rng, 8 * bs + 1), toks(rng, 5 * bs + 2)
        st, res = m.call("POST", "/v1/completions", {"model": "m", "prompt": p1, "max_tokens": 2},
                         headers={"x-data-parallel-rank": "1"})
        check(f"{tag}: request pinned to rank 1", st == 200, (st, res))
        st, res = m.call("POST", "/v1/completions", {"model": "m", "prompt": p0, "max_tokens": 2},
                         headers={"x-data-parallel-rank": "0"})
        check(f"{tag}: request pinned to rank 0", st == 200, (st, res))
        ok = eventually(lambda: r.device_blocks(p1) == {(1, 0): 0, (1, 1): 8}
                        and r.device_blocks(p0) == {(1, 0): 5, (1, 1): 0}, 10)
        check(f"{tag}: router sees each prompt under its rank only", ok,
              (r.device_blocks(p1), r.device_blocks(p0)))
        for k, s in enumerate(subs):
            s.wait_seq(0, 5)
            check(f"{tag}: rank {k} publishes on port base+{k} with dp_rank {k}",
                  s.live_seqs and s.batch_ranks == {k} and not s.problems,
                  (s.live_seqs, s.batch_ranks, s.problems[:3]))
        kb = kv_blocks(m) or {}
        check(f"{tag}: /debug/kv_blocks lists both ranks", sorted(kb) == [0, 1], kb.keys())
        for k, s in enumerate(subs):
            check(f"{tag}: rank {k} events = its /debug/kv_blocks", s.state.present == kb.get(k),
                  (len(s.state.present), len(kb.get(k, ()))))
        check(f"{tag}: /metrics per engine label",
              m.metric("kvr_mocker_blocks_cached", engine=1) == len(kb.get(1, ()))
              and m.metric("kvr_mocker_blocks_cached", engine=0) == len(kb.get(0, ())),
              [(n, l, v) for n, l, v in m.metrics() if n == "kvr_mocker_blocks_cached"])
        st, res = m.call("POST", "/v1/completions", {"model": "m", "prompt": p1, "max_tokens": 1},
                         headers={"x-data-parallel-rank": "2"})
        check(f"{tag}: rank out of range is a 400", st == 400 and err_shape_ok(res, 400), (st, res))
    finally:
        for s in subs:
            s.close()
        if r:
            r.stop()
        m.stop()


# ---------------------------------------------------------------------------------------------
# 8. bind/connect

def scenario_connect(ctx):
    bs = 16
    sub = Sub(ctx, "tcp://127.0.0.1:*", bs=bs, bind=True)
    port = int(sub.endpoint.rsplit(":", 1)[1])
    m = None
    try:
        m = start_mocker("--model", "m", "--speedup", "50", "--block-size", bs,
                         "--kv-events-config", events_config(port, star=False),
                         what="mocker(connect)")
        rng = random.Random(SEED + 8)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not sub.live_seqs:
            m.call("POST", "/v1/completions", {"model": "m", "prompt": toks(rng, 2 * bs + 1),
                                               "max_tokens": 1})
            sub.drain(0.2)
        check("connect rule: an endpoint without '*' makes the mocker connect to a bound SUB",
              bool(sub.live_seqs), sub.frame_problems)
        check("connect rule: events decode", not sub.problems and not sub.frame_problems
              and any(ev["type"] == "BlockStored" for _, ev in sub.events),
              (sub.problems[:3], sub.frame_problems[:3]))
    finally:
        if m:
            m.stop()
        sub.close()


def main():
    ctx = zmq.Context()
    try:
        run_scenarios((("http", scenario_http_shapes), ("ids", scenario_ids),
                       ("errors", scenario_errors),
                       ("prefix+cancel", scenario_prefix_and_cancel),
                       ("events array", lambda: scenario_events(ctx, "array", 200)),
                       ("events map", lambda: scenario_events(ctx, "map", 80)),
                       ("router array", lambda: scenario_router(ctx, "array")),
                       ("router array drop", lambda: scenario_router(ctx, "array", 3)),
                       ("router map drop", lambda: scenario_router(ctx, "map", 4)),
                       ("router dp map", lambda: scenario_router_dp(ctx, "map")),
                       ("router dp array", lambda: scenario_router_dp(ctx, "array")),
                       ("connect", lambda: scenario_connect(ctx))), SEED)
    finally:
        ctx.term()


if __name__ == "__main__":
    main()
