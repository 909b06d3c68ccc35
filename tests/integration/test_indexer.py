#!/usr/bin/python3
"""The standalone indexer (`kvrouter indexer`), a router serving its index (`serve
--serve-indexer`) and a router routing with a remote one (`serve --remote-indexer`), all real
processes on loopback, fed by real mockers' KV events: the same answers as a router's own
index, recovery from a peer's dump, routing with a remote indexer and through its outage, the
start-up validation, bad bodies on every route, and registrations racing live events.
Usage: test_indexer.py <path to kvrouter> [scenario ...] (all when none is named).
"""
import http.client
import http.server
import json
import shutil
import os
import random
import subprocess
import sys
import threading
import time

import msgpack

from kvr_harness import (Child, NatsServer, check, eventually, kill_children, run_scenarios,
                         with_free_ports)

KVR = sys.argv[1]
BS = 16
SEED = int(time.time()) % 100000
RNG = random.Random(SEED)


def mocker(model="m", bs=BS, dp=1, extra=()):
    """A mocker publishing KV events (with a replay socket) on free ports; with dp ranks, rank
    r publishes on the ports + r (m.rank_events(r), m.rank_replay(r))."""
    def start(ev, rp):
        return Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", model,
                      "--block-size", bs, "--speedup", "200", "--data-parallel-size", dp,
                      "--kv-events-config",
                      json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                  "endpoint": f"tcp://*:{ev}",
                                  "replay_endpoint": f"tcp://*:{rp}"})] + list(extra),
                     f"mocker {model}")
    (ev, rp), m = with_free_ports(start, dp, dp)
    m.events = f"tcp://127.0.0.1:{ev}"
    m.replay = f"tcp://127.0.0.1:{rp}"
    m.rank_events = lambda r: f"tcp://127.0.0.1:{ev + r}"
    m.rank_replay = lambda r: f"tcp://127.0.0.1:{rp + r}"
    return m


def indexer(*extra, port=0):
    return Child([KVR, "indexer", "--port", port, "--log-level", "info"] +
                 [str(a) for a in extra], "indexer")


def serve(*extra):
    return Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--log-level", "info"] +
                 [str(a) for a in extra], "router")


def prompt(seed, n_blocks, extra=0):
    return [(seed * 7919 + i) % 150000 for i in range(n_blocks * BS + extra)]


def complete(m, toks, model="m", rank=None):
    """A completion on m (on data-parallel rank `rank` when given)."""
    h = None if rank is None else {"x-data-parallel-rank": str(rank)}
    st, a = m.call("POST", "/v1/completions", {"model": model, "prompt": toks, "max_tokens": 2},
                   h)
    check("mocker answers a completion", st == 200, (st, a))
    return a


def query(ix, toks, model="m", path="/query", group=None):
    body = {"token_ids": toks, "model_name": model}
    if group is not None:
        body["routing_group"] = group
    st, a = ix.call("POST", path, body)
    return a if st == 200 else {"status": st, "body": a}


def scores(ans):
    """{(instance, rank): tokens} of a query answer."""
    return {(int(i), int(r)): t for i, ranks in ans.get("scores", {}).items()
            for r, t in ranks.items()}


WARM = iter(range(50000, 60000))


def subscribed(m, worker, *indexes, rank=None, group=None):
    """Sends m new prompts until each index holds one for worker: its subscription is up (a
    batch published before a subscriber connects is lost to it, as with any ZeroMQ SUB).
    rank: a data-parallel rank of m (sent there, looked for there); group: a routing_group."""
    def seen():
        toks = prompt(next(WARM), 2)
        complete(m, toks, rank=rank)
        return eventually(lambda: all(scores(query(x, toks, group=group)).get(
            (worker, rank or 0)) == 2 * BS for x in indexes), 1.0)
    ok = eventually(seen, 20, 0.05)
    check(f"worker {worker}'s events reach every index", ok)
    return ok


def workload(ms, n=24):
    """Prompts sharing prefixes, sent to the mockers in turn; returns the prompts."""
    sent = []
    for k in range(n):
        base = prompt(1000 + k % 6, 3 + k % 5)
        toks = base + prompt(50 + k, 1 + k % 3)
        complete(ms[k % len(ms)], toks)
        sent.append(toks)
    return sent


def events_applied(ix):
    st, ws = ix.call("GET", "/workers")
    return sum(l["events_applied"] for w in ws for l in w["listeners"].values()) if st == 200 else -1


def probes(sent, n=200):
    """Prompts to ask about: the sent ones cut at random lengths, and new ones."""
    out = []
    for i in range(n):
        if i % 4 == 3:
            out.append(prompt(90000 + i, 1 + i % 6))
        else:
            s = sent[RNG.randrange(len(sent))]
            out.append(s[:RNG.randrange(1, len(s) + 1)])
    return out


def scenario_same_answers_as_a_router():
    """An indexer fed by two mockers answers /query exactly as a router fed by the same
    mockers (serve --serve-indexer), for 200 prompts; MessagePack bodies (map and array form)
    get the same answers as JSON; /query_by_hash with the router's hashes agrees too."""
    m1, m2 = mocker(), mocker()
    ix = indexer("--workers", f"1={m1.events},2={m2.events}", "--block-size", BS,
                 "--model-name", "m")
    r = serve("--serve-indexer", "true",
              "--worker", f"id=1,url={m1.url},events={m1.events},replay={m1.replay},model=m",
              "--worker", f"id=2,url={m2.url},events={m2.events},replay={m2.replay},model=m")
    try:
        check("indexer: both listeners registered",
              eventually(lambda: len(ix.call("GET", "/workers")[1]) == 2, 10))
        subscribed(m1, 1, ix, r)
        subscribed(m2, 2, ix, r)
        sent = workload([m1, m2])
        last = sent[-1]
        check("both indexes saw the workload",
              eventually(lambda: scores(query(ix, last)) and
                         scores(query(ix, last)) == scores(query(r, last)), 20),
              (query(ix, last), query(r, last)))
        asked = probes(sent)
        diff = [p for p in asked if query(ix, p) != query(r, p)]
        check("200 prompts: the indexer's answers equal the router's", diff == [],
              (len(diff), diff[:1] and (query(ix, diff[0]), query(r, diff[0]))))
        hit = sum(1 for p in asked if scores(query(ix, p)))
        check("the comparison is not vacuous (most prompts have an overlap)", hit >= 100, hit)
        p = sent[3]
        a = query(ix, p)
        check("answer: scores in tokens, frequencies per block, instances per worker",
              all(t % BS == 0 for t in scores(a).values()) and len(a["frequencies"]) ==
              max(scores(a).values()) // BS and
              all(v["gpu"] == max(v["dp"].values()) and v["longest_matched"] >= v["gpu"]
                  for v in a["instances"].values()), a)
        for form, body in (("map", {"token_ids": p, "model_name": "m"}), ("array", [p, "m"])):
            st, h, raw = ix.request("POST", "/query", msgpack.packb(body),
                                    {"Content-Type": "application/msgpack"})
            check(f"MessagePack ({form}) gets the JSON answer", st == 200 and json.loads(raw) == a,
                  (st, raw[:200]))
        # the router's own block hashes (its /v1/query does not give them; hash with the CLI)
        out = subprocess.run([KVR, "hash"], input=json.dumps({"tokens": p, "block_size": BS}) +
                             "\n", capture_output=True, text=True, timeout=30)
        lbh = ([int(h) for h in json.loads(out.stdout.splitlines()[0])["local_block_hashes"]]
               if out.returncode == 0 else [])
        st, b = ix.call("POST", "/query_by_hash", {"block_hashes": lbh, "model_name": "m"})
        check("/query_by_hash with the prompt's block hashes: the /query answer",
              st == 200 and b == a, (st, b, out.stderr[-300:]))
        signed = [h - (1 << 64) if h >= 1 << 63 else h for h in lbh]
        st, b = ix.call("POST", "/query_by_hash", {"block_hashes": signed, "model_name": "m"})
        check("/query_by_hash with i64 hashes (the reference's type): the same answer",
              st == 200 and b == a, (st, b))
        st, d = r.call("GET", "/dump")
        check("the router's /dump: the reference's shape, one partition per model",
              st == 200 and list(d) == ["m:default"] and d["m:default"]["block_size"] == BS and
              d["m:default"]["events"] and "event" in d["m:default"]["events"][0], (st, str(d)[:300]))
        st, e = r.call("POST", "/query", {"token_ids": p, "model_name": "other"})
        check("the router: a model it does not serve is 404", st == 404 and "error" in e, (st, e))
    finally:
        r.stop()
        ix.stop()
        m1.stop()
        m2.stop()


def normalized_dump(d):
    """{partition: set of (worker, rank, tier, block_hash, tokens_hash)} held."""
    out = {}
    for key, part in d.items():
        held = set()
        for ev in part.get("events", []):
            data = ev["event"]["data"]
            if isinstance(data, dict) and "stored" in data:
                for b in data["stored"]["blocks"]:
                    held.add((ev["worker_id"], ev["event"]["dp_rank"], ev.get("storage_tier"),
                              b["block_hash"], b["tokens_hash"]))
        out[key] = held
    return out


def scenario_peer_recovery():
    """A second indexer started late with --peers recovers the first one's index before it
    listens (its binary snapshots; its JSON dump when a rank is not exact, or when the peer has
    only the reference's API): equal dumps, equal answers; a peer that does not answer is
    skipped for the next; no reachable peer starts cold, saying so."""
    m1, m2 = mocker(), mocker()
    workers = f"1={m1.events},2={m2.events}"
    a = indexer()
    b = c = None
    try:
        for i, m in ((1, m1), (2, m2)):  # with replay: every rank exact (a lost batch replayed)
            st, r = a.call("POST", "/register", {"instance_id": i, "endpoint": m.events,
                                                 "replay_endpoint": m.replay, "model_name": "m",
                                                 "block_size": BS})
            check(f"first indexer: worker {i} registered", st == 201, (st, r))
        subscribed(m1, 1, a)
        subscribed(m2, 2, a)
        sent = workload([m1, m2], 18)
        check("first indexer: the workload applied",
              eventually(lambda: events_applied(a) >= 18, 20), events_applied(a))
        dead = "http://127.0.0.1:9"  # nothing listens on the discard port
        b = indexer("--workers", workers, "--block-size", BS, "--model-name", "m",
                    "--peers", f"{dead},{a.url}")
        _, da = a.call("GET", "/dump")
        _, db = b.call("GET", "/dump")
        na, nb = normalized_dump(da), normalized_dump(db)
        check("the late indexer's dump equals its peer's", na == nb and na["m:default"],
              (len(na.get("m:default", ())), len(nb.get("m:default", ()))))
        diff = [p for p in probes(sent, 60) if query(a, p) != query(b, p)]
        check("and so do its answers", diff == [], len(diff))
        check("its log names the peer it recovered from", a.url in b.stderr(), b.stderr()[-500:])
        check("recovered events are counted",
              (b.metric("kvr_indexer_recovered_events_total") or 0) > 0,
              b.metric("kvr_indexer_recovered_events_total"))
        # live events keep both in step after the recovery (once b's SUB to m1 is connected:
        # a batch published before is lost to it, and b has no replay endpoint to recover it)
        subscribed(m1, 1, a, b)
        complete(m1, prompt(4242, 6))
        check("a live event after recovery reaches both",
              eventually(lambda: scores(query(b, prompt(4242, 6))) ==
                         scores(query(a, prompt(4242, 6))) != {}, 20))
        # a peer with only the reference's API (GET /dump; no binary snapshot route): an
        # HTTP server on loopback answering with a's dump, 404 otherwise
        dump = a.request("GET", "/dump")[2]

        class RefPeer(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                ok = self.path == "/dump"
                self.send_response(200 if ok else 404)
                body = dump if ok else b'{"error":"not found"}'
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RefPeer)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            d = indexer("--peers", f"http://127.0.0.1:{srv.server_address[1]}")
            _, dd = d.call("GET", "/dump")
            check("a peer with only GET /dump (the reference's): recovered from its JSON dump",
                  normalized_dump(dd) == normalized_dump(json.loads(dump)) and
                  "(binary)" not in d.stderr() and "recovered from peer" in d.stderr(),
                  d.stderr()[-400:])
            check("a kvrouter peer is read from its binary snapshots", "(binary)" in b.stderr(),
                  b.stderr()[-400:])
            check("that peer has no GET /workers: the recovered ranks are stale, and /health "
                  "says so", "stale: 2 ranks" in d.call("GET", "/health")[1] and
                  d.metric("kvr_indexer_stale_ranks") == 2, d.call("GET", "/health"))
            d.stop()
        finally:
            srv.shutdown()
        # a rank that is not exact (registered, nothing received): the snapshot would leave it
        # out, so the peer refuses it (409) and the dump is read instead
        st, r = a.call("POST", "/register", {"instance_id": 9, "endpoint": dead.replace(
            "http", "tcp"), "model_name": "m", "block_size": BS})
        st, r = a.call("GET", "/v1/index/snapshot?model_name=m&routing_group=default")
        check("a snapshot with a rank that is not exact: 409 naming /dump",
              st == 409 and "GET /dump" in r["error"], (st, r))
        e = indexer("--peers", a.url)
        _, de = e.call("GET", "/dump")
        check("then the peer is read from its dump, whole",
              normalized_dump(de) == normalized_dump(a.call("GET", "/dump")[1]) and
              "(binary)" not in e.stderr() and "recovered from peer" in e.stderr(),
              e.stderr()[-400:])
        e.stop()
        # a peer whose partitions list does not read: refused whole, nothing applied
        class BadPeer(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b'[{"model_name":"m","routing_group":"default","block_size":16 x'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        bad = http.server.ThreadingHTTPServer(("127.0.0.1", 0), BadPeer)
        threading.Thread(target=bad.serve_forever, daemon=True).start()
        try:
            f = indexer("--peers", f"http://127.0.0.1:{bad.server_address[1]}")
            check("a peer whose partitions list does not read: cold, saying why",
                  "not a list of partitions" in f.stderr() and f.call("GET", "/dump")[1] == {},
                  f.stderr()[-400:])
            f.stop()
        finally:
            bad.shutdown()
        c = indexer("--peers", dead)
        check("no peer answers: it starts cold and says why",
              "no peer" in c.stderr() and c.call("GET", "/dump")[1] == {}, c.stderr()[-400:])
    finally:
        for x in (c, b, a, m1, m2):
            if x is not None:
                x.stop()


def regs_of(ws):
    """What POST /register took for each instance, as a GET /workers answer lists it."""
    return sorted((w["instance_id"], w["model_name"], w["routing_group"], w["block_size"],
                   sorted(w["endpoints"].items()), sorted(w.get("replay_endpoints", {}).items()))
                  for w in ws)


def dumps_equal(x, y):
    """Whether two indexes hold the same (worker, rank, tier, block) of every partition."""
    _, dx = x.call("GET", "/dump")
    _, dy = y.call("GET", "/dump")
    return normalized_dump(dx) == normalized_dump(dy)


def scenario_peer_registrations():
    """A second indexer started with --peers and no --workers used to recover the first's
    index, then answer GET /workers with [] and subscribe to nothing, its index going stale.
    Now it takes the peer's registrations with the index (instance, endpoints, replay
    endpoints, dp ranks, model, routing group, block size), subscribes before the copy and
    resumes each rank from the snapshot's cursor: what the engines store and evict after the
    copy reaches it. An instance --workers names is taken from the command line, not the peer."""
    m1 = mocker()
    m3 = mocker(dp=2, extra=("--num-gpu-blocks", 48))  # two ranks, a small cache: evictions
    a = indexer()
    b = c = None
    try:
        regs = [{"instance_id": 1, "endpoint": m1.events, "replay_endpoint": m1.replay,
                 "model_name": "m", "block_size": BS}]
        regs += [{"instance_id": 3, "dp_rank": r, "endpoint": m3.rank_events(r),
                  "replay_endpoint": m3.rank_replay(r), "model_name": "m",
                  "routing_group": "g2", "block_size": BS} for r in (0, 1)]
        for body in regs:
            st, r = a.call("POST", "/register", body)
            check(f"A: instance {body['instance_id']} rank {body.get('dp_rank', 0)} registered",
                  st == 201, (st, r))
        subscribed(m1, 1, a)
        for r in (0, 1):
            subscribed(m3, 3, a, rank=r, group="g2")
        early = [prompt(3000 + k, 6) for k in range(3)]  # on m3's rank 1: evicted later
        for toks in early:
            complete(m3, toks, rank=1)
        sent = workload([m1], 10)
        check("A: the workload applied",
              eventually(lambda: scores(query(a, sent[-1])).get((1, 0)) and
                         scores(query(a, early[-1], group="g2")).get((3, 1)) == 6 * BS, 20))
        st, wa = a.call("GET", "/workers")
        check("A's GET /workers lists each rank's replay endpoint",
              st == 200 and sorted(w.get("replay_endpoints", {}).get(k, "") for w in wa
                                   for k in w["endpoints"]) ==
              sorted([m1.replay, m3.rank_replay(0), m3.rank_replay(1)]), wa)
        b = indexer("--peers", a.url)
        st, wb = b.call("GET", "/workers")
        check("B (--peers A, no --workers) lists A's registrations",
              st == 200 and regs_of(wb) == regs_of(wa) and len(regs_of(wb)) == 2,
              (regs_of(wb), regs_of(wa)))
        check("B recovered A's index", dumps_equal(a, b))
        # the check that failed before: blocks stored after the copy reach B
        for inst, m, rank, group, seed in ((1, m1, None, None, 7000), (3, m3, 0, "g2", 7001),
                                           (3, m3, 1, "g2", 7002)):
            toks = prompt(seed, 4)
            complete(m, toks, rank=rank)
            check(f"new blocks of instance {inst} rank {rank or 0} ({group or 'default'}) "
                  "stored after the copy reach B",
                  eventually(lambda: scores(query(b, toks, group=group)).get(
                      (inst, rank or 0)) == 4 * BS, 20), query(b, toks, group=group))
        check("each rank resumed from the snapshot's cursor (confirmed by its engine's replay)",
              eventually(lambda: b.metric("kvr_indexer_ranks_resumed_total") == 3, 20) and
              b.metric("kvr_indexer_resumes_failed_total") == 0,
              (b.metric("kvr_indexer_ranks_resumed_total"),
               b.metric("kvr_indexer_resumes_failed_total")))
        # evictions after the copy: m3's rank 1 (48 blocks) fills up with new prompts
        for k in range(8):
            complete(m3, prompt(8000 + k, 7), rank=1)
        check("A saw the early blocks evicted",
              eventually(lambda: scores(query(a, early[0], group="g2")).get((3, 1), 0) <
                         6 * BS, 20), query(a, early[0], group="g2"))
        check("and so did B: both indexes hold the same blocks again",
              eventually(lambda: dumps_equal(a, b), 20))
        st, h = b.call("GET", "/health")
        check("B's /health: where the index and the registrations came from, nothing stale",
              st == 200 and "index: peer " + a.url in h and
              "registrations: 3 subscribed from peer " + a.url in h and "stale" not in h, h)
        check("B's metrics: 3 registrations subscribed from the peer, no stale rank",
              b.metric("kvr_indexer_peer_registrations_total", result="subscribed") == 3 and
              b.metric("kvr_indexer_stale_ranks") == 0,
              (b.metric("kvr_indexer_peer_registrations_total", result="subscribed"),
               b.metric("kvr_indexer_stale_ranks")))
        # --workers win for an instance given both ways
        c = indexer("--peers", a.url, "--workers", f"1={m1.events}", "--block-size", BS,
                    "--model", "m")
        st, wc = c.call("GET", "/workers")
        one = [w for w in wc if w["instance_id"] == 1]
        check("C (--workers 1=..., --peers A): instance 1 as the command line gives it (no "
              "replay endpoint), instance 3 from the peer",
              st == 200 and len(one) == 1 and "replay_endpoints" not in one[0] and
              regs_of([w for w in wc if w["instance_id"] == 3]) ==
              regs_of([w for w in wa if w["instance_id"] == 3]), wc)
        check("C counts the peer's instance 1 as already registered",
              c.metric("kvr_indexer_peer_registrations_total", result="known") == 1 and
              c.metric("kvr_indexer_peer_registrations_total", result="subscribed") == 2 and
              c.metric("kvr_indexer_stale_ranks") == 0)
        # C's SUB to m1 may not be connected yet (a batch published before is lost to it):
        # wait until a batch reaches it, as every other new subscriber here does
        subscribed(m1, 1, c)
        toks = prompt(7100, 3)
        complete(m1, toks)
        check("new blocks of the command line's instance 1 reach C",
              eventually(lambda: scores(query(c, toks)).get((1, 0)) == 3 * BS, 20))
    finally:
        for x in (c, b, a, m1, m3):
            if x is not None:
                x.stop()


class OlderPeer(http.server.BaseHTTPRequestHandler):
    """A kvrouter peer from before the registrations were recovered, as far as a recovering
    indexer sees it: the index routes are `a`'s (relayed), GET /workers is 404."""
    a = None

    def do_GET(self):
        if self.path.startswith("/v1/index/"):
            st, _, body = self.a.request("GET", self.path)
        else:
            st, body = 404, b'{"error":"no such route"}'
        self.send_response(st)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def scenario_peer_registrations_unavailable():
    """A peer whose registrations cannot be had (GET /workers 404, as on an older peer): the
    indexer still starts with the recovered index, but says that it goes stale and why, in its
    log, /health and /metrics (kvr_indexer_stale_ranks); registering the worker clears it and
    its new blocks come in."""
    m1 = mocker()
    a = indexer()
    b = None
    srv = None
    try:
        st, r = a.call("POST", "/register", {"instance_id": 1, "endpoint": m1.events,
                                             "replay_endpoint": m1.replay, "model_name": "m",
                                             "block_size": BS})
        check("A: worker 1 registered", st == 201, (st, r))
        subscribed(m1, 1, a)
        sent = workload([m1], 8)
        check("A: the workload applied",
              eventually(lambda: scores(query(a, sent[-1])).get((1, 0)), 20))
        handler = type("Older", (OlderPeer,), {"a": a})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        peer = f"http://127.0.0.1:{srv.server_address[1]}"
        b = indexer("--peers", peer)
        check("B recovered the index from the peer", dumps_equal(a, b))
        err = b.stderr()
        check("B's log: the registrations were not obtained, why, and that the index goes stale",
              "its registrations were not obtained (GET /workers" in err and "answered 404" in err
              and "goes stale" in err, err[-1500:])
        st, h = b.call("GET", "/health")
        check("B's /health says so: no registration, 1 stale rank",
              st == 200 and h.startswith("OK\n") and
              "registrations: none obtained from peer " + peer in h and "answered 404" in h and
              "stale: 1 ranks" in h, h)
        check("B's metrics: 1 stale rank, the failure counted",
              b.metric("kvr_indexer_stale_ranks") == 1 and
              b.metric("kvr_indexer_peer_registrations_failures_total") == 1,
              (b.metric("kvr_indexer_stale_ranks"),
               b.metric("kvr_indexer_peer_registrations_failures_total")))
        check("B's GET /workers: nothing registered", b.call("GET", "/workers") == (200, []))
        st, r = b.call("POST", "/register", {"instance_id": 1, "endpoint": m1.events,
                                             "replay_endpoint": m1.replay, "model_name": "m",
                                             "block_size": BS})
        check("registering the worker on B clears the stale rank",
              st == 201 and b.metric("kvr_indexer_stale_ranks") == 0 and
              "stale" not in b.call("GET", "/health")[1], (st, r, b.call("GET", "/health")))
        subscribed(m1, 1, a, b)
    finally:
        for x in (b, a, m1):
            if x is not None:
                x.stop()
        if srv is not None:
            srv.shutdown()


def scenario_remote_indexer_routing_and_outage():
    """A router with --remote-indexer routes a repeated prompt to the worker that cached it;
    with the indexer killed, routing goes on with zero overlap (counted by cause, /health and
    /v1/workers say remote: unreachable), and comes back when the indexer returns."""
    m1, m2 = mocker(), mocker()
    workers = f"1={m1.events},2={m2.events}"
    ix = indexer("--workers", workers, "--block-size", BS, "--model-name", "m")
    port = ix.port
    # a deadline no answer misses on a loaded machine: failures here are real ones (the
    # deadline itself is checked against an indexer that never answers, below)
    r = serve("--remote-indexer", ix.url, "--remote-indexer-timeout-ms", "10000",
              "--worker", f"id=1,url={m1.url},model=m", "--worker", f"id=2,url={m2.url},model=m")
    ix2 = None
    try:
        check("indexer listeners up", eventually(lambda: len(ix.call("GET", "/workers")[1]) == 2, 10))
        subscribed(m1, 1, ix)
        subscribed(m2, 2, ix)
        cached = []
        for k in range(6):
            toks = prompt(7000 + k, 8)
            st, a = r.call("POST", "/v1/completions", {"model": "m", "prompt": toks,
                                                        "max_tokens": 2})
            check("routed through the remote indexer", st == 200, (st, a))
            eventually(lambda: scores(query(ix, toks)), 10)
            st, b = r.call("POST", "/v1/completions", {"model": "m", "prompt": toks + [1, 2, 3],
                                                        "max_tokens": 2})
            cached.append(b.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens"))
        check("every repeated prompt went where its prefix was cached",
              cached == [8 * BS] * 6, cached)
        check("lookups answered, none failed",
              r.metric("kvr_remote_indexer_answered_total") >= 12 and
              r.metric("kvr_remote_indexer_failures_total") == 0,
              (r.metric("kvr_remote_indexer_answered_total"),
               r.metric("kvr_remote_indexer_failures_total")))
        check("/health says remote: reachable", "remote: reachable" in r.call("GET", "/health")[1])
        st, q = r.call("POST", "/v1/query", {"tokens": prompt(7000, 8)})
        check("/v1/query on a router without an index: 409 naming the remote indexer",
              st == 409 and ix.url in q["error"]["message"], (st, q))
        ix.kill()
        for k in range(4):
            st, a = r.call("POST", "/v1/completions", {"model": "m", "prompt": prompt(7000 + k, 8),
                                                        "max_tokens": 2})
            check("indexer down: requests are still served", st == 200, (st, a))
        check("the failures are counted by cause",
              r.metric("kvr_remote_indexer_failures_total", cause="connect") >= 4,
              r.metric("kvr_remote_indexer_failures_total", cause="connect"))
        _, w = r.call("GET", "/v1/workers")
        check("/v1/workers and /health say remote: unreachable",
              w.get("remote") == "unreachable" and
              "remote: unreachable" in r.call("GET", "/health")[1], w.get("remote"))
        check("the outage is logged", "remote indexer" in r.stderr() and "zero overlap" in r.stderr())
        ix2 = indexer("--workers", workers, "--block-size", BS, "--model-name", "m", port=port)
        subscribed(m1, 1, ix2)
        subscribed(m2, 2, ix2)
        toks = prompt(8000, 8)
        r.call("POST", "/v1/completions", {"model": "m", "prompt": toks, "max_tokens": 2})
        check("the new indexer learns the new prompt", eventually(lambda: scores(query(ix2, toks)), 10))
        st, b = r.call("POST", "/v1/completions", {"model": "m", "prompt": toks + [9],
                                                    "max_tokens": 2})
        check("indexer back: overlaps route again",
              b.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens") == 8 * BS
              and "remote: reachable" in r.call("GET", "/health")[1], b.get("usage"))
    finally:
        r.stop()
        if ix2 is not None:
            ix2.stop()
        m1.stop()
        m2.stop()


def hashes_of(toks):
    """(local block hashes, sequence hashes) of toks, as `kvrouter hash` computes them."""
    out = subprocess.run([KVR, "hash"], input=json.dumps({"tokens": toks, "block_size": BS}),
                         capture_output=True, text=True, timeout=30).stdout
    h = json.loads(out)
    return [int(x) for x in h["local_block_hashes"]], [int(x) for x in h["sequence_hashes"]]


def cached_of(answer):
    return answer.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens")


def shared_decisions(first, second, holder, tag):
    """A prompt routed by `first` is recorded in `holder`'s index (eventually: the write is
    asynchronous), and the same prompt extended, routed by `second`, goes to the worker the
    first decision chose (the mocker there has it cached)."""
    cached = []
    for k in range(4):
        toks = prompt(tag + k, 8)
        st, a = first.call("POST", "/v1/completions", {"model": "m", "prompt": toks,
                                                        "max_tokens": 2})
        check("routed in approximate mode", st == 200, (st, a))
        eventually(lambda: scores(query(holder, toks)), 10)
        st, b = second.call("POST", "/v1/completions", {"model": "m", "prompt": toks + [3, 4],
                                                         "max_tokens": 2})
        cached.append(cached_of(b))
    return cached


def scenario_approximate_remote():
    """Routers without KV events (approximate mode) share one index of their decisions: two
    routers writing to a standalone indexer, and over NATS a router writing to one that serves
    its own approximate index; a prompt routed by one router is recorded there, and the same
    prompt through the other goes to the worker the first chose. Mismatched pairs are refused
    with 400, a decision for a rank fed by KV events with 409, an expired decision is gone."""
    m1, m2 = mocker(), mocker()
    ws = ["--worker", f"id=1,url={m1.url},model=m", "--worker", f"id=2,url={m2.url},model=m"]
    ix = indexer("--router-ttl-secs", "3")
    b1 = serve("--use-kv-events", "false", "--remote-indexer", ix.url,
               "--remote-indexer-timeout-ms", "10000", *ws)
    b2 = serve("--use-kv-events", "false", "--remote-indexer", ix.url,
               "--remote-indexer-timeout-ms", "10000", *ws)
    nats = a = c = None
    try:
        cached = shared_decisions(b1, b2, ix, 9100)
        check("a prompt routed by one router went, through the other, where the first sent it",
              cached == [8 * BS] * 4, cached)
        check("the decisions were recorded, none failed",
              b1.metric("kvr_remote_indexer_records_total") >= 4 and
              b1.metric("kvr_remote_indexer_records_failed_total") == 0 and
              ix.metric("kvr_indexer_decisions_recorded_total") >= 8,
              (b1.metric("kvr_remote_indexer_records_total"),
               b1.metric("kvr_remote_indexer_records_failed_total"),
               ix.metric("kvr_indexer_decisions_recorded_total")))
        toks = prompt(9200, 4)
        lbh, seq = hashes_of(toks)
        st, r = ix.call("POST", "/record_routing_decision",
                        {"instance_id": 7, "model_name": "m", "local_hashes": lbh,
                         "sequence_hashes": seq[:2] + [seq[3], seq[2]]})
        check("a mismatched pair is refused with 400 naming it",
              st == 400 and "sequence_hashes[2]" in r["error"] and "mismatched" in r["error"],
              (st, r))
        st, r = ix.call("POST", "/record_routing_decision",
                        {"instance_id": 7, "model_name": "m", "block_size": 32,
                         "local_hashes": lbh, "sequence_hashes": seq})
        check("another block size is refused with 400 naming both",
              st == 400 and "32" in r["error"] and "16" in r["error"], (st, r))
        st, r = ix.call("POST", "/record_routing_decision",
                        {"instance_id": 7, "model_name": "m", "local_hashes": lbh,
                         "sequence_hashes": seq})
        check("a well-formed decision is recorded", st == 200 and
              scores(query(ix, toks)).get((7, 0)) == 4 * BS, (st, r, query(ix, toks)))
        # a router that knows the rank's cache size sends it: the indexer then models the
        # rank as a cache of that many blocks, its least recently recorded blocks out first
        other = prompt(9250, 4)
        olbh, oseq = hashes_of(other)
        for l, q in ((lbh, seq), (olbh, oseq)):
            st, r = ix.call("POST", "/record_routing_decision",
                            {"instance_id": 9, "model_name": "m", "local_hashes": l,
                             "sequence_hashes": q, "kv_capacity_blocks": 6})
            check("a decision with kv_capacity_blocks is recorded", st == 200, (st, r))
        check("a rank of 6 blocks keeps the newer prompt's 4 and the older's first 2",
              scores(query(ix, other)).get((9, 0)) == 4 * BS and
              scores(query(ix, toks)).get((9, 0)) == 2 * BS,
              (query(ix, other), query(ix, toks)))
        st, r = ix.call("POST", "/record_routing_decision",
                        {"instance_id": 9, "model_name": "m", "local_hashes": lbh,
                         "sequence_hashes": seq, "kv_capacity_blocks": 0})
        check("kv_capacity_blocks 0 is refused with 400 naming it",
              st == 400 and "kv_capacity_blocks" in r["error"], (st, r))
        check("an expired decision is gone (router_ttl_secs 3)",
              eventually(lambda: (7, 0) not in scores(query(ix, toks)), 15))
        m3 = mocker()
        try:
            st, _ = ix.call("POST", "/register", {"instance_id": 8, "endpoint": m3.events,
                                                   "model_name": "m", "block_size": BS})
            st, r = ix.call("POST", "/record_routing_decision",
                            {"instance_id": 8, "model_name": "m", "local_hashes": lbh,
                             "sequence_hashes": seq})
            check("a decision for a rank fed by KV events is refused with 409", st == 409 and
                  "KV events" in r["error"], (st, r))
        finally:
            m3.stop()
        b1.stop()
        b2.stop()
        nats = NatsServer()
        a = serve("--nats-url", nats.url, "--use-kv-events", "false", "--serve-indexer", "true",
                  *ws)
        c = serve("--nats-url", nats.url, "--use-kv-events", "false", "--remote-indexer", "nats",
                  "--remote-indexer-timeout-ms", "10000", *ws)
        check("C's NATS link is up",
              eventually(lambda: "nats: connected" in c.call("GET", "/health")[1]))
        cached = shared_decisions(c, a, a, 9300)
        check("over NATS: C's decisions are in A's index and A routes by them",
              cached == [8 * BS] * 4, cached)
        cached = shared_decisions(a, c, a, 9400)
        check("and C routes by A's own decisions", cached == [8 * BS] * 4, cached)
        check("A counted C's decisions", (a.metric("kvr_indexer_nats_records_total") or 0) >= 4 and
              a.metric("kvr_indexer_nats_records_refused_total") == 0,
              a.metric("kvr_indexer_nats_records_total"))
        st, r = a.call("POST", "/record_routing_decision",
                       {"instance_id": 1, "model_name": "m", "local_hashes": lbh,
                        "sequence_hashes": seq[:3]})
        check("A refuses unpaired hashes with 400", st == 400 and "one pair per block" in r["error"],
              (st, r))
    finally:
        for x in (c, a, nats, b1, b2, ix, m1, m2):
            if x is not None:
                x.stop()


def scenario_remote_indexer_deadline():
    """An indexer that accepts and never answers: each decision waits no longer than
    --remote-indexer-timeout-ms, then routes with zero overlap (counted as a timeout)."""
    import socket
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # accepted by the kernel, never read or answered
    m = mocker()
    r = serve("--remote-indexer", f"http://127.0.0.1:{hole.getsockname()[1]}",
              "--remote-indexer-timeout-ms", "50", "--worker", f"id=1,url={m.url},model=m")
    try:
        for k in range(3):
            t0 = time.monotonic()
            st, a = r.call("POST", "/v1/completions", {"model": "m", "prompt": prompt(9100 + k, 2),
                                                        "max_tokens": 2})
            check("a silent indexer: the request is still served", st == 200, (st, a))
            check("and waited at least the deadline", time.monotonic() - t0 >= 0.05)
        check("the timeouts are counted",
              r.metric("kvr_remote_indexer_failures_total", cause="timeout") == 3,
              r.metric("kvr_remote_indexer_failures_total", cause="timeout"))
        check("/health says remote: unreachable", "remote: unreachable" in r.call("GET", "/health")[1])
    finally:
        r.stop()
        m.stop()
        hole.close()


def scenario_remote_indexer_over_nats():
    """Over a real nats-server: router A serves its index on <ns>.indexer.query, router B
    (--remote-indexer nats) routes with it and needs no address of it; A gone, B goes on with
    zero overlap (no responders: counted), and a malformed query to A's subject is answered
    with an error, never a crash."""
    nats = NatsServer()
    m1, m2 = mocker(), mocker()
    spec = [f"id=1,url={m1.url},events={m1.events},replay={m1.replay},model=m",
            f"id=2,url={m2.url},events={m2.events},replay={m2.replay},model=m"]
    a = serve("--nats-url", nats.url, "--serve-indexer", "true", "--worker", spec[0],
              "--worker", spec[1])
    b = serve("--nats-url", nats.url, "--remote-indexer", "nats", "--remote-indexer-timeout-ms",
              "10000", "--worker", f"id=1,url={m1.url},model=m",
              "--worker", f"id=2,url={m2.url},model=m")
    try:
        subscribed(m1, 1, a)
        subscribed(m2, 2, a)
        check("B's NATS link is up", eventually(lambda: "nats: connected" in b.call("GET", "/health")[1]))
        cached = []
        for k in range(4):
            toks = prompt(7700 + k, 8)
            b.call("POST", "/v1/completions", {"model": "m", "prompt": toks, "max_tokens": 2})
            eventually(lambda: scores(query(a, toks)), 10)
            st, r = b.call("POST", "/v1/completions", {"model": "m", "prompt": toks + [5],
                                                        "max_tokens": 2})
            cached.append(r.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens"))
        check("over NATS: every repeated prompt went where its prefix was cached",
              cached == [8 * BS] * 4, cached)
        check("A answered them on its subject",
              (a.metric("kvr_indexer_nats_requests_total") or 0) >= 8 and
              b.metric("kvr_remote_indexer_answered_total") >= 8,
              (a.metric("kvr_indexer_nats_requests_total"),
               b.metric("kvr_remote_indexer_answered_total")))
        nats.publish("kvrouter.indexer.query", b'{"token_ids": "x"}', reply="kvrouter.test.x")
        nats.publish("kvrouter.indexer.query", b'{"model_name": "m"}')
        check("malformed or reply-less queries on the subject: counted, A still serves",
              eventually(lambda: (a.metric("kvr_indexer_bad_requests_total") or 0) >= 1 and
                         (a.metric("kvr_indexer_nats_unanswerable_total") or 0) >= 1) and
              a.call("GET", "/health")[0] == 200)
        a.stop()
        st, r = b.call("POST", "/v1/completions", {"model": "m", "prompt": prompt(7800, 4),
                                                    "max_tokens": 2})
        check("no router serves the index: B still serves the request", st == 200, (st, r))
        check("the lookup is counted as failed and B says remote: unreachable",
              b.metric("kvr_remote_indexer_failures_total") >= 1 and
              "remote: unreachable" in b.call("GET", "/health")[1],
              (b.metric("kvr_remote_indexer_failures_total"), b.call("GET", "/health")[1]))
    finally:
        b.stop()
        a.stop()
        m1.stop()
        m2.stop()
        nats.stop()


def exits(args, code, needle):
    p = subprocess.run([KVR] + args, capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    check(f"{' '.join(args)}: exit {code} naming {needle!r}",
          p.returncode == code and needle in p.stderr, (p.returncode, p.stderr[-300:]))


def scenario_validation():
    """Every bad combination of the indexer flags exits 2 before anything starts, naming them as typed."""
    exits(["serve", "--serve-indexer", "true", "--remote-indexer", "http://h:1"], 2,
          "--serve-indexer: cannot be combined with --remote-indexer")
    exits(["serve", "--serve-indexer", "true", "--router-mode", "round-robin"], 2,
          "--serve-indexer: needs --router-mode kv")
    exits(["serve", "--serve-indexer", "true", "--router-mode", "random"], 2,
          "--serve-indexer: needs --router-mode kv")
    exits(["serve", "--serve-indexer", "true", "--overlap-score-credit", "0"], 2,
          "--serve-indexer: needs --overlap-score-credit > 0")
    exits(["serve", "--remote-indexer", "http://h:1", "--overlap-score-credit", "0"], 2,
          "--remote-indexer: needs --overlap-score-credit > 0")
    exits(["serve", "--remote-indexer", "http://h:1", "--router-mode", "least-loaded"], 2,
          "--remote-indexer: needs --router-mode kv")
    exits(["serve", "--remote-indexer", "ftp://h:1"], 2, "--remote-indexer: 'ftp://h:1'")
    exits(["serve", "--remote-indexer", "nats"], 2, "--remote-indexer: nats needs --nats-url")
    exits(["serve", "--remote-indexer-timeout-ms", "0"], 2, "--remote-indexer-timeout-ms")
    exits(["indexer", "--workers", "1=tcp://127.0.0.1:5557"], 2,
          "--block-size is required with --workers")
    exits(["indexer", "--workers", "x=tcp://h:1", "--block-size", "16"], 2, "--workers")
    exits(["indexer", "--workers", "1=http://h:1", "--block-size", "16"], 2,
          "--workers: endpoint: must be a tcp://")
    exits(["indexer", "--peers", "h:1"], 2, "--peers: 'h:1' is not an http:// URL")
    exits(["indexer", "--block-size", "0"], 2, "--block-size")
    exits(["indexer", "--port", "70000"], 2, "--port")


def scenario_api_errors():
    """Bad input on every route gets a clear error naming the problem, never a crash; the
    reference's statuses (201, 409, 400 naming both block sizes, 404)."""
    ix = indexer()
    try:
        reg = {"instance_id": 1, "endpoint": "tcp://127.0.0.1:1", "model_name": "m",
               "block_size": 16}
        st, a = ix.call("POST", "/register", reg)
        check("register: 201 ok", st == 201 and a == {"status": "ok"}, (st, a))
        st, a = ix.call("POST", "/register", reg)
        check("register twice: 409 naming the rank", st == 409 and "dp_rank 0" in a["error"], (st, a))
        st, a = ix.call("POST", "/register", dict(reg, instance_id=2, block_size=32))
        check("another block size: 400 naming both",
              st == 400 and "32" in a["error"] and "16" in a["error"], (st, a))
        st, a = ix.call("POST", "/register", dict(reg, instance_id=3, dp_rank=1,
                                                  routing_group="g2", block_size=32))
        check("another routing group may have its own block size", st == 201, (st, a))
        st, a = ix.call("GET", "/workers?routing_group=g2")
        check("/workers filters by routing_group",
              st == 200 and [w["instance_id"] for w in a] == [3] and a[0]["block_size"] == 32 and
              a[0]["listeners"]["1"]["status"] == "pending", (st, a))
        bad = ["", "{", "[]", "null", '{"instance_id": "1"}', '{"instance_id": -1}',
               '{"token_ids": [1, "x"], "model_name": "m"}', '{"token_ids": [1]}',
               '{"block_hashes": [1.5], "model_name": "m"}', '{"url": 7}',
               '{"instance_id": 1, "instance_id": 1}', '{"a":' * 100 + "1" + "}" * 100]
        routes = ["/register", "/unregister", "/query", "/query_by_hash", "/register_peer",
                  "/deregister_peer"]
        for route in routes:
            for b in bad:
                st, a = ix.call("POST", route, b)
                check(f"{route} {b[:20]!r}: 400 with a message",
                      st == 400 and isinstance(a, dict) and a.get("error"), (st, a))
        for route in ("/query", "/query_by_hash"):
            for b in (b"", b"\xc1", b"\x93\x01", msgpack.packb({"model_name": "m"}),
                      msgpack.packb({"token_ids": [-1], "block_hashes": ["x"], "model_name": "m"}),
                      msgpack.packb([[1], "m"]) + b"x", b"\xdd\xff\xff\xff\xff"):
                st, a = ix.call("POST", route, b, {"Content-Type": "application/msgpack"})
                check(f"{route} msgpack {b[:12]!r}: 400 with a message",
                      st == 400 and a.get("error"), (st, a))
            st, a = ix.call("POST", route, "{}", {"Content-Type": "text/plain"})
            check(f"{route} text/plain: 415", st == 415 and "Content-Type" in a["error"], (st, a))
        st, a = ix.call("POST", "/query_by_hash", {"block_hashes": [1], "model_name": "m",
                                                   "cache_salt": "s"})
        check("/query_by_hash refuses a cache_salt", st == 400 and "cache_salt" in a["error"], (st, a))
        st, a = ix.call("POST", "/query", {"token_ids": [1] * 64, "model_name": "nope"})
        check("unknown model: 404 naming it", st == 404 and "model=nope" in a["error"], (st, a))
        st, a = ix.call("POST", "/query", {"token_ids": [1] * 64, "model_name": "m"})
        check("a query with no match: empty answer",
              st == 200 and a == {"scores": {}, "frequencies": [], "instances": {}}, (st, a))
        st, a = ix.call("POST", "/unregister", {"instance_id": 9, "model_name": "m"})
        check("unregister an unknown instance: 404", st == 404 and "error" in a, (st, a))
        st, a = ix.call("POST", "/unregister", {"instance_id": 3, "model_name": "m"})
        check("unregister without a group: every group", st == 200, (st, a))
        st, a = ix.call("POST", "/register_peer", {"url": "http://127.0.0.1:1"})
        st2, peers = ix.call("GET", "/peers")
        check("peers: registered and listed", st == 201 and peers == ["http://127.0.0.1:1"],
              (st, peers))
        st, a = ix.call("POST", "/deregister_peer", {"url": "http://127.0.0.1:1"})
        st2, a2 = ix.call("POST", "/deregister_peer", {"url": "http://127.0.0.1:1"})
        check("peers: deregistered once, then 404", st == 200 and st2 == 404, (st, st2))
        st, a = ix.call("GET", "/nope")
        check("an unknown route: 404", st == 404, (st, a))
        st, a = ix.call("DELETE", "/workers")
        check("a method it does not serve: 501 naming the ones it does",
              st == 501 and "GET and POST are served" in a["error"]["message"], (st, a))
        check("the refusals are counted",
              ix.metric("kvr_indexer_bad_requests_total") >= 2 * (len(bad) + 8) and
              ix.metric("kvr_indexer_register_conflicts_total") == 1,
              (ix.metric("kvr_indexer_bad_requests_total"),
               ix.metric("kvr_indexer_register_conflicts_total")))
        check("/health: 200 OK", ix.call("GET", "/health") == (200, "OK"))
        check("/reopen_logs (the reference's rotation hook): 200 ok",
              ix.call("POST", "/reopen_logs") == (200, {"status": "ok"}))
    finally:
        ix.stop()


def scenario_register_races():
    """Registrations and unregistrations race live events: the indexer stays up, its states
    stay true, and a final registration catches up through replay."""
    m1, m2 = mocker(), mocker()
    ix = indexer("--workers", f"1={m1.events}", "--block-size", BS, "--model-name", "m")
    stop = threading.Event()
    errors = []

    def churn():
        reg = {"instance_id": 2, "endpoint": m2.events, "replay_endpoint": m2.replay,
               "model_name": "m", "block_size": BS}
        n = 0
        while not stop.is_set() and n < 60:
            st, a = ix.call("POST", "/register", reg)
            st2, a2 = ix.call("POST", "/unregister", {"instance_id": 2, "model_name": "m"})
            if st != 201 or st2 != 200:
                errors.append((st, a, st2, a2))
            n += 1

    t = threading.Thread(target=churn)
    try:
        t.start()
        for k in range(30):
            complete(m1 if k % 2 else m2, prompt(600 + k, 4))
        stop.set()
        t.join(60)
        check("every register / unregister answered 201 / 200", errors == [], errors[:3])
        st, a = ix.call("POST", "/register", {"instance_id": 2, "endpoint": m2.events,
                                              "replay_endpoint": m2.replay, "model_name": "m",
                                              "block_size": BS})
        check("the final registration", st == 201, (st, a))
        sent = iter(range(999, 1100))

        def caught_up():
            # a new live batch each try (one sent before the SUB connected is lost, as with
            # any ZeroMQ subscriber): the first one seen triggers a replay from batch 0
            complete(m2, prompt(next(sent), 5))
            return (scores(query(ix, prompt(600, 4))).get((2, 0)) == 4 * BS and
                    scores(query(ix, prompt(601, 4))).get((2, 0)) is None)
        check("worker 2's listener catches up (replay from 0): its whole history is indexed",
              eventually(caught_up, 20, 0.2),
              (query(ix, prompt(600, 4)), ix.call("GET", "/workers")[1]))
        _, ws = ix.call("GET", "/workers")
        check("/workers shows both instances active",
              sorted((w["instance_id"], w["status"]) for w in ws) == [(1, "active"), (2, "active")],
              ws)
    finally:
        stop.set()
        ix.stop()
        m1.stop()
        m2.stop()


# ---- hardening: partitions, the pair budget, access, bounded answers ----------------------


# What an answer refused at its bound may cost beyond a process's own memory: the bound (26 MB
# at most below) and the buffer's growth; ASan's allocator keeps every freed buffer of that
# growth in its quarantine. The endless answers below are 300 MB.
RSS_ALLOWANCE_MB = 200 if os.environ.get("KVR_TEST_SCALE") == "asan" else 100


def peak_rss_mb(child):
    """The most memory a child has held (VmHWM), in MB."""
    with open(f"/proc/{child.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return -1.0


HASHES = {}  # prompt -> (local hashes, sequence hashes): `kvrouter hash` once per prompt


def record(ix, model, instance=1, toks=None, headers=None, conn=None, **extra):
    """POST /record_routing_decision of one prompt (one block unless toks): (status, body)."""
    lbh, seq = HASHES.get(tuple(toks or ())) or hashes_of(toks or prompt(9500, 1))
    HASHES[tuple(toks or ())] = (lbh, seq)
    body = dict({"instance_id": instance, "model_name": model, "block_size": BS,
                 "local_hashes": lbh, "sequence_hashes": seq}, **extra)
    if conn is None:
        return ix.call("POST", "/record_routing_decision", body, headers)
    conn.request("POST", "/record_routing_decision", json.dumps(body),
                 dict({"Content-Type": "application/json"}, **(headers or {})))
    r = conn.getresponse()
    raw = r.read()
    return r.status, json.loads(raw) if raw.startswith(b"{") else raw


def metric_as(ix, name, headers):
    """A metric read with a token (/metrics needs the api key when one is set)."""
    st, _, raw = ix.request("GET", "/metrics", headers=headers)
    for line in raw.decode(errors="replace").splitlines() if st == 200 else ():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def partitions(ix, headers=None):
    st, a = ix.call("GET", "/v1/index/partitions", headers=headers)
    return sorted(p["model_name"] for p in a) if st == 200 else (st, a)


def scenario_partitions_do_not_lock_up():
    """One-block decisions naming new models used to fill the partition cap for good
    (partitions were never dropped: every /register after got 400). A partition with no
    registration now goes once its decisions expire: the real registration gets in; one with a
    registration stays, and goes once its last rank is unregistered."""
    ix = indexer("--router-ttl-secs", "1")
    try:
        refused = None
        for k in range(70):
            st, r = record(ix, f"junk{k}")
            if st != 200:
                refused = (k, st, r)
                break
        check("decisions naming new models fill the indexer, then one is refused with 400",
              refused is not None and refused[1] == 400, refused)
        reg = {"instance_id": 5, "endpoint": "tcp://127.0.0.1:1", "model_name": "real",
               "block_size": BS}
        check("the junk partitions go with their decisions: a real registration gets in (201)",
              eventually(lambda: ix.call("POST", "/register", reg)[0] == 201, 20, 0.1),
              (ix.call("POST", "/register", reg), partitions(ix)))
        made = refused[0] if refused else 0
        check("the refusal names the cap it hit",
              refused is not None and ("--max-total-pairs" in refused[2].get("error", "") or
                                       "--max-partitions" in refused[2].get("error", "")),
              refused)
        check("every junk partition is dropped and counted; the registered one stays",
              eventually(lambda: (ix.metric("kvr_indexer_partitions_dropped_total") or 0) >= made
                         and partitions(ix) == ["real"], 20),
              (ix.metric("kvr_indexer_partitions_dropped_total"), made, partitions(ix)))
        check("the refusal is counted",
              (ix.metric("kvr_indexer_partitions_refused_total") or 0) >= 1,
              ix.metric("kvr_indexer_partitions_refused_total"))
        st, _ = ix.call("POST", "/unregister", {"instance_id": 5, "model_name": "real"})
        check("its last rank unregistered, the partition goes too",
              st == 200 and eventually(lambda: partitions(ix) == [], 20), partitions(ix))
        check("and its reservation is back", ix.metric("kvr_indexer_pairs_reserved") == 0,
              ix.metric("kvr_indexer_pairs_reserved"))
    finally:
        ix.stop()


def scenario_approximate_partition_comes_back():
    """Routers in approximate mode ask the indexer before their first decision makes the
    partition, and after its decisions expired and it was dropped: that 404 is an answer of
    zero overlap (counted apart), not a failure making the indexer look unreachable; the next
    decision makes the partition again."""
    m = mocker()
    ix = indexer("--router-ttl-secs", "1")
    r = serve("--use-kv-events", "false", "--remote-indexer", ix.url,
              "--remote-indexer-timeout-ms", "10000", "--worker", f"id=1,url={m.url},model=m")
    try:
        for k in range(2):
            st, a = r.call("POST", "/v1/completions", {"model": "m", "prompt": prompt(9800 + k, 3),
                                                        "max_tokens": 2})
            check(f"request {k}: served", st == 200, (st, a))
            check(f"request {k}: its decision makes the partition",
                  eventually(lambda: partitions(ix) == ["m"], 10), partitions(ix))
            check(f"request {k}: the partition goes once the decision expired",
                  eventually(lambda: partitions(ix) == [], 20), partitions(ix))
        check("both lookups found no partition: answered, counted apart, no failure",
              r.metric("kvr_remote_indexer_unknown_partition_total") == 2 and
              r.metric("kvr_remote_indexer_failures_total") == 0,
              (r.metric("kvr_remote_indexer_unknown_partition_total"),
               r.metric("kvr_remote_indexer_failures_total")))
        check("the router says remote: reachable",
              "remote: reachable" in r.call("GET", "/health")[1], r.call("GET", "/health")[1])
        check("every decision was recorded",
              r.metric("kvr_remote_indexer_records_total") == 2 and
              r.metric("kvr_remote_indexer_records_failed_total") == 0,
              (r.metric("kvr_remote_indexer_records_total"),
               r.metric("kvr_remote_indexer_records_failed_total")))
    finally:
        r.stop()
        ix.stop()
        m.stop()


def scenario_pair_budget():
    """--max-total-pairs bounds the pairs of every partition together: each new partition
    reserves min(--max-pairs, what is left), one that does not fit is refused with 400 naming
    the flag, as is one past --max-partitions; the flags are checked at start."""
    ix = indexer("--max-pairs", "1024", "--max-total-pairs", "2560", "--max-partitions", "3",
                 "--router-ttl-secs", "600")
    capped = indexer("--max-partitions", "1")
    try:
        long_prompt = prompt(9600, 1500)
        for m in ("a", "b"):
            for k in range(2):
                st, r = record(ix, m, instance=k + 1, toks=long_prompt)
                check(f"partition {m}: a decision of 1500 blocks is recorded", st == 200, (st, r))
        st, r = record(ix, "c")
        check("a third partition does not fit the budget: 400 naming --max-total-pairs",
              st == 400 and "--max-total-pairs 2560" in r["error"], (st, r))
        pairs = ix.metric("kvr_indexer_pairs")
        check("the pairs of every partition together stay within --max-total-pairs",
              pairs is not None and 2000 <= pairs <= 2560, pairs)
        check("reservations and refusals are in /metrics",
              ix.metric("kvr_indexer_pairs_reserved") == 2048 and
              ix.metric("kvr_indexer_pair_budget") == 2560 and
              ix.metric("kvr_indexer_partitions_refused_total", cause="max_total_pairs") == 1,
              (ix.metric("kvr_indexer_pairs_reserved"), ix.metric("kvr_indexer_pair_budget"),
               ix.metric("kvr_indexer_partitions_refused_total", cause="max_total_pairs")))
        st, r = capped.call("POST", "/register", {"instance_id": 1, "endpoint": "tcp://127.0.0.1:1",
                                                  "model_name": "a", "block_size": BS})
        st2, r2 = capped.call("POST", "/register", {"instance_id": 1,
                                                    "endpoint": "tcp://127.0.0.1:1",
                                                    "model_name": "b", "block_size": BS})
        check("past --max-partitions: 400 naming it",
              st == 201 and st2 == 400 and "--max-partitions 1" in r2["error"], (st, r, st2, r2))
        check("and counted", capped.metric("kvr_indexer_partitions_refused_total",
                                           cause="max_partitions") == 1)
    finally:
        ix.stop()
        capped.stop()
    exits(["indexer", "--max-pairs", "4096", "--max-total-pairs", "2048"], 2,
          "--max-pairs 4096 is more than --max-total-pairs 2048")
    exits(["indexer", "--max-total-pairs", "100"], 2, "--max-total-pairs")
    exits(["indexer", "--max-partitions", "0"], 2, "--max-partitions")
    exits(["indexer", "--max-partitions", "5000"], 2, "--max-partitions")


def scenario_rank_cap_is_a_4xx():
    """Decisions of more ranks than a partition's index keeps (4096) used to get 500
    `capacity exhausted`: now a 400 naming the cap, counted, and the indexer goes on."""
    ix = indexer()
    conn = http.client.HTTPConnection(ix.host, ix.port, timeout=30)
    try:
        bad = []
        for i in range(1, 4097):
            st, r = record(ix, "m", instance=i, conn=conn)
            if st != 200:
                bad.append((i, st, r))
        check("4096 ranks' decisions are recorded", bad == [], bad[:3])
        st, r = record(ix, "m", instance=4097, conn=conn)
        check("the 4097th rank: 400 naming the cap of 4096 ranks",
              st == 400 and "4096 ranks" in r.get("error", ""), (st, r))
        check("counted", ix.metric("kvr_indexer_decisions_over_capacity_total") == 1,
              ix.metric("kvr_indexer_decisions_over_capacity_total"))
        st, _ = ix.call("POST", "/unregister", {"instance_id": 1, "model_name": "m"})
        st2, r2 = record(ix, "m", instance=4097)
        check("an unregistered instance frees its rank for another", st == 200 and st2 == 200,
              (st, st2, r2))
    finally:
        conn.close()
        ix.stop()


def key_files(tmp, **keys):
    paths = {}
    for name, token in keys.items():
        path = f"{tmp}/{name}.key"
        with open(path, "w") as f:
            f.write(token + "\n")
        paths[name] = path
    return paths


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def scenario_access():
    """With --api-key-file, --admin-key-file and --peer-key-file: /health and /ready are open;
    every call that changes something needs the admin key, the index copies the peer key (or
    the admin key), everything else the api key (or the admin key), and GET /workers also the
    peer key (a recovering peer reads the registrations with it); a refusal is a 401 in
    serve's shape, counted. A peer given the peer key recovers from it, registrations
    included; one without is told 401 and starts cold. Unreadable or shared keys stop the start
    naming the file."""
    import tempfile
    tmp = tempfile.mkdtemp(prefix="kvr-ixkeys-")
    k = key_files(tmp, api="api-token-1", admin="admin-token-2", peer="peer-token-3")
    api, admin, peer = bearer("api-token-1"), bearer("admin-token-2"), bearer("peer-token-3")
    ix = indexer("--api-key-file", k["api"], "--admin-key-file", k["admin"], "--peer-key-file",
                 k["peer"])
    b = c = None
    refusals = 0
    try:
        for path in ("/health", "/ready"):
            st, _ = ix.call("GET", path)
            check(f"GET {path}: open", st == 200, st)
        reg = {"instance_id": 1, "endpoint": "tcp://127.0.0.1:1", "model_name": "m",
               "block_size": BS}
        writes = [("/register", reg), ("/register_peer", {"url": "http://127.0.0.1:1"}),
                  ("/deregister_peer", {"url": "http://127.0.0.1:1"}),
                  ("/unregister", {"instance_id": 1, "model_name": "m"}), ("/reopen_logs", {})]
        for path, body in writes:
            for who, h in (("no token", None), ("the api key", api), ("the peer key", peer),
                           ("a wrong token", bearer("nope"))):
                st, r, hd = ix.call_h("POST", path, body, h)
                refusals += 1
                check(f"POST {path} with {who}: 401 in serve's shape",
                      st == 401 and r["error"]["code"] == "invalid_api_key" and
                      r["error"]["type"] == "invalid_request_error" and r["error"]["message"] and
                      hd.get("WWW-Authenticate") == "Bearer", (st, r))
            st, r = ix.call("POST", path, body, admin)
            check(f"POST {path} with the admin key: served", st in (200, 201), (st, r))
        st, r = record(ix, "m", headers=api)
        refusals += 1
        check("POST /record_routing_decision with the api key: 401 naming the admin key",
              st == 401 and "admin key" in r["error"]["message"], (st, r))
        st, r = record(ix, "m", headers=admin)
        check("with the admin key: recorded", st == 200, (st, r))
        q = {"token_ids": prompt(9500, 1), "model_name": "m"}
        by_hash = {"block_hashes": [1], "model_name": "m"}
        for path, method, body in (("/query", "POST", q), ("/query_by_hash", "POST", by_hash),
                                   ("/workers", "GET", None), ("/peers", "GET", None),
                                   ("/metrics", "GET", None)):
            st, r = ix.call(method, path, body)
            st2, r2 = ix.call(method, path, body, peer)
            if path == "/workers":  # the peer key reads the registrations (peer recovery)
                refusals += 1
                check("GET /workers without a token: 401; with the peer key: served",
                      st == 401 and st2 == 200, (st, r, st2, r2))
            else:
                refusals += 2
                check(f"{method} {path} without a token or with the peer key: 401",
                      st == 401 and st2 == 401, (st, r, st2, r2))
            check(f"{method} {path} with the api key and with the admin key: served",
                  ix.call(method, path, body, api)[0] == 200 and
                  ix.call(method, path, body, admin)[0] == 200)
        st, r = ix.call("POST", "/query", q, api)
        check("the recorded decision answers the api key's query",
              st == 200 and scores(r).get((1, 0)) == BS, (st, r))
        for path in ("/dump", "/v1/index/partitions",
                     "/v1/index/snapshot?model_name=m&routing_group=default"):
            st, _ = ix.call("GET", path, None, api)
            st0, _ = ix.call("GET", path)
            refusals += 2
            check(f"GET {path} without a token or with the api key: 401", st == 401 and st0 == 401,
                  (st, st0))
            check(f"GET {path} with the peer key and with the admin key: served",
                  ix.call("GET", path, None, peer)[0] == 200 and
                  ix.call("GET", path, None, admin)[0] == 200)
        check("every refusal is counted",
              metric_as(ix, "kvr_indexer_unauthorized_total", api) == refusals,
              (metric_as(ix, "kvr_indexer_unauthorized_total", api), refusals))
        st, r = ix.call("POST", "/register", reg, admin)
        check("a worker registered again", st == 201, (st, r))
        b = indexer("--peers", ix.url, "--peer-key-file", k["peer"])
        check("a peer sending the peer key recovers the index and the registrations",
              "index recovered from peer " + ix.url in b.stderr() and
              regs_of(b.call("GET", "/workers")[1]) ==
              regs_of(ix.call("GET", "/workers", None, api)[1]) != [], b.stderr()[-600:])
        c = indexer("--peers", ix.url)
        check("a peer without it is refused (401) and starts cold, saying so",
              "401" in c.stderr() and "starting with an empty index" in c.stderr(),
              c.stderr()[-600:])
        check("its attempt is counted",
              metric_as(ix, "kvr_indexer_unauthorized_total", api) == refusals + 1,
              metric_as(ix, "kvr_indexer_unauthorized_total", api))
    finally:
        for x in (c, b, ix):
            if x is not None:
                x.stop()
    same = key_files(tmp, same="same-token")
    exits(["indexer", "--api-key-file", same["same"], "--admin-key-file", same["same"]], 2,
          "admin_key_file: holds the same token as api_key_file")
    exits(["indexer", "--admin-key-file", f"{tmp}/missing"], 2, "admin_key_file")
    exits(["indexer", "--peer-key-file", k["api"], "--api-key-file", k["api"]], 2,
          "peer_key_file: holds the same token as api_key_file")
    shutil.rmtree(tmp, ignore_errors=True)


def scenario_keyed_remote():
    """Routers in approximate mode against an indexer with keys: given
    --remote-indexer-key-file (lookups) and --remote-indexer-admin-key-file (decisions) they
    share its index; a router without them is refused (401, counted on both sides) and routes
    with zero overlap."""
    import tempfile
    tmp = tempfile.mkdtemp(prefix="kvr-ixkeys-")
    k = key_files(tmp, api="api-token-5", admin="admin-token-6")
    api = bearer("api-token-5")
    m1, m2 = mocker(), mocker()
    ws = ["--worker", f"id=1,url={m1.url},model=m", "--worker", f"id=2,url={m2.url},model=m"]
    ix = indexer("--router-ttl-secs", "30", "--api-key-file", k["api"], "--admin-key-file",
                 k["admin"])
    keyed = ["--use-kv-events", "false", "--remote-indexer", ix.url,
             "--remote-indexer-timeout-ms", "10000", "--remote-indexer-key-file", k["api"],
             "--remote-indexer-admin-key-file", k["admin"]] + ws
    b1, b2 = serve(*keyed), serve(*keyed)
    b0 = serve("--use-kv-events", "false", "--remote-indexer", ix.url,
               "--remote-indexer-timeout-ms", "10000", *ws)
    try:
        cached = []
        for j in range(3):
            toks = prompt(9700 + j, 8)
            st, a = b1.call("POST", "/v1/completions", {"model": "m", "prompt": toks,
                                                        "max_tokens": 2})
            check("keyed: routed", st == 200, (st, a))
            check("keyed: the decision is recorded", eventually(lambda: scores(
                ix.call("POST", "/query", {"token_ids": toks, "model_name": "m"}, api)[1]), 10))
            st, b = b2.call("POST", "/v1/completions", {"model": "m", "prompt": toks + [3, 4],
                                                        "max_tokens": 2})
            cached.append(cached_of(b))
        check("keyed: the second router follows the first's decisions", cached == [8 * BS] * 3,
              cached)
        check("keyed: no lookup or record failed",
              b1.metric("kvr_remote_indexer_records_failed_total") == 0 and
              (b2.metric("kvr_remote_indexer_failures_total") or 0) == 0,
              (b1.metric("kvr_remote_indexer_records_failed_total"),
               b2.metric("kvr_remote_indexer_failures_total")))
        before = metric_as(ix, "kvr_indexer_unauthorized_total", api) or 0
        st, a = b0.call("POST", "/v1/completions", {"model": "m", "prompt": prompt(9790, 8),
                                                    "max_tokens": 2})
        check("keyless: still served (zero overlap)", st == 200, (st, a))
        check("keyless: refused by the indexer, counted on both sides", eventually(
            lambda: (metric_as(ix, "kvr_indexer_unauthorized_total", api) or 0) > before and
            ((b0.metric("kvr_remote_indexer_failures_total") or 0) +
             (b0.metric("kvr_remote_indexer_records_failed_total") or 0)) >= 1, 10),
            (metric_as(ix, "kvr_indexer_unauthorized_total", api),
             b0.metric("kvr_remote_indexer_failures_total")))
    finally:
        for x in (b0, b1, b2, ix, m1, m2):
            x.stop()
    exits(["serve", "--remote-indexer", "http://h:1", "--remote-indexer-key-file",
           f"{tmp}/missing"], 1, "--remote-indexer-key-file")
    shutil.rmtree(tmp, ignore_errors=True)


class FloodPeer(http.server.BaseHTTPRequestHandler):
    """A peer whose answers are `routes`: a path prefix -> (first bytes, flood); a flooding
    answer goes on with spaces up to FLOOD_BYTES, with no Content-Length (read to the close).
    Any other path is 404."""
    routes = {}
    FLOOD_BYTES = 300 << 20
    FILL = b" " * (1 << 20)

    def do_GET(self):
        for prefix, (head, flood) in self.routes.items():
            if self.path.startswith(prefix):
                break
        else:
            head, flood = None, False
        self.send_response(404 if head is None else 200)
        if not flood:
            body = b"{}" if head is None else head
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.end_headers()
        try:
            self.wfile.write(head)
            sent = len(head)
            while sent < self.FLOOD_BYTES:
                self.wfile.write(self.FILL)
                sent += len(self.FILL)
        except OSError:
            pass  # refused: the reader closed the connection

    def log_message(self, *args):
        pass


def flood_server(routes):
    handler = type("Flood", (FloodPeer,), {"routes": routes})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def scenario_peer_answers_are_bounded():
    """A peer answering start-up recovery with an endless body (its partitions list, a
    snapshot with the right magic, a JSON dump, its registrations) used to be buffered up to
    4 GB: each is now refused past what it can legitimately be; the indexer starts cold, says
    why, its memory stays small, and it serves."""
    one = b'[{"model_name":"m","routing_group":"default","block_size":16}]'
    cold = indexer("--max-pairs", "1024")  # what the same indexer holds with no peer at all
    cold.call("GET", "/health")
    base = peak_rss_mb(cold)
    cold.stop()
    cases = [
        ("partitions list", {"/v1/index/partitions": (b"[", True)}),
        ("snapshot", {"/v1/index/partitions": (one, False),
                      "/v1/index/snapshot": (b"KVRSNAP1", True)}),
        ("JSON dump (a peer without snapshots)", {"/dump": (b'{"m:default": ', True)}),
        ("registrations list", {"/v1/index/partitions": (one, False), "/workers": (b"[", True)}),
    ]
    for what, routes in cases:
        srv = flood_server(routes)
        ix = None
        try:
            ix = indexer("--max-pairs", "1024", "--peer-timeout-ms", "60000", "--peers",
                         f"http://127.0.0.1:{srv.server_address[1]}")
            err = ix.stderr()
            check(f"an endless {what}: refused past its bound, a cold start saying so",
                  "larger than" in err and "starting with an empty index" in err, err[-600:])
            rss = peak_rss_mb(ix)
            check(f"an endless {what}: the indexer held at most {RSS_ALLOWANCE_MB} MB more than "
                  "a cold start", 0 < rss < base + RSS_ALLOWANCE_MB, (rss, base))
            check(f"an endless {what}: the indexer serves", ix.call("GET", "/health")[0] == 200)
            check(f"an endless {what}: the failure is counted",
                  ix.metric("kvr_indexer_peer_recovery_failures_total") == 1,
                  ix.metric("kvr_indexer_peer_recovery_failures_total"))
            check(f"an endless {what}: the registrations' failure is counted when they were "
                  "asked for (a 404 is a failure too)",
                  ix.metric("kvr_indexer_peer_registrations_failures_total") ==
                  (0 if what == "partitions list" else 1),
                  ix.metric("kvr_indexer_peer_registrations_failures_total"))
        finally:
            if ix is not None:
                ix.stop()
            srv.shutdown()



class PlannedIndexer(http.server.BaseHTTPRequestHandler):
    """A remote indexer answering each POST /query_by_hash with the next step of `plan`:
    (status, headers, body, declared length or None, flood bytes after the body). HTTP/1.0:
    every answer ends with the connection (a body without a length is read to the close)."""
    plan = []
    lock = threading.Lock()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.lock:
            step = self.plan.pop(0) if self.plan else (200, {}, EMPTY_ANSWER, None, 0)
        status, headers, body, length, flood = step
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()
        try:
            self.wfile.write(body)
            fill, sent = b" " * (1 << 20), 0
            while sent < flood:
                self.wfile.write(fill)
                sent += len(fill)
        except OSError:
            pass  # refused: the router closed the connection

    def log_message(self, *args):
        pass


EMPTY_ANSWER = b'{"scores":{},"frequencies":[],"instances":{}}'


def scenario_remote_answers_are_bounded():
    """A router with --remote-indexer used to buffer whatever the indexer sent (3.5 GB in the
    probe) and logged an error answer past its end (%.200s on a buffer without a NUL): a body
    larger than an answer can be (declared or not) and a head over 16 KiB are refused as they
    arrive (cause "answer"), the router's memory stays small, an error answer is logged as it
    is, and the router routes on."""
    flood = 300 << 20
    pad = {f"X-Pad-{i}": "p" * 100 for i in range(2000)}  # ~220 KB of headers
    PlannedIndexer.plan = [
        (503, {}, b"Z" * 150, 150, 0),
        (503, {}, b"X", 1, 0),
        (200, {}, b'{"scores":', flood + 10, flood),
        (200, {}, b'{"scores":', None, flood),
        (200, pad, EMPTY_ANSWER, len(EMPTY_ANSWER), 0),
        (200, {}, EMPTY_ANSWER, len(EMPTY_ANSWER), 0),
    ]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), PlannedIndexer)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    m = mocker()
    r = serve("--remote-indexer", f"http://127.0.0.1:{srv.server_address[1]}",
              "--remote-indexer-timeout-ms", "10000", "--worker", f"id=1,url={m.url},model=m")
    r.call("GET", "/health")
    base = peak_rss_mb(r)  # before any answer
    try:
        for k in range(6):
            st, a = r.call("POST", "/v1/completions", {"model": "m", "prompt": prompt(9700 + k, 2),
                                                        "max_tokens": 2})
            check(f"answer {k}: the request is served", st == 200, (st, a))
        err = r.stderr()
        check("an error answer is logged as it is, nothing past its end",
              "answered 503: X; this decision has zero overlap" in err,
              [l for l in err.splitlines() if "answered 503" in l])
        check("bodies over the bound (declared or not) and a head over 16 KiB: refused, counted "
              "as answer failures",
              r.metric("kvr_remote_indexer_failures_total", cause="answer") == 3 and
              r.metric("kvr_remote_indexer_failures_total", cause="status") == 2,
              (r.metric("kvr_remote_indexer_failures_total", cause="answer"),
               r.metric("kvr_remote_indexer_failures_total", cause="status")))
        check("and logged", err.count("answer is refused unread") == 3,
              [l for l in err.splitlines() if "remote indexer" in l][-4:])
        rss = peak_rss_mb(r)
        check(f"the router held at most {RSS_ALLOWANCE_MB} MB more than before the answers",
              0 < rss < base + RSS_ALLOWANCE_MB, (rss, base))
        check("a lookup whose connection the indexer closed under it (HTTP/1.0: after every "
              "answer) is sent again once, never lost as 'no answer'",
              "no answer" not in err, [l for l in err.splitlines() if "no answer" in l])
        check("a good answer after them is used",
              r.metric("kvr_remote_indexer_answered_total") == 1 and
              "remote: reachable" in r.call("GET", "/health")[1],
              r.metric("kvr_remote_indexer_answered_total"))
    finally:
        r.stop()
        m.stop()
        srv.shutdown()


if __name__ == "__main__":
    print(f"seed {SEED}", flush=True)
    run_scenarios([s for s in [
        ("same_answers_as_a_router", scenario_same_answers_as_a_router),
        ("peer_recovery", scenario_peer_recovery),
        ("peer_registrations", scenario_peer_registrations),
        ("peer_registrations_unavailable", scenario_peer_registrations_unavailable),
        ("remote_indexer_routing_and_outage", scenario_remote_indexer_routing_and_outage),
        ("remote_indexer_deadline", scenario_remote_indexer_deadline),
        ("remote_indexer_over_nats", scenario_remote_indexer_over_nats),
        ("approximate_remote", scenario_approximate_remote),
        ("validation", scenario_validation),
        ("api_errors", scenario_api_errors),
        ("register_races", scenario_register_races),
        ("partitions_do_not_lock_up", scenario_partitions_do_not_lock_up),
        ("approximate_partition_comes_back", scenario_approximate_partition_comes_back),
        ("pair_budget", scenario_pair_budget),
        ("rank_cap_is_a_4xx", scenario_rank_cap_is_a_4xx),
        ("access", scenario_access),
        ("keyed_remote", scenario_keyed_remote),
        ("peer_answers_are_bounded", scenario_peer_answers_are_bounded),
        ("remote_answers_are_bounded", scenario_remote_answers_are_bounded),
    ] if len(sys.argv) < 3 or s[0] in sys.argv[2:]], SEED)
