#!/usr/bin/python3
"""What a new user meets first.
  - Typing errors on the command line: every subcommand answers a mistyped flag with exit 2,
    the flag it nearly matched ("did you mean --speedup?") and where the help is; a flag that is
    no typo of any gets the pointer to --help alone, never a wild guess.
  - A router with no worker: requests wait for one only during the start-up window
    (min_initial_workers_wait_ms from the start), then are told why at once, on the routing
    API and the OpenAI front end alike.
Usage: test_cli.py <path to kvrouter>.
"""
import os
import subprocess
import sys
import time

from kvr_harness import Child, check, finish, free_ports

KVR = sys.argv[1]
TRACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                     "conversation_trace_300.jsonl")


def run(*args):
    p = subprocess.run([KVR] + list(args), capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=30)
    return p.returncode, p.stderr


def main():
    for sub, typo, want in (("mocker", "--speedupp", "--speedup"),
                            ("mocker", "--blok-size", "--block-size"),
                            ("replay", "--trce", "--trace"),
                            ("sim", "--polcy", "--policy"),
                            ("tokenize", "--tokeniser", "--tokenizer"),
                            ("trace gen", "--workloadd", "--workload")):
        rc, err = run(*sub.split(), typo, "1")
        check(f"{sub} {typo}: exit 2, '{want}' suggested, the help named",
              rc == 2 and f"did you mean {want}?" in err and f"kvrouter {sub} --help" in err,
              (rc, err))
    rc, err = run("serve", "--router-replica-sync")
    check("serve: a validation error names the flags as typed, not the setting names",
          rc == 2 and "--router-replica-sync" in err and "--nats-url" in err
          and "nats_url" not in err, (rc, err))
    rc, err = run("serve", "--block-sise", "16")
    check("serve --block-sise: the setting suggested", rc == 2 and "'--block-size'" in err,
          (rc, err))
    rc, err = run("mocker", "--zzzzzz", "1")
    check("mocker --zzzzzz: no guess, the help named",
          rc == 2 and "did you mean" not in err and "--help" in err, (rc, err))
    names()
    no_worker()
    finish()


def names():
    """One name per concept in every command: the listening port is --port (serve's --http-port
    is the same), the model --model, the policies --policy; the older spellings are still read,
    with a note naming the new one."""
    r = Child([KVR, "serve", "--port", "0", "--log-level", "warn"], "router (--port)")
    try:
        st, _ = r.call("GET", "/health")
        check("names: serve --port 0 listens on a free port", st == 200, st)
    finally:
        r.stop()
    ev = free_ports(1)  # an engine that never publishes: its registration names the model
    ix = Child([KVR, "indexer", "--port", "0", "--block-size", "16", "--model-name", "m",
                "--workers", f"1=tcp://127.0.0.1:{ev}"], "indexer (--model-name)")
    try:
        st, p = ix.call("GET", "/v1/index/partitions")
        check("names: indexer --model-name is read as --model (its partition is m)",
              st == 200 and "m" in str(p), (st, p))
    finally:
        ix.stop()
    check("names: ... with a note naming --model",
          "--model-name is read as --model" in ix.stderr(), ix.stderr()[-300:])
    rc, err = run("sim", "--trace", TRACE, "--requests", "20", "--workers", "2", "--policy", "kv",
                  "--speedup", "2", "--json")
    check("names: sim --speedup is read as --rate-scale (the arrivals; the mocker's --speedup is "
          "its clock), with a note", rc == 0 and "--speedup is read as --rate-scale" in err,
          (rc, err))
    rc, err = run("demo", "--policies", "kv", "--workers", "0")
    check("names: demo --policies is read as --policy, with a note",
          "--policies is read as --policy" in err and "unknown option" not in err, (rc, err))


def no_worker():
    window = 5.0
    r = Child([KVR, "serve", "--http-port", "0", "--min-initial-workers-wait-ms",
               str(int(window * 1000))], "router")
    try:
        st, b = r.call("POST", "/v1/route", {"tokens": list(range(64))}, timeout=30)
        check("no worker: a request in the start-up window waits for it, then says so",
              st == 503 and "min_initial_workers" in b["error"]["message"], (st, b))
        for path, body in (("/v1/route", {"tokens": list(range(64))}),
                           ("/v1/completions", {"model": "m", "prompt": [1, 2, 3]})):
            t = time.monotonic()
            st, b = r.call("POST", path, body, timeout=30)
            took = time.monotonic() - t
            check(f"no worker: {path} after the window is answered at once, saying why",
                  st == 503 and "no worker is registered" in b["error"]["message"]
                  and took < window / 2, (st, b, took))
    finally:
        r.stop()


if __name__ == "__main__":
    main()
