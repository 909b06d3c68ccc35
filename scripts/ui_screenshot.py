#!/usr/bin/python3
"""ui_screenshot.py: the README's picture of the live view, from a real `kvrouter demo` run.

Runs `kvrouter demo --policy kv --keep-up` (4 mockers and a router on loopback replaying the
conversation trace), waits for the run to end and the router to stay up, takes a screenshot
of its /ui with headless Chromium, then stops the demo (SIGINT: it stops everything it
started).

Usage: ui_screenshot.py KVROUTER OUT.png [--width 1280] [--height 1500]
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("kvrouter")
ap.add_argument("out")
ap.add_argument("--width", type=int, default=1280)
ap.add_argument("--height", type=int, default=1500)
args = ap.parse_args()

demo = subprocess.Popen([args.kvrouter, "demo", "--policy", "kv", "--keep-up"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
url = None
try:
    deadline = time.monotonic() + 600
    for line in demo.stderr:
        sys.stderr.write(line)
        m = re.search(r"still up: its live view at (\S+/ui)", line)
        if m:
            url = m.group(1)
            break
        if time.monotonic() > deadline:
            break
    if url is None:
        sys.exit("ui_screenshot: the demo never said its router is up")
    with tempfile.TemporaryDirectory() as profile:
        shot = subprocess.run(
            ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--window-size={args.width},{args.height}",
             "--virtual-time-budget=4000", f"--screenshot={os.path.abspath(args.out)}", url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if shot.returncode != 0 or not os.path.exists(args.out):
        sys.exit(f"ui_screenshot: chromium failed: {shot.stderr[-2000:]}")
    print(f"ui_screenshot: {args.out} from {url}")
finally:
    demo.send_signal(signal.SIGINT)
    try:
        demo.wait(timeout=60)
    except subprocess.TimeoutExpired:
        demo.kill()
