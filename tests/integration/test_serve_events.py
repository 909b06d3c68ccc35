#!/usr/bin/python3
"""kvrouter serve fed by real engine KV events: the test plays the engines.

It binds ZeroMQ PUB + ROUTER sockets like vLLM / SGLang (Debian's python3-zmq and
python3-msgpack; byte layouts from docs/wire-formats.md, written independently of the C
decoder), starts `kvrouter serve` subscribed to them, and checks what /v1/query, /v1/route,
/v1/workers, /v1/dump and /metrics say through stores, removals, clears, gaps filled by
replay, publisher restarts, bad batches, SGLang's per-page signed hashes and a block-size
mismatch. Usage: test_serve_events.py <path to kvrouter>.
"""
import http.server
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import msgpack
import zmq

from kvr_harness import check, eventually, finish, free_ports
from kvr_events import (BS, Engine, batch, engine_hashes, to_signed, tokens_for,  # noqa: F401
                        vllm_removed, vllm_stored_array, vllm_stored_map)

KVR = sys.argv[1]


class Router:
    def __init__(self, workers, extra=()):
        args = [KVR, "serve", "--http-port", "0", "--block-size", str(BS), "--log-level", "warn",
                "--health-interval-ms", "200"]
        for w in workers:
            args += ["--worker", w]
        args += list(extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening "):
            raise RuntimeError("router did not start: " + line + self.proc.stderr.read())
        self.base = "http://" + line.split()[1]

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                raw = r.read().decode()
                return r.status, (json.loads(raw) if r.headers.get_content_type() == "application/json" else raw)
        except urllib.error.HTTPError as e:
            raw = e.read().decode()
            return e.code, json.loads(raw) if raw.startswith("{") else raw

    def device_blocks(self, tokens):
        _, q = self.call("POST", "/v1/query", {"tokens": tokens})
        return {(s["worker_id"], s["dp_rank"]): s["device_blocks"] for s in q["scores"]}

    def wait_for(self, tokens, worker, want, timeout=5.0):
        end = time.time() + timeout
        got = None
        while time.time() < end:
            got = self.device_blocks(tokens).get((worker, 0))
            if got == want:
                return got
            time.sleep(0.02)
        return got

    def metric(self, name):
        _, text = self.call("GET", "/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self.proc.returncode


def scenario_vllm(ctx):
    e1, e2, e3, e4 = Engine(ctx), Engine(ctx), Engine(ctx), Engine(ctx)
    r = Router([
        f"id=1,events={e1.endpoint()},replay={e1.replay_endpoint()}",
        f"id=2,events={e2.endpoint()},replay={e2.replay_endpoint()}",
        f"id=3,events={e3.endpoint()},replay={e3.replay_endpoint()}",
        f"id=4,events={e4.endpoint()}",
        "id=5",
    ])
    try:
        for e in (e1, e2, e3, e4):
            check("the router subscribes", e.wait_subscribed())
        p1, h1 = tokens_for(1, 6), engine_hashes(1, 6)
        # vLLM array era: one event, 6 blocks, root chain
        e1.send(batch([vllm_stored_array(h1, None, p1)]))
        check("vllm array store", r.wait_for(p1, 1, 6) == 6, r.device_blocks(p1))
        # map era, another engine, first 4 blocks of the same prompt under different hashes
        h2 = engine_hashes(1, 4, salt=77)
        e2.send(batch([vllm_stored_map(h2, None, p1[: 4 * BS])]))
        check("vllm map store", r.wait_for(p1, 2, 4) == 4, r.device_blocks(p1))
        # SGLang: one event per page, signed hashes, parent links
        h3 = engine_hashes(1, 3, salt=5)
        evs = []
        for i in range(3):
            parent = to_signed(h3[i - 1]) if i else None
            evs.append(["BlockStored", [to_signed(h3[i])], parent, p1[i * BS:(i + 1) * BS], BS, None, "GPU"])
        e3.send(msgpack.packb([1.0, evs, None], use_bin_type=True))
        check("sglang per-page store", r.wait_for(p1, 3, 3) == 3, r.device_blocks(p1))
        scores = r.device_blocks(p1)
        check("query lists every rank, zeros included", scores.get((5, 0)) == 0 and len(scores) == 5, scores)

        # the router sends the prompt to the worker holding all of it
        code, res = r.call("POST", "/v1/route", {"tokens": p1, "update_state": False})
        check("route picks the prefix holder", code == 200 and res["worker_id"] == 1
              and res["overlap_blocks"] == 6 and res["cached_tokens"] == 6 * BS, res)

        # removal of the last two blocks
        e1.send(batch([vllm_removed(h1[4:])]))
        check("removed", r.wait_for(p1, 1, 4) == 4, r.device_blocks(p1))

        # a gap: batch 2 is lost on the wire but kept for replay; batch 3 reveals it
        e1.send(batch([vllm_stored_array(h1[4:5], h1[3], p1[4 * BS:5 * BS])]), deliver=False)
        e1.send(batch([vllm_stored_array(h1[5:6], h1[4], p1[5 * BS:6 * BS])]))
        check("gap replayed before the revealing batch", r.wait_for(p1, 1, 6) == 6, r.device_blocks(p1))
        check("gap counted", eventually(lambda: r.metric("kvr_kv_gaps_total") >= 1))
        check("replayed batch counted", eventually(lambda: r.metric("kvr_kv_replayed_batches_total") >= 1))

        def rank_of(wid):
            _, ws = r.call("GET", "/v1/workers")
            return [w for w in ws["workers"] if w["worker_id"] == wid][0]["ranks"][0]
        w1 = eventually(lambda: (lambda x: x if x["gaps"] >= 1 else None)(rank_of(1))) or rank_of(1)
        check("worker 1 exact after a replayed gap", w1["index_state"] == "exact"
              and w1["gaps"] >= 1 and w1["gaps_lost"] == 0, w1)

        # a bad batch between good ones: the router cannot know what it held, so it drops
        # the rank's state (degraded, counted); the next good batch still applies
        e1.pub.send_multipart([b"", struct.pack(">Q", e1.seq), b"\xc1\xc1garbage"])
        with e1.lock:
            e1.kept.append((e1.seq, b"\xc1\xc1garbage"))
        e1.seq += 1
        p9, h9 = tokens_for(9, 2), engine_hashes(9, 2)
        e1.send(batch([vllm_stored_array(h9, None, p9)]))
        check("good batch after a bad one", r.wait_for(p9, 1, 2) == 2, r.device_blocks(p9))
        check("undecodable batch counted",
              eventually(lambda: r.metric("kvr_kv_batch_decode_errors_total") >= 1))
        check("state after a bad batch is partial", r.device_blocks(p1).get((1, 0)) == 0)

        # cleared
        e2.send(batch([["AllBlocksCleared"]]))
        check("cleared", r.wait_for(p1, 2, 0) == 0, r.device_blocks(p1))

        # publisher restart: numbering starts over; old state is dropped
        e3.restart()
        p7, h7 = tokens_for(7, 2), engine_hashes(7, 2)
        e3.send(batch([vllm_stored_array(h7, None, p7)]))
        check("restart drops old state", r.wait_for(p1, 3, 0) == 0, r.device_blocks(p1))
        check("restart keeps new state", r.wait_for(p7, 3, 2) == 2, r.device_blocks(p7))
        check("restart counted", eventually(lambda: r.metric("kvr_kv_publisher_restarts_total") >= 1))

        # block size mismatch: visible, never a silent zero
        p8 = tokens_for(8, 4)
        e4.send(batch([vllm_stored_array(engine_hashes(8, 2), None, p8, block_size=32)]))
        w4 = eventually(lambda: (lambda x: x if x["index_state"] == "error" else None)(rank_of(4))) \
            or rank_of(4)
        check("mismatch shows as error state", w4["index_state"] == "error"
              and w4["block_size_mismatches"] >= 1 and w4.get("engine_block_size") == 32, w4)
        check("mismatch counted in metrics", r.metric("kvr_kv_events_dropped_total") >= 1)
        w1 = rank_of(1)
        check("worker 1 degraded after the bad batch", w1["index_state"] == "degraded"
              and w1["undecodable"] >= 1, w1)

        # the dump replays the index: one event per (worker, block, tier)
        code, dump = r.call("GET", "/v1/dump")
        pairs = r.metric("kvr_index_pairs")
        stored = [e for e in dump["events"] if "stored" in e]
        check("dump covers the index", code == 200 and len(stored) == pairs and pairs > 0,
              (len(stored), pairs))
    finally:
        rc = r.stop()
        check("clean shutdown", rc == 0, rc)
        for e in (e1, e2, e3, e4):
            e.close()


def scenario_late_replay(ctx):
    """The flake of integration_test_mocker, made deterministic: a replay answer that arrives
    after the live batches that follow the gap. The router must hold those batches, apply
    everything in order once the answer is in, and say so at once: the moment /v1/query shows
    the last batch's blocks, /v1/workers must read `exact` (it read a copy refreshed by a
    100 ms tick, so it said `recovering` for up to ~200 ms after the index had recovered)."""
    e = Engine(ctx)
    r = Router([f"id=1,events={e.endpoint()},replay={e.replay_endpoint()}"])
    tag = "late replay"
    try:
        check(f"{tag}: the router subscribes", e.wait_subscribed())
        p0 = tokens_for(20, 1)
        e.send(batch([vllm_stored_array(engine_hashes(20, 1), None, p0)]))
        check(f"{tag}: first batch applied", r.wait_for(p0, 1, 1) == 1, r.device_blocks(p0))

        def rank():
            _, ws = r.call("GET", "/v1/workers")
            return ws["workers"][0]["ranks"][0]
        for cycle in range(5):
            pa, ha = tokens_for(30 + cycle, 2), engine_hashes(30 + cycle, 2)
            pb, hb = tokens_for(40 + cycle, 1), engine_hashes(40 + cycle, 1)
            pc, hc = tokens_for(50 + cycle, 1), engine_hashes(50 + cycle, 1)
            asked = len(e.asked)
            e.release.clear()
            e.send(batch([vllm_stored_array(ha, None, pa)]), deliver=False)  # lost on the wire
            e.send(batch([vllm_stored_array(hb, None, pb)]))  # reveals the gap: held
            check(f"{tag} {cycle}: the router asks for the lost batch",
                  eventually(lambda: len(e.asked) > asked), e.asked)
            # the request is sent from inside the poll that found the gap; the state read is
            # republished when that poll returns, so it may trail the request by that poll
            rk = eventually(lambda: (lambda x: x if x["index_state"] == "recovering" else None)(rank())) \
                or rank()
            check(f"{tag} {cycle}: recovering while the answer is late",
                  rk["index_state"] == "recovering" and rk["gaps"] == cycle + 1, rk)
            e.send(batch([vllm_stored_array(hc, None, pc)]))  # arrives during the recovery
            check(f"{tag} {cycle}: live batches held until the gap is filled",
                  r.device_blocks(pb).get((1, 0)) == 0 and r.device_blocks(pc).get((1, 0)) == 0,
                  (r.device_blocks(pb), r.device_blocks(pc)))
            e.release.set()
            check(f"{tag} {cycle}: held batches applied after the replay",
                  r.wait_for(pc, 1, 1, timeout=5) == 1 and r.device_blocks(pa).get((1, 0)) == 2
                  and r.device_blocks(pb).get((1, 0)) == 1,
                  (r.device_blocks(pa), r.device_blocks(pb), r.device_blocks(pc)))
            rk = rank()  # no wait: the state read is as current as the index
            check(f"{tag} {cycle}: /v1/workers says exact as soon as the index has recovered",
                  rk["index_state"] == "exact" and rk["last_seq"] == e.seq - 1
                  and rk["gaps"] == cycle + 1 and rk["gaps_lost"] == 0, rk)
    finally:
        e.release.set()
        rc = r.stop()
        check(f"{tag}: clean shutdown", rc == 0, rc)
        e.close()


def scenario_api():
    r = Router(["id=1", "id=2,dp_size=2,taints=gpu"])
    try:
        toks = list(range(100, 100 + 64))
        code, a = r.call("POST", "/v1/route", {"tokens": toks, "request_id": "r1"})
        check("route books", code == 200 and a["request_id"] == "r1", a)
        code, b = r.call("POST", "/v1/route", {"tokens": toks, "request_id": "r1"})
        check("duplicate in-flight id refused", code == 409, (code, b))
        code, _ = r.call("POST", "/v1/requests/r1/first_token", {})
        check("first token", code == 200)
        code, _ = r.call("POST", "/v1/requests/r1/output_block", {"decay_fraction": 0.5})
        check("output block", code == 200, code)
        code, _ = r.call("DELETE", "/v1/requests/r1")
        check("free", code == 200)
        code, e = r.call("DELETE", "/v1/requests/r1")
        check("free twice is a 404", code == 404 and e["error"]["type"] == "not_found_error", e)
        code, e = r.call("POST", "/v1/route", {"tokens": [1, -2]})
        check("bad token names the field", code == 400 and "tokens[1]" in e["error"]["message"], e)
        code, e = r.call("POST", "/v1/route", {"tokens": toks, "routing_constraints": {"required_taints": ["gpu"]},
                                               "update_state": False})
        check("required taint filters", code == 200 and e["worker_id"] == 2, e)
        code, e = r.call("POST", "/v1/route", {"tokens": toks, "routing_constraints": {"required_taints": ["tpu"]}})
        check("no eligible worker is a 503", code == 503, (code, e))
        code, e = r.call("POST", "/v1/route", {"tokens": toks, "pinned_worker": {"worker_id": 2, "dp_rank": 1},
                                               "update_state": False})
        check("pinned worker", code == 200 and (e["worker_id"], e["dp_rank"]) == (2, 1), e)
        code, loads = r.call("POST", "/v1/loads", {"tokens": toks})
        check("loads lists every rank", code == 200 and len(loads["loads"]) == 3, loads)
        code, w = r.call("POST", "/v1/workers", {"worker_id": 9, "dp_size": 1})
        check("add worker at run time", code == 201 and w["worker_id"] == 9, (code, w))
        code, _ = r.call("POST", "/v1/workers", {"worker_id": 9})
        check("add worker twice is a 409", code == 409)
        code, _ = r.call("DELETE", "/v1/workers/9")
        check("remove worker", code == 200)
        code, t = r.call("POST", "/router", {"method": "new", "tokens": toks})
        check("tagged new", code == 200 and t["method"] == "new" and "worker_id" in t, t)
        code, t = r.call("POST", "/router", {"method": "mark_free", "request_id": t.get("request_id", "")})
        check("tagged mark_free", code == 200 and t["method"] == "free_marked" and t["success"], t)
        code, t = r.call("POST", "/router", {"method": "potential_loads", "tokens": toks})
        check("tagged potential_loads", code == 200 and len(t["loads"]) == 3, t)
        code, h = r.call("GET", "/health")
        check("health", code == 200)
        code, h = r.call("GET", "/ready")
        check("ready", code == 200)
        code, e = r.call("GET", "/nope")
        check("unknown endpoint is a 404 in the OpenAI shape", code == 404 and "error" in e, e)
        check("metrics count routes", r.metric("kvr_routes_total") >= 5)
    finally:
        check("clean shutdown", r.stop() == 0)


def scenario_queue():
    # a worker rank is busy for queueing above 0.001 x 1M batched tokens = 1000 prefill tokens
    r = Router(["id=1,max_num_batched_tokens=1000000"],
               ["--router-queue-threshold", "0.001", "--router-queue-max-requests", "2",
                "--router-queue-timeout-ms", "3000"])
    try:
        big = list(range(2048))
        code, a = r.call("POST", "/v1/route", {"tokens": big, "request_id": "a"})
        check("first request placed", code == 200, (code, a))
        out = {}

        def waiter(name, rid):
            out[name] = r.call("POST", "/v1/route", {"tokens": list(range(5000, 5064)), "request_id": rid})

        t1 = threading.Thread(target=waiter, args=("b", "b"))
        t1.start()
        check("queue gauge", eventually(lambda: r.metric("kvr_queue_pending") == 1))
        check("second request waits while the worker is busy", "b" not in out)
        t2 = threading.Thread(target=waiter, args=("c", "c"))
        t2.start()
        check("both queued", eventually(lambda: r.metric("kvr_queue_pending") == 2))
        t3 = threading.Thread(target=waiter, args=("d", "d"))
        t3.start()
        t3.join(timeout=5)
        check("past the queue limit: 429", out.get("d", (0,))[0] == 429, out.get("d"))
        code, _ = r.call("DELETE", "/v1/requests/a")  # load drops: the queue drains in order
        t1.join(timeout=5)
        t2.join(timeout=5)
        check("queued request dispatched after the free", out.get("b", (0,))[0] == 200, out.get("b"))
        check("second queued request dispatched", out.get("c", (0,))[0] == 200, out.get("c"))
        check("rejection counted", r.metric("kvr_queue_rejected_total") >= 1)
    finally:
        check("clean shutdown", r.stop() == 0)


class FakeWorker(http.server.BaseHTTPRequestHandler):
    """A worker's HTTP side for the front-end tests: /health answers 200 (healthy() decides),
    nothing is logged; subclasses answer POST."""
    def healthy(self):
        return True

    def do_GET(self):
        self.send_response(200 if self.healthy() else 500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def read_body(self):
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def answer_completion(self):
        """A one-token completion answer."""
        body = json.dumps({"id": "c", "object": "text_completion", "model": "m",
                           "choices": [{"index": 0, "text": "x", "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 32, "completion_tokens": 1,
                                     "total_tokens": 33}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class V6Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


def serve_worker(handler, v6=False):
    """Starts handler on a free loopback port (::1 when v6): (server, its base url);
    server.shutdown() stops it."""
    if v6:
        srv = V6Server(("::1", 0), handler)
        url = f"http://[::1]:{srv.server_address[1]}"
    else:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        url = f"http://127.0.0.1:{srv.server_address[1]}"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, url


def scenario_health():
    state = {"ok": True}

    class H(FakeWorker):
        def healthy(self):
            return state["ok"]

    srv, url = serve_worker(H)
    r = Router([f"id=1,url={url}", "id=2"], ["--health-failures", "2"])

    def fenced():
        _, ws = r.call("GET", "/v1/workers")
        return [w for w in ws["workers"] if w["worker_id"] == 1][0]["fenced"]

    try:
        check("healthy worker admitted", eventually(lambda: not fenced()))
        state["ok"] = False
        check("failing worker fenced", eventually(fenced, timeout=5))
        code, res = r.call("POST", "/v1/route", {"tokens": list(range(64)), "update_state": False})
        check("fenced worker never picked", code == 200 and res["worker_id"] == 2, res)
        state["ok"] = True
        check("recovered worker readmitted", eventually(lambda: not fenced(), timeout=5))
    finally:
        check("clean shutdown", r.stop() == 0)
        srv.shutdown()


def listening_ports(pid):
    """The TCP ports process pid listens on (its socket inodes matched in /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                col = line.split()
                if col[3] == "0A" and col[9] in inodes:  # LISTEN
                    ports.add(int(col[1].rsplit(":", 1)[1], 16))
    return ports


def scenario_registration_safety():
    """A registration is a request to open connections from the router's host: it may name an
    engine and nothing else. Before endpoint checks, POST /v1/workers with events=ipc://PATH
    replaced an existing file at PATH by a socket (the router bound it), and tcp://*:P opened
    a port on every interface."""
    with tempfile.TemporaryDirectory() as d:
        victim = os.path.join(d, "victim")
        with open(victim, "w") as f:
            f.write("precious")
        port = free_ports(1)
        r = Router(["id=1,url=http://127.0.0.1:9"], extra=["--allowed-worker-hosts", "127.0.0.1,localhost"])
        try:
            code, e = r.call("POST", "/v1/workers", {"worker_id": 78, "events": "ipc://" + victim})
            check("ipc:// refused without allowed_ipc_dirs", code == 400
                  and "allowed_ipc_dirs" in e["error"]["message"], (code, e))
            with open(victim) as f:
                check("the file named by a refused ipc:// is untouched", f.read() == "precious")
            code, e = r.call("POST", "/v1/workers", {"worker_id": 79, "events": f"tcp://*:{port}"})
            check("a wildcard events address is refused", code == 400
                  and "wildcard" in e["error"]["message"], (code, e))
            check("no port was opened for the refused registration", port not in listening_ports(r.proc.pid),
                  listening_ports(r.proc.pid))
            code, e = r.call("POST", "/v1/workers", {"worker_id": 80, "url": "http://10.66.0.1:8001"})
            check("a url outside allowed_worker_hosts is refused", code == 400
                  and "allowed_worker_hosts" in e["error"]["message"], (code, e))
            code, ws = r.call("GET", "/v1/workers")
            check("refused registrations left nothing behind",
                  sorted(w["worker_id"] for w in ws["workers"]) == [1], ws)
            code, e = r.call("POST", "/v1/workers", {"worker_id": 81, "url": "http://localhost:8001",
                                                     "events": f"tcp://127.0.0.1:{port}"})
            check("an engine address on an allowed host registers", code == 201, (code, e))
        finally:
            check("clean shutdown", r.stop() == 0)
    p = subprocess.run([KVR, "serve", "--http-port", "0", "--worker", "id=1,events=ipc:///tmp/x"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=20)
    check("a bad --worker address stops the start with the field named",
          p.returncode != 0 and "events:" in p.stderr, (p.returncode, p.stderr))


def scenario_ipv6_worker():
    """A worker at an IPv6 address: the health probe reaches it and every request names it in
    Host as [::1]:PORT (the front end used to write `Host: ::1:PORT`)."""
    hosts = {"GET": [], "POST": []}

    class W(FakeWorker):
        def do_GET(self):
            hosts["GET"].append(self.headers.get("Host"))
            FakeWorker.do_GET(self)

        def do_POST(self):
            self.read_body()
            hosts["POST"].append(self.headers.get("Host"))
            self.answer_completion()

    srv, url = serve_worker(W, v6=True)
    want = url[len("http://"):]
    r = Router([f"id=1,url={url}"])
    try:
        check("ipv6: the health probe reaches the worker", eventually(lambda: hosts["GET"], 10))
        check("ipv6: the probe names it [::1]:PORT", hosts["GET"][0] == want, hosts["GET"][:1])
        code, body = r.call("POST", "/v1/completions", {"model": "m", "prompt": list(range(32)),
                                                         "max_tokens": 1})
        check("ipv6: a completion is served", code == 200, (code, body))
        check("ipv6: Host is [::1]:PORT", hosts["POST"] == [want], hosts["POST"])
    finally:
        check("clean shutdown", r.stop() == 0)
        srv.shutdown()


def scenario_worker_auth():
    """Whose credentials reach a worker. A client's Authorization header used to be forwarded
    to whichever worker was chosen (so any client that could register a worker could collect
    other clients' keys); now it is dropped unless frontend_forward_authorization is on, and
    workers can be given the router's own token (worker_api_key_file)."""
    seen = []

    class W(FakeWorker):
        def do_POST(self):
            self.read_body()
            seen.append(self.headers.get("Authorization"))
            self.answer_completion()

    srv, url = serve_worker(W)

    def complete(r):
        req = urllib.request.Request(r.base + "/v1/completions", method="POST",
                                     data=json.dumps({"model": "m", "prompt": list(range(32)),
                                                      "max_tokens": 1}).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": "Bearer client-secret"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status

    with tempfile.TemporaryDirectory() as d:
        key = os.path.join(d, "worker.key")
        with open(key, "w") as f:
            f.write("worker-token\n")
        for extra, want, what in (
                ([], None, "a client's Authorization does not reach the worker by default"),
                (["--worker-api-key-file", key], "Bearer worker-token",
                 "the worker gets the router's own token instead"),
                (["--frontend-forward-authorization", "true"], "Bearer client-secret",
                 "forwarded when frontend_forward_authorization is on")):
            seen.clear()
            r = Router([f"id=1,url={url}"], extra)
            try:
                code = complete(r)
                check(what, code == 200 and seen == [want], (code, seen))
            finally:
                check("clean shutdown", r.stop() == 0)
        p = subprocess.run([KVR, "serve", "--http-port", "0", "--worker-api-key-file",
                            os.path.join(d, "missing")], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=20)
        check("an unreadable --worker-api-key-file stops the start, named as typed",
              p.returncode != 0 and "--worker-api-key-file" in p.stderr, (p.returncode, p.stderr))
    srv.shutdown()


def scenario_answer_limit():
    """A worker's non-streaming answer used to be buffered whole: a 1.5 GB answer grew the
    router to 1.5 GB, and an endless one killed it. It is now cut at frontend_max_answer_bytes:
    502 naming the limit, counted, the worker charged with a failure, memory flat."""
    class Endless(FakeWorker):
        def do_POST(self):
            self.read_body()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(1 << 40))
            self.end_headers()
            chunk = b" " * 65536
            try:
                for _ in range(1 << 14):  # 1 GiB at most, until the router hangs up
                    self.wfile.write(chunk)
            except OSError:
                pass

    srv, url = serve_worker(Endless)
    r = Router([f"id=1,url={url}"], ["--frontend-max-answer-bytes", str(1 << 20),
                                    "--frontend-fence-failures", "100"])
    try:
        for i in range(3):
            code, e = r.call("POST", "/v1/completions", {"model": "m", "prompt": list(range(32)),
                                                         "max_tokens": 1})
            check(f"an endless answer is cut off with 502 naming the limit ({i})", code == 502
                  and "frontend_max_answer_bytes" in e["error"]["message"], (code, e))
        check("cut-off answers counted",
              r.metric('kvr_frontend_upstream_errors_total{kind="too_large"}') >= 3)
        with open(f"/proc/{r.proc.pid}/status") as f:
            rss_kb = int([ln for ln in f if ln.startswith("VmHWM:")][0].split()[1])
        check("the router's memory never held an answer past the limit", rss_kb < 64 * 1024, rss_kb)
    finally:
        check("clean shutdown", r.stop() == 0)
        srv.shutdown()


def scenario_header_limit():
    """A huge header used to be parsed whole, in time quadratic in its size (40 MB: 7.1 s of the
    HTTP thread, every other client waiting). It is now refused once it passes
    http_max_header_bytes, and the router keeps answering."""
    r = Router(["id=1"], ["--http-max-header-bytes", "8192"])
    try:
        host, port = r.base[len("http://"):].split(":")
        s = socket.create_connection((host, int(port)), timeout=10)
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
            sent, refused = 0, False
            chunk = b"a" * 65536
            while sent < (64 << 20):  # the old router read all 64 MiB and more
                try:
                    s.sendall(chunk)
                except OSError:
                    refused = True
                    break
                sent += len(chunk)
            if not refused:
                s.settimeout(5)
                try:
                    refused = s.recv(64).startswith(b"HTTP/1.1 4")
                except socket.timeout:
                    refused = False  # still reading the header
                except OSError:
                    refused = True
            # loopback socket buffers absorb a few MiB after the router stops reading
            check("an oversized header is refused before it is all read",
                  refused and sent < (16 << 20), sent)
        finally:
            s.close()
        code, _ = r.call("GET", "/health")
        check("the router answers after an oversized header", code == 200, code)
        req = urllib.request.Request(r.base + "/health", headers={"X-Big": "a" * 6000})
        with urllib.request.urlopen(req, timeout=10) as resp:  # 6 KB of headers, limit 8 KiB
            check("a large header under the limit passes", resp.status == 200, resp.status)
    finally:
        check("clean shutdown", r.stop() == 0)


def scenario_bad_config():
    for args, field in ((["--router-temperature", "nan"], "--router-temperature"),
                        (["--block-size", "0"], "--block-size"),
                        (["--worker", "url=http://x"], "id is required")):
        p = subprocess.run([KVR, "serve", "--http-port", "0"] + args, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=20)
        check(f"bad config {args}", p.returncode == 2 and field in p.stderr, (p.returncode, p.stderr))
    env = dict(os.environ, KVR_HOST_CACHE_HIT_WEIGHT="7")
    p = subprocess.run([KVR, "serve", "--http-port", "0"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=20, env=env)
    check("bad env var", p.returncode == 2 and "host_cache_hit_weight" in p.stderr, p.stderr)


def main():
    ctx = zmq.Context()
    scenario_vllm(ctx)
    scenario_late_replay(ctx)
    scenario_api()
    scenario_queue()
    scenario_health()
    scenario_registration_safety()
    scenario_worker_auth()
    scenario_ipv6_worker()
    scenario_answer_limit()
    scenario_header_limit()
    scenario_bad_config()
    ctx.term()
    finish()


if __name__ == "__main__":
    main()
