"""A scripted engine rank for the integration and fault tests: the KV-event wire protocol vLLM
and SGLang publish (ZeroMQ PUB [topic, seq u64 big-endian, msgpack batch] + a ROUTER replay
socket), written from the published byte layouts independently of the C code, and builders
for the events it sends. Needs Debian's python3-zmq and python3-msgpack (/usr/bin/python3)."""
import struct
import threading
import time

import msgpack
import zmq

BS = 16


class Engine:
    """One engine rank's publisher: PUB + replay ROUTER, numbered batches, a replay buffer."""

    def __init__(self, ctx):
        # XPUB: a PUB on the wire that also tells us when a subscriber's subscription has
        # arrived, so the test waits for that instead of sleeping (ZeroMQ's slow joiner)
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.bind("tcp://127.0.0.1:*")
        self.subscriptions = 0
        self.router = ctx.socket(zmq.ROUTER)
        self.router.bind("tcp://127.0.0.1:*")
        self.seq = 0
        self.kept = []
        self.lock = threading.Lock()
        self.stop = False
        self.release = threading.Event()  # cleared: replay answers wait until it is set
        self.release.set()
        self.asked = []                   # start seqs of the replay requests received
        self.thread = threading.Thread(target=self.serve_replay, daemon=True)
        self.thread.start()

    def endpoint(self):
        return self.pub.getsockopt(zmq.LAST_ENDPOINT).decode()

    def wait_subscribed(self, n=1, timeout=10.0):
        """Bounded wait until n subscriptions have reached this publisher."""
        end = time.monotonic() + timeout
        while self.subscriptions < n and time.monotonic() < end:
            if self.pub.poll(50):
                if self.pub.recv()[:1] == b"\x01":
                    self.subscriptions += 1
        return self.subscriptions >= n

    def replay_endpoint(self):
        return self.router.getsockopt(zmq.LAST_ENDPOINT).decode()

    def serve_replay(self):
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stop:
            if not poller.poll(50):
                continue
            f = self.router.recv_multipart()
            if len(f) != 3 or len(f[2]) != 8:
                continue
            start = struct.unpack(">Q", f[2])[0]
            self.asked.append(start)
            while not self.release.wait(0.05):
                if self.stop:
                    return
            with self.lock:
                batch = [(s, p) for s, p in self.kept if s >= start]
            for s, p in batch:
                self.router.send_multipart([f[0], b"", struct.pack(">Q", s), p])
            self.router.send_multipart([f[0], b"", b"\xff" * 8, b""])

    def send(self, payload, deliver=True):
        with self.lock:
            self.kept.append((self.seq, payload))
        if deliver:
            self.pub.send_multipart([b"", struct.pack(">Q", self.seq), payload])
        self.seq += 1

    def restart(self):
        with self.lock:
            self.kept.clear()
        self.seq = 0

    def close(self):
        self.stop = True
        self.thread.join()
        self.pub.close()
        self.router.close()


def tokens_for(prompt, n_blocks):
    return [(prompt * 7919 + i) % 150000 for i in range(n_blocks * BS)]


def engine_hashes(prompt, n_blocks, salt=0):
    # an engine's own opaque block ids (vLLM: low 64 bits of a digest)
    return [((prompt * 1000003 + i) * 0x9E3779B97F4A7C15 + salt) % (1 << 64) for i in range(n_blocks)]


def vllm_stored_array(hashes, parent, tokens, block_size=BS, medium="GPU"):
    # array era, after `medium` (7 elements)
    return ["BlockStored", hashes, parent, tokens, block_size, None, medium]


def vllm_stored_map(hashes, parent, tokens, block_size=BS):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": block_size, "lora_id": None, "medium": "GPU",
            "lora_name": None}


def vllm_removed(hashes):
    return ["BlockRemoved", hashes, "GPU"]


def batch(events, rank=0):
    return msgpack.packb([time.time(), events, rank], use_bin_type=True)


def to_signed(h):
    return h - (1 << 64) if h >= (1 << 63) else h
