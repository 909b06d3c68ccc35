#!/usr/bin/python3
"""A scripted engine KV-event publisher for the router's transport tests.

It speaks the wire protocol vLLM and SGLang use, written independently of the C code:
a PUB socket (an XPUB, so it can tell when a subscriber has joined) sending [topic, seq (8 bytes big-endian), payload] and a ROUTER replay socket
answering [identity, "", start_seq (8 bytes BE)] with [identity, "", seq, payload] per kept
batch from start_seq on, then [identity, "", ff x 8, ""].

Both sockets bind to ephemeral loopback ports, printed first as "pub <endpoint>" and
"replay <endpoint>". Then it obeys one command per stdin line and answers "ok" to each:
  send <seq> <hex>   publish a batch and keep it for replay
  keep <seq> <hex>   keep it for replay only (the live message is "lost")
  late <seq> <hex>   publish a batch kept before (its live copy arrives after a replay
                     brought it)
  frames <n>         publish a malformed message of n frames (n != 3)
  shortseq           publish a 3-frame message whose seq frame has 7 bytes
  trim <n>           keep only the newest n batches
  clear              forget every kept batch (a restarted engine)
  mute               stop answering replay requests
  waitsub            wait (up to 10 s) until a subscription has arrived since the last
                     waitsub; answers "ok" or "nosub" (a first subscriber only: libzmq
                     4.3 does not pass on a subscription resent by a reconnecting SUB)
  disconnect         close the PUB socket and bind a new one on the same port (the
                     subscriber's connection drops; it reconnects by itself)
  hold               queue replay requests unanswered until `release`
  release            answer the queued requests (from what is kept then), and answer again
  quit
"""
import struct
import sys
import threading

import zmq

END = b"\xff" * 8


def main():
    ctx = zmq.Context()
    def open_pub(addr):
        s = ctx.socket(zmq.XPUB)
        s.setsockopt(zmq.LINGER, 0)
        s.bind(addr)
        return s

    pub = open_pub("tcp://127.0.0.1:*")
    pub_addr = pub.getsockopt(zmq.LAST_ENDPOINT).decode()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")
    kept = []  # (seq, payload), oldest first
    lock = threading.Lock()
    state = {"mute": False, "stop": False, "hold": False}
    waiting = []  # (identity, start) of held requests

    def answer(ident, start):
        with lock:
            batch = [(s, p) for s, p in kept if s >= start]
        for s, p in batch:
            router.send_multipart([ident, b"", struct.pack(">Q", s), p])
        router.send_multipart([ident, b"", END, b""])

    def serve_replay():
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        while not state["stop"]:
            with lock:
                todo = [] if state["hold"] else waiting[:]
                if todo:
                    waiting.clear()
            for ident, start in todo:
                answer(ident, start)
            if not poller.poll(20):
                continue
            frames = router.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                continue
            if state["mute"]:
                continue
            with lock:
                waiting.append((frames[0], struct.unpack(">Q", frames[2])[0]))

    thread = threading.Thread(target=serve_replay, daemon=True)
    thread.start()
    print("pub", pub_addr, flush=True)
    print("replay", router.getsockopt(zmq.LAST_ENDPOINT).decode(), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd = words[0]
        if cmd in ("send", "keep"):
            seq, payload = int(words[1]), bytes.fromhex(words[2]) if len(words) > 2 else b""
            with lock:
                kept.append((seq, payload))
            if cmd == "send":
                pub.send_multipart([b"", struct.pack(">Q", seq), payload])
        elif cmd == "late":
            seq, payload = int(words[1]), bytes.fromhex(words[2]) if len(words) > 2 else b""
            pub.send_multipart([b"", struct.pack(">Q", seq), payload])
        elif cmd == "frames":
            pub.send_multipart([b"x"] * int(words[1]))
        elif cmd == "shortseq":
            pub.send_multipart([b"", b"\x00" * 7, b"payload"])
        elif cmd == "trim":
            with lock:
                del kept[: max(0, len(kept) - int(words[1]))]
        elif cmd == "clear":
            with lock:
                kept.clear()
        elif cmd == "mute":
            state["mute"] = True
        elif cmd in ("hold", "release"):
            with lock:
                state["hold"] = cmd == "hold"
        elif cmd == "waitsub":
            if not pub.poll(10000):
                print("nosub", flush=True)
                continue
            while pub.poll(0):
                pub.recv()  # subscription messages: b"\x01" + topic
        elif cmd == "disconnect":
            pub.close()
            for _ in range(100):
                try:
                    pub = open_pub(pub_addr)
                    break
                except zmq.ZMQError:
                    threading.Event().wait(0.05)  # the port is released asynchronously
        elif cmd == "quit":
            break
        print("ok", flush=True)
    state["stop"] = True
    thread.join()
    pub.close()
    router.close()
    ctx.term()


if __name__ == "__main__":
    main()
