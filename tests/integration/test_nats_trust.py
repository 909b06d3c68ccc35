#!/usr/bin/python3
"""What a stranger on the NATS bus can and cannot do to router replicas. Every scenario runs a
real nats-server (started here on a free loopback port) and real `kvrouter serve` replicas; the
forgeries are published with NATS's raw text protocol (NatsServer.publish: no client library,
the test is just another client of the server), as any process that can reach the server could.

  forged entry    a <ns>_routers entry naming another host: a joining replica never asks it
                  (no token, no index) unless allowed_peer_hosts names the host; then only the
                  peer key is sent, never the admin key, and an answer that is not a snapshot
                  is refused after its first bytes
  flood           a million forged adds for a live replica's id: the replica keeps serving its
                  own clients (peers' bookings are bounded apart from local ones), its memory
                  stays bounded, /ready says so when every request would be refused
  forged frees    FREE and PREFILL_DONE for a local booking, from any router id: ignored; a
                  forged add with an origin other than the batch's router: refused
  snapshot storm  snapshot requests beyond the rate limit are refused, counted
Usage: test_nats_trust.py <path to kvrouter>.
"""
import http.server
import json
import os
import socketserver
import struct
import sys
import tempfile
import threading
import time

from kvr_harness import Child, NatsServer, check, eventually, finish, kill_children

KVR = sys.argv[1]
BS = 16
WORKERS = ["--worker", "id=1", "--worker", "id=2", "--worker", "id=3"]
TTL_MS = 1500
TMP = tempfile.mkdtemp(prefix="kvr-nats-trust-")


def secret(name, value):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(value + "\n")
    os.chmod(path, 0o600)
    return path


def replica(nats, *extra, what="replica", sync=True, ttl_ms=TTL_MS):
    return Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--nats-url", nats.url,
                  "--router-replica-sync", "true" if sync else "false",
                  "--nats-presence-ttl-ms", ttl_ms, "--log-level", "info"] + WORKERS +
                 [str(a) for a in extra], what)


def ready(r, headers=None):
    return r.call("GET", "/ready", headers=headers)[0] == 200


def tokens(seed, n=64):
    return [(seed * 7919 + i) % 50000 for i in range(n)]


class Listener:
    """An HTTP server on 127.0.0.2 (loopback, but not the routers' host) that records what it is
    asked and answers GET /v1/index/snapshot with `junk` bytes of garbage, streamed."""

    def __init__(self, junk):
        self.seen = []
        self.sent = 0
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(junk))
                self.end_headers()
                chunk = b"\xab" * 65536
                try:
                    while outer.sent < junk:
                        self.wfile.write(chunk)
                        outer.sent += len(chunk)
                except OSError:
                    pass  # the router hung up: what the test wants

        class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.srv = S(("127.0.0.2", 0), H)
        self.port = self.srv.server_address[1]
        self.url = f"http://127.0.0.2:{self.port}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def forge_entry(nats, router_id, url):
    """A presence entry in <ns>_routers, as any NATS client can write one."""
    return nats.publish(f"$KV.kvrouter_routers.{router_id:016x}", json.dumps(
        {"router_id": f"{router_id:016x}", "url": url, "admin_url": url}).encode())


def scenario_forged_entry(nats):
    """A forged <ns>_routers entry gets neither the admin key nor a chance to feed an index."""
    admin = secret("admin.key", "admin-secret-" + "a" * 20)
    peer = secret("peer.key", "peer-secret-" + "p" * 20)
    trap = Listener(junk=256 << 20)
    r1 = r2 = None
    try:
        first = replica(nats, what="first replica (makes the buckets)")
        check("forged entry: the first replica is ready", eventually(lambda: ready(first), 15))
        first.stop()
        check("forged entry: nats-server took it", forge_entry(nats, 0xbad1, trap.url))
        r1 = replica(nats, "--admin-key-file", admin, "--peer-key-file", peer,
                     what="joining replica", ttl_ms=30000)
        check("forged entry: the joining replica is ready (cold)",
              eventually(lambda: ready(r1), 15))
        check("forged entry: the forged host was never asked", trap.seen == [], trap.seen)
        check("forged entry: counted", r1.metric("kvr_replicas_peer_urls_refused_total") == 1,
              r1.metric("kvr_replicas_peer_urls_refused_total"))
        check("forged entry: logged, naming the setting",
              "allowed_peer_hosts" in r1.stderr(), r1.stderr()[-1500:])
        r1.stop()
        # the operator allows that host: asked with the peer key alone; junk refused at once
        check("forged entry: written again", forge_entry(nats, 0xbad2, trap.url))
        r2 = replica(nats, "--admin-key-file", admin, "--peer-key-file", peer,
                     "--allowed-peer-hosts", "127.0.0.2", what="replica allowing 127.0.0.2",
                     ttl_ms=30000)
        check("allowed host: ready", eventually(lambda: ready(r2), 15))
        auths = [a for _, a in trap.seen]
        check("allowed host: asked for its snapshot", ("/v1/index/snapshot" in
              [p for p, _ in trap.seen]), trap.seen)
        check("allowed host: sent the peer key, never the admin key",
              auths and all(a == "Bearer peer-secret-" + "p" * 20 for a in auths), auths)
        check("allowed host: junk refused after its first bytes (not 256 MiB read)",
              eventually(lambda: trap.sent < (64 << 20), 5), trap.sent)
        err = r2.stderr()
        check("allowed host: the refusal is logged", "does not start as expected" in err,
              err[-1500:])
    finally:
        for r in (r1, r2):
            if r is not None:
                r.stop()
        trap.close()


def main():
    nats = NatsServer()
    try:
        scenario_forged_entry(nats)
    finally:
        kill_children()
        nats.stop()
    finish()


if __name__ == "__main__":
    main()
