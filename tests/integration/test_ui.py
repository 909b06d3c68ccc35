#!/usr/bin/python3
"""The live page (GET /ui, src/ui/page.html) in a real headless Chromium, driven over the
DevTools protocol, against real processes on loopback: two `kvrouter mocker`s with KV events
behind a `kvrouter serve`.
  - live: the page loads with its Content-Security-Policy; a row per worker rank appears
    (data-worker, data-rank, data-state); a `kvrouter replay` of a short `kvrouter trace gen`
    trace runs, and the page's decisions/s (#cur-decisions_per_s) is above 0 within 2 s of the
    router's /v1/stats showing it; screenshots under that load at 1280x800 (light and dark)
    and at 390x844, a phone, where the body must not overflow sideways (the table scrolls in
    its own box); the figures the page prints for its newest point are the router's; Tab
    reaches the controls with a visible focus ring; `p` pauses the refresh (no new request)
    and `p` again resumes it; one mocker is killed: its row's state is `unreachable` or
    `fenced` within 2 s of /v1/workers saying so; it is started again on the same ports: its
    row is healthy again within 2 s of /v1/workers; the page logged no console error,
    exception or error-level log entry, every request it made went to the router's own
    origin, /v1/routers was never asked (no NATS), every answer was 200 and no banner shows.
    Then the router stops: the page's banner says the connection is lost.
  - auth: a router with --api-key-file (mode 0600) and no workers: /ui and /v1/stats without
    credentials are 401 with a `WWW-Authenticate: Basic` challenge, with the key as a Basic
    password or a bearer token 200, with a wrong password 401; Chromium sending Basic
    credentials (Network.setExtraHTTPHeaders) loads the page, its fetches are answered 200, it
    says the fleet is empty, shows no banner and logs no error; with a wrong key (the login
    prompt dismissed) the banner says 401. Then a fresh browser whose login prompt is answered
    once, for /ui: the page's fetches are answered 200 with no second prompt (the browser
    re-sends the credentials, which is why the page polls rather than using EventSource).
Every wait polls an observable condition under a bound; nothing sleeps to synchronise.
Screenshots go to the directory given as the second argument, else $KVR_UI_SCREENSHOT_DIR,
else the directory of the kvrouter binary (the build directory); their paths are printed.
Skipped, saying so, only when Chromium (/usr/bin/chromium) or python3-websocket is missing.
Usage: test_ui.py <path to kvrouter> [screenshot directory].
"""
import base64
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from kvr_harness import Child, NatsServer, check, eventually, run_scenarios, with_free_ports

KVR = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
SHOT_DIR = (sys.argv[2] if len(sys.argv) > 2 else
            os.environ.get("KVR_UI_SCREENSHOT_DIR") or
            (os.path.dirname(KVR) if KVR else "."))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BS = 16
HEALTHY_NOT = ("unreachable", "fenced", "error")  # a healthy rank is in none of these
try:
    import websocket  # Debian's python3-websocket
except ImportError:
    websocket = None


# ---- a headless Chromium over the DevTools protocol -------------------------------------------

class Browser:
    """Chromium, headless, with a throwaway profile; one page target driven over its DevTools
    websocket. Every event received is kept (self.events, under self.lock)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kvr-chromium-")
        self.log = open(os.path.join(self.dir, "chromium.log"), "wb")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-port=0", f"--user-data-dir={self.dir}", "--no-first-run",
             "--disable-dev-shm-usage", "--no-default-browser-check", "--disable-crash-reporter",
             "--disable-extensions", "--disable-sync", "--disable-background-networking",
             "--disable-component-update", "--disable-default-apps", "--mute-audio",
             "--hide-scrollbars", "--window-size=1280,800", "about:blank"],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL,
            env=dict(os.environ, HOME=self.dir, XDG_CONFIG_HOME=self.dir,  # nothing written
                     XDG_CACHE_HOME=self.dir, TMPDIR=self.dir))          # outside it (its
        # singleton socket's folder too, which a killed Chromium leaves behind)
        self.ws = None
        self.events, self.lock = [], threading.Lock()
        self.pending, self.next_id = {}, 0
        self.credentials = None
        try:
            self._connect()
        except BaseException:
            self.close()
            raise

    def _port(self):
        try:
            with open(os.path.join(self.dir, "DevToolsActivePort")) as f:
                lines = f.read().split("\n")
            return int(lines[0]) if len(lines) >= 2 and lines[0].strip() else None
        except (OSError, ValueError):
            return None

    def _page_ws(self, port):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/json/list")
            targets = json.loads(c.getresponse().read())
            c.close()
        except (OSError, ValueError):
            return None
        pages = [t for t in targets if t.get("type") == "page"]
        return pages[0]["webSocketDebuggerUrl"] if pages else None

    def _connect(self):
        port = eventually(lambda: self.proc.poll() is not None or self._port(), timeout=30)
        if self.proc.poll() is not None or not port:
            raise RuntimeError("chromium did not start: " + self.log_text()[-2000:])
        url = eventually(lambda: self._page_ws(port), timeout=30)
        if not url:
            raise RuntimeError("chromium: no page target on port %d" % port)
        self.ws = websocket.create_connection(url, timeout=30, suppress_origin=True,
                                              enable_multithread=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while True:
            try:
                msg = json.loads(self.ws.recv())
            except Exception:  # noqa: BLE001 - the socket closed: wake every waiter
                with self.lock:
                    for box in self.pending.values():
                        box["done"].set()
                return
            with self.lock:
                if "id" in msg and msg["id"] in self.pending:
                    box = self.pending[msg["id"]]
                    box["msg"] = msg
                    box["done"].set()
                elif "method" in msg:
                    self.events.append(msg)
            if msg.get("method") == "Fetch.requestPaused":  # see answer_auth_prompts
                self._fire("Fetch.continueRequest", {"requestId": msg["params"]["requestId"]})
            elif msg.get("method") == "Fetch.authRequired":
                answer = {"response": "CancelAuth"}
                if self.credentials is not None:
                    answer = {"response": "ProvideCredentials", "username": self.credentials[0],
                              "password": self.credentials[1]}
                self._fire("Fetch.continueWithAuth", {"requestId": msg["params"]["requestId"],
                                                      "authChallengeResponse": answer})

    def _fire(self, method, params):
        """A command whose answer nobody waits for (from the reader thread)."""
        with self.lock:
            self.next_id += 1
            mid = self.next_id
        try:
            self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        except Exception:  # noqa: BLE001 - the browser is going away
            pass

    def answer_auth_prompts(self, credentials):
        """From now on every HTTP authentication prompt (the browser's login dialog, which
        headless Chromium does not have: a request challenged for Basic would wait forever) is
        answered: with credentials=(user, password) as a user typing them, with None as a user
        dismissing the dialog."""
        self.credentials = credentials
        self.send("Fetch.enable", {"handleAuthRequests": True, "patterns": [{"urlPattern": "*"}]})

    def log_text(self):
        self.log.flush()
        with open(os.path.join(self.dir, "chromium.log"), "rb") as f:
            return f.read().decode(errors="replace")

    def send(self, method, params=None, timeout=30):
        """The result of one DevTools command; raises on an error answer or no answer."""
        with self.lock:
            self.next_id += 1
            mid = self.next_id
            box = self.pending[mid] = {"done": threading.Event(), "msg": None}
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params or {}}))
        box["done"].wait(timeout)
        with self.lock:
            del self.pending[mid]
        msg = box["msg"]
        if msg is None:
            raise RuntimeError(f"DevTools {method}: no answer in {timeout} s")
        if "error" in msg:
            raise RuntimeError(f"DevTools {method}: {msg['error']}")
        return msg.get("result", {})

    def eval(self, expr):
        """The value of a JavaScript expression in the page (JSON-able), or raises."""
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"evaluate {expr[:80]!r}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def evented(self, *methods):
        with self.lock:
            return [e for e in self.events if e["method"] in methods]

    def goto(self, url):
        """Navigates and waits until the document has loaded."""
        self.send("Page.navigate", {"url": url})
        return eventually(lambda: self.eval("location.href") == url and
                          self.eval("document.readyState") == "complete", timeout=20)

    def key(self, key):
        """One key press (down, up) as a user's, to the focused element: a letter, or Tab."""
        letter = len(key) == 1
        base = {"key": key, "code": "Key" + key.upper() if letter else key,
                "windowsVirtualKeyCode": ord(key.upper()) if letter else 9}
        self.send("Input.dispatchKeyEvent", dict(base, type="keyDown", text=key if letter else ""))
        self.send("Input.dispatchKeyEvent", dict(base, type="keyUp"))

    def viewport(self, w, h, mobile=False):
        self.send("Emulation.setDeviceMetricsOverride", {"width": w, "height": h,
                                                         "deviceScaleFactor": 1,
                                                         "mobile": mobile})

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def close(self):
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- the page, read from the DOM --------------------------------------------------------------

PAGE_STATE = """(() => {
  const b = document.getElementById('banner');
  return {
    rows: [...document.querySelectorAll('#fleet-body tr[data-worker]')].map((tr) => ({
      worker: tr.dataset.worker, rank: tr.dataset.rank,
      state: (tr.querySelector('[data-state]') || {dataset: {}}).dataset.state,
      cells: [...tr.cells].map((c) => c.textContent)})),
    empty: (document.getElementById('fleet-empty') || {}).textContent || null,
    latest_t: document.getElementById('charts').dataset.latestT || null,
    cur: Object.fromEntries([...document.querySelectorAll('output[id^="cur-"]')].map(
      (o) => [o.id.slice(4), o.dataset.value])),
    banner: b.hidden ? null : {kind: b.dataset.kind, status: b.dataset.status, text: b.textContent},
    paused: !document.getElementById('paused-pill').hidden,
  };
})()"""


def page(b):
    try:
        return b.eval(PAGE_STATE)
    except RuntimeError:
        return None


def row_state(b, worker):
    p = page(b)
    rows = [r for r in (p or {}).get("rows", []) if r["worker"] == str(worker)]
    return rows[0]["state"] if rows else None


def router_state(r, worker):
    st, w = r.call("GET", "/v1/workers", timeout=5)
    if st != 200:
        return None
    for wk in w.get("workers", []):
        if wk["worker_id"] == worker:
            return wk["ranks"][0].get("state")
    return None


def race(router_has, page_has, timeout):
    """Polls both conditions, each in its own thread, until each held once: (when the router
    first showed it, when the page first did), monotonic seconds, None for one that never did."""
    first = [None, None]

    def poll(i, cond):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if cond():
                    first[i] = time.monotonic()
                    return
            except Exception:  # noqa: BLE001 - a failed poll is a "not yet"
                pass
            time.sleep(0.05)
    threads = [threading.Thread(target=poll, args=(i, c), daemon=True)
               for i, c in enumerate((router_has, page_has))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    return first[0], first[1]


def lag_ok(what, t_router, t_page, bound=2.0):
    """The page showed it at most `bound` s after the router did (printed)."""
    if t_router is None or t_page is None:
        return False
    print(f"    {what}: on the page {t_page - t_router:+.2f} s after the router", flush=True)
    return t_page - t_router <= bound


def console_problems(b):
    """Console errors, uncaught exceptions and error-level log entries the page produced."""
    out = []
    for e in b.evented("Runtime.exceptionThrown", "Runtime.consoleAPICalled", "Log.entryAdded"):
        p = e["params"]
        if e["method"] == "Runtime.exceptionThrown":
            out.append(("exception", p["exceptionDetails"].get("exception", {}).get(
                "description", p["exceptionDetails"].get("text"))))
        elif e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
            out.append(("console." + p["type"], [a.get("value", a.get("description"))
                                                 for a in p.get("args", [])]))
        elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append(("log", p["entry"].get("text"), p["entry"].get("url")))
    return out


def requests_made(b):
    return [e["params"]["request"]["url"] for e in b.evented("Network.requestWillBeSent")]


def statuses(b):
    return [(e["params"]["response"]["url"], e["params"]["response"]["status"])
            for e in b.evented("Network.responseReceived")]


def open_browser():
    b = Browser()
    for domain in ("Runtime", "Log", "Network", "Page"):
        b.send(domain + ".enable")
    b.viewport(1280, 800)
    return b


# ---- the processes ----------------------------------------------------------------------------

def mocker(name, ports=None):
    """A mocker with KV events (and a replay socket); ports=(http, events, replay) to start one
    again on the same addresses."""
    def start(ev, rp, http_port=0):
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": f"tcp://*:{ev}", "replay_endpoint": f"tcp://*:{rp}"}
        m = Child([KVR, "mocker", "--host", "127.0.0.1", "--port", str(http_port), "--model", "m",
                   "--block-size", str(BS), "--num-gpu-blocks", "2048", "--speedup", "20",
                   "--kv-events-config", json.dumps(cfg)], f"mocker {name}")
        m.ports = (m.port, ev, rp)
        m.spec = f"url={m.url},events=tcp://127.0.0.1:{ev},replay=tcp://127.0.0.1:{rp}"
        return m
    if ports is not None:
        return start(ports[1], ports[2], ports[0])
    return with_free_ports(start, 1, 1)[1]


def subscribed(m):
    return eventually(lambda: (m.metric("kvr_mocker_kv_event_subscribers") or 0) >= 1, 15)


def serve(*args, what="router"):
    return Child([KVR, "serve", "--http-port", "0", "--block-size", str(BS), "--log-level",
                  "warn", "--seed", "5"] + [str(a) for a in args], what)


def basic(user, password):
    """An Authorization header's value with HTTP Basic credentials."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def screenshot(b, name):
    os.makedirs(SHOT_DIR, exist_ok=True)
    path = b.screenshot(os.path.abspath(os.path.join(SHOT_DIR, name)))
    print(f"    screenshot: {path}", flush=True)
    return path


# ---- scenarios --------------------------------------------------------------------------------

def scenario_live():
    tmp = tempfile.mkdtemp(prefix="kvr-ui-")
    a, bm = mocker("a"), mocker("b")
    r = serve("--health-interval-ms", 250, "--health-failures", 2,
              "--worker", f"id=1,{a.spec},model=m", "--worker", f"id=2,{bm.spec},model=m")
    b, replay, again = None, None, None
    try:
        check("live: the router subscribed to both engines", subscribed(a) and subscribed(bm))
        b = open_browser()
        origin = f"http://127.0.0.1:{r.port}"
        check("live: the page loads", b.goto(origin + "/ui"))
        doc = [e["params"]["response"] for e in b.evented("Network.responseReceived")
               if e["params"]["type"] == "Document"]
        headers = {k.lower(): v for k, v in (doc[0]["headers"] if doc else {}).items()}
        check("live: /ui is text/html with the strict CSP",
              doc and doc[0]["status"] == 200 and headers.get("content-type", "").startswith(
                  "text/html") and "connect-src 'self'" in headers.get(
                  "content-security-policy", "") and "default-src 'none'" in headers.get(
                  "content-security-policy", ""), doc[:1])
        rows = eventually(lambda: {(x["worker"], x["rank"]) for x in (page(b) or {}).get(
            "rows", [])} == {("1", "0"), ("2", "0")}, timeout=10)
        check("live: a row for each worker rank", rows, page(b))
        check("live: the router's mode and version in the header", eventually(
            lambda: b.eval("document.getElementById('hdr-router').textContent").startswith(
                "kv, ") and b.eval("document.getElementById('hdr-version').textContent")
            not in ("", "-"), timeout=5))

        # load: a short chat trace replayed through the router's front end
        trace = os.path.join(tmp, "chat.jsonl")
        gen = subprocess.run([KVR, "trace", "gen", "--workload", "chat", "--rate", "4",
                              "--duration", "8", "--seed", "3", "--output", trace],
                             capture_output=True, text=True, timeout=60)
        check("live: trace gen", gen.returncode == 0 and os.path.getsize(trace) > 0, gen.stderr)
        replay = subprocess.Popen([KVR, "replay", "--url", r.url, "--trace", trace, "--quiet",
                                   "--json", "--timeout", "60"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def router_decides():
            st, s = r.call("GET", "/v1/stats", timeout=5)
            return st == 200 and any((p["decisions_per_s"] or 0) > 0 for p in s["points"])

        def page_decides():
            v = (page(b) or {}).get("cur", {}).get("decisions_per_s")
            return v not in (None, "") and float(v) > 0
        t_router, t_page = race(router_decides, page_decides, 30)
        check("live: decisions/s on the page > 0 within 2 s of /v1/stats",
              lag_ok("decisions/s > 0", t_router, t_page), (t_router, t_page))
        # screenshots under load, once the charts have a few seconds of it: a laptop (light,
        # dark), then a phone (no sideways overflow of the body)
        def seconds_of_load(n):
            st, s = r.call("GET", "/v1/stats", timeout=5)
            busy = [p["t"] for p in s.get("points", []) if (p["decisions_per_s"] or 0) > 0]
            return st == 200 and len(busy) >= n and int(page(b)["latest_t"] or 0) >= busy[n - 1]
        check("live: five seconds of load on the page", eventually(lambda: seconds_of_load(5),
                                                                    15))
        screenshot(b, "ui-1280x800.png")
        b.send("Emulation.setEmulatedMedia",
               {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        check("live: dark colours when the system prefers them", eventually(lambda: b.eval(
            "getComputedStyle(document.body).backgroundColor") == "rgb(13, 17, 23)", 3))
        screenshot(b, "ui-1280x800-dark.png")
        b.send("Emulation.setEmulatedMedia", {"features": []})
        b.viewport(390, 844, mobile=True)
        fit = eventually(lambda: b.eval(
            "document.documentElement.scrollWidth <= window.innerWidth && "
            "document.body.scrollWidth <= window.innerWidth && window.innerWidth === 390 && "
            "[...document.querySelectorAll('svg.plot')].every((s) => "  # the charts redrawn
            "s.viewBox.baseVal.width === Math.max(200, s.clientWidth))"), 5)
        check("live: at 390 px wide the body does not overflow sideways", fit, b.eval(
            "[document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]"))
        check("live: at 390 px the table scrolls in its own box", b.eval(
            "(() => { const w = document.getElementById('fleet');"
            " return getComputedStyle(w).overflowX === 'auto' && w.scrollWidth > w.clientWidth;"
            " })()"))
        screenshot(b, "ui-390x844.png")
        b.viewport(1280, 800)

        try:
            out, err = replay.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            replay.kill()
            out, err = replay.communicate()
        check("live: the replay ran without failures", replay.returncode == 0, err[-1500:])

        # the page prints the router's own figures for its newest point
        def same_as_router():
            p = page(b)
            if not p or not p["latest_t"]:
                return False
            t = int(p["latest_t"])
            st, s = r.call("GET", f"/v1/stats?since={t - 1}", timeout=5)
            pts = [q for q in s.get("points", []) if q["t"] == t] if st == 200 else []
            if not pts:
                return False
            for key in ("decisions_per_s", "in_flight", "hit_ratio_predicted", "ttft_p50_ms",
                        "kv_events_per_s", "errors_per_s"):
                shown, want = p["cur"].get(key), pts[0][key]
                if (shown in (None, "")) != (want is None):
                    return False
                if want is not None and abs(float(shown) - want) > 1e-9 * max(1, abs(want)):
                    return False
            return p
        shown = eventually(same_as_router, timeout=5)
        check("live: the current values are the router's newest point's", shown, page(b))
        check("live: TTFT and the predicted hit ratio known after the replay", eventually(
            lambda: all((page(b) or {}).get("cur", {}).get(k) not in (None, "")
                        for k in ("ttft_p50_ms", "hit_ratio_predicted")), timeout=5),
            page(b))

        # keyboard: Tab reaches the controls with a visible focus ring; p pauses, p resumes
        b.key("Tab")
        b.key("Tab")
        focus = b.eval("""(() => { const e = document.activeElement, cs = getComputedStyle(e);
            return {id: e.id, outline: cs.outlineStyle, width: cs.outlineWidth}; })()""")
        check("live: Tab reaches the pause button, with a visible focus ring",
              focus["id"] == "btn-pause" and focus["outline"] != "none" and
              focus["width"] not in ("0px", ""), focus)
        b.send("Runtime.evaluate", {"expression": "document.activeElement.blur()"})
        b.key("p")
        check("live: p pauses, and the header says so", eventually(
            lambda: (page(b) or {}).get("paused") and b.eval(
                "getComputedStyle(document.getElementById('paused-pill')).display") != "none",
            timeout=3))
        n0 = len([u for u in requests_made(b) if "/v1/stats" in u])
        t0 = time.monotonic()
        quiet = True
        while time.monotonic() - t0 < 2.5:  # measuring an absence: three refresh periods
            quiet = quiet and len([u for u in requests_made(b) if "/v1/stats" in u]) <= n0 + 1
            time.sleep(0.1)
        check("live: paused, no new /v1/stats request in 2.5 s", quiet)
        b.key("p")
        check("live: p resumes: a new /v1/stats request within 2 s", eventually(
            lambda: not page(b)["paused"] and b.eval(
                "getComputedStyle(document.getElementById('paused-pill')).display") == "none" and
            len([u for u in requests_made(b) if "/v1/stats" in u]) >= n0 + 2, timeout=2))

        # a worker dies: its row says so within 2 s of /v1/workers
        ports = bm.ports
        bm.kill()
        t_router, t_page = race(lambda: router_state(r, 2) in ("unreachable", "fenced"),
                                lambda: row_state(b, 2) in ("unreachable", "fenced"), 30)
        check("live: a dead worker's row is unreachable or fenced within 2 s of /v1/workers",
              lag_ok("worker down", t_router, t_page),
              (t_router, t_page, router_state(r, 2), row_state(b, 2)))
        check("live: the other worker's row stays healthy", row_state(b, 1) not in HEALTHY_NOT,
              row_state(b, 1))
        # ... and comes back on the same ports
        again = mocker("b again", ports)
        t_router, t_page = race(lambda: router_state(r, 2) not in HEALTHY_NOT + (None,),
                                lambda: row_state(b, 2) not in HEALTHY_NOT + (None,), 30)
        check("live: the restarted worker's row is healthy again within 2 s of /v1/workers",
              lag_ok("worker back", t_router, t_page),
              (t_router, t_page, router_state(r, 2), row_state(b, 2)))

        problems = console_problems(b)
        check("live: no console error, exception or failed load", not problems, problems)
        urls = requests_made(b)
        foreign = [u for u in urls if not u.startswith(origin + "/")]
        check("live: every request went to the router's own origin", urls and not foreign,
              foreign[:10])
        check("live: the page polled /v1/stats with since= and /v1/workers",
              any("/v1/stats?since=" in u for u in urls) and
              any(u.endswith("/v1/workers") for u in urls), urls[:10])
        check("live: /v1/routers never asked without replicas",
              not any("/v1/routers" in u for u in urls))
        bad = [x for x in statuses(b) if x[1] != 200]
        check("live: every answer the page got was 200", not bad, bad[:10])
        check("live: no banner on a healthy router", page(b)["banner"] is None, page(b)["banner"])

        # the router goes away: the banner says the connection is lost
        r.stop()
        lost = eventually(lambda: ((page(b) or {}).get("banner") or {}).get("kind") == "lost", 8)
        check("live: connection lost: the banner says so", lost, page(b))
    finally:
        if replay is not None and replay.poll() is None:
            replay.kill()
            replay.wait(timeout=10)
        if b is not None:
            b.close()
        for c in (r, a, bm, again):
            if c is not None:
                c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def scenario_replicas():
    """A disaggregated fleet (a prefill and a decode engine) behind two router replicas over a
    real nats-server: the page of one replica shows both pools' charts and the replicas panel
    with the other replica in its table."""
    nats = NatsServer()
    def engine(role):
        def start(ev):
            cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}"}
            m = Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "m",
                       "--block-size", str(BS), "--speedup", "20", "--role", role,
                       "--kv-transfer", "pull", "--kv-events-config", json.dumps(cfg)],
                      f"mocker {role}")
            m.spec = f"url={m.url},events=tcp://127.0.0.1:{ev},role={role},model=m"
            return m
        return with_free_ports(start, 1)[1]
    pf, dc = engine("prefill"), engine("decode")
    common = ["--nats-url", nats.url, "--router-replica-sync", "true",
              "--worker", f"id=11,{pf.spec}", "--worker", f"id=13,{dc.spec}"]
    r1, r2 = serve(*common, what="replica 1"), serve(*common, what="replica 2")
    b = None
    try:
        check("replicas: both engines subscribed", subscribed(pf) and subscribed(dc))
        check("replicas: the replicas see each other",
              eventually(lambda: r1.metric("kvr_replicas_peers") == 1
                         and r2.metric("kvr_replicas_peers") == 1, 20))
        rng = random.Random(11)
        def traffic(r, n):
            for _ in range(n):
                words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta")) for _ in
                                 range(80))
                st, _ = r.call("POST", "/v1/completions",
                               {"model": "m", "prompt": words, "max_tokens": 3}, timeout=30)
                if st != 200:
                    return False
            return True
        check("replicas: requests through both replicas answered 200",
              traffic(r1, 6) and traffic(r2, 3))
        b = open_browser()
        check("replicas: the page of replica 1 loads", b.goto(f"http://127.0.0.1:{r1.port}/ui"))
        shown = eventually(lambda: b.eval("!document.getElementById('pools-sec').hidden"), 10)
        check("replicas: both pools' charts shown (prefill and decode placed requests)", shown)
        cur = lambda: (page(b) or {}).get("cur", {})  # noqa: E731
        check("replicas: both pools' decisions on the page",
              eventually(lambda: "pool-prefill-decisions_per_s" in cur()
                         and "pool-decode-decisions_per_s" in cur(), 5), cur())
        panel = eventually(lambda: b.eval(
            "!document.getElementById('replicas-sec').hidden && "
            "document.querySelectorAll('#routers-body tr[data-router]').length === 1"), 10)
        check("replicas: the replicas panel lists the other replica", panel,
              b.eval("document.getElementById('replicas-sec').outerHTML.slice(0, 600)"))
        check("replicas: the page shows one peer, as /v1/stats says",
              eventually(lambda: cur().get("replicas-peers") in ("1", 1), 5), cur())
        st, routers = r1.call("GET", "/v1/routers")
        row = b.eval("document.querySelector('#routers-body tr[data-router]').dataset.router")
        check("replicas: the row is the other replica's id from /v1/routers",
              st == 200 and [x["router_id"] for x in routers.get("routers", [])] == [row],
              (routers, row))
        check("replicas: no console error", not console_problems(b), console_problems(b))
        origin = f"http://127.0.0.1:{r1.port}"
        check("replicas: every request to the router's own origin",
              all(u.startswith(origin + "/") for u in requests_made(b)), requests_made(b)[:10])
        screenshot(b, "ui-replicas-1280x800.png")
    finally:
        if b is not None:
            b.close()
        for c in (r1, r2, pf, dc):
            c.stop()
        nats.stop()


def scenario_auth():
    tmp = tempfile.mkdtemp(prefix="kvr-ui-auth-")
    key = "ui-test-" + base64.b16encode(os.urandom(8)).decode().lower()
    kf = os.path.join(tmp, "api.key")
    fd = os.open(kf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (key + "\n").encode())
    os.close(fd)
    r = serve("--api-key-file", kf, "--min-initial-workers", 0)
    b = None
    try:
        for path in ("/ui", "/v1/stats"):
            st, h, _ = r.request("GET", path)
            check(f"auth: {path} without credentials is 401 challenging for Basic",
                  st == 401 and any(v.lower().startswith("basic ")
                                    for v in h.get_all("WWW-Authenticate") or []),
                  (st, h.items()))
            st, _, _ = r.request("GET", path, headers={"Authorization": basic("op", key)})
            check(f"auth: {path} with the key as a Basic password is 200", st == 200, st)
            st, _, _ = r.request("GET", path, headers={"Authorization": "Bearer " + key})
            check(f"auth: {path} with the key as a bearer token is 200", st == 200, st)
            st, _, _ = r.request("GET", path, headers={"Authorization": basic("op", key + "x")})
            check(f"auth: {path} with a wrong password is 401", st == 401, st)
        b = open_browser()
        b.send("Network.setExtraHTTPHeaders", {"headers": {"Authorization": basic("op", key)}})
        origin = f"http://127.0.0.1:{r.port}"
        check("auth: the page loads with Basic credentials", b.goto(origin + "/ui"))
        empty = eventually(lambda: "empty" in ((page(b) or {}).get("empty") or ""), 10)
        check("auth: the page says the fleet is empty", empty, page(b))
        polled = eventually(lambda: sum(1 for u, st in statuses(b)
                                        if "/v1/stats" in u and st == 200) >= 2 and
                            any("/v1/workers" in u and st == 200 for u, st in statuses(b)), 10)
        check("auth: the page's fetches are answered 200", polled, statuses(b)[:10])
        check("auth: no banner", eventually(lambda: page(b)["banner"] is None, 3), page(b))
        check("auth: no console error", not console_problems(b), console_problems(b))
        check("auth: every request to the router's own origin",
              all(u.startswith(origin + "/") for u in requests_made(b)), requests_made(b)[:10])
        # a wrong key (the user dismisses the login prompt): the banner says 401
        b.answer_auth_prompts(None)
        b.send("Network.setExtraHTTPHeaders",
               {"headers": {"Authorization": basic("op", key + "-revoked")}})
        said = eventually(lambda: ((page(b) or {}).get("banner") or {}).get("status") == "401",
                          8)
        check("auth: with a wrong key the banner says 401", said and
              page(b)["banner"]["kind"] == "unauthorized", page(b))
        b.close()
        b = None
        # a browser of its own: the login prompt answered once, for /ui; fetch() re-sends
        b = open_browser()
        b.answer_auth_prompts(("op", key))
        check("auth: the page loads once the login prompt is answered", b.goto(origin + "/ui"))
        polled = eventually(lambda: sum(1 for u, st in statuses(b)
                                        if "/v1/stats" in u and st == 200) >= 3, 10)
        prompts = [e["params"]["request"]["url"] for e in b.evented("Fetch.authRequired")]
        check("auth: the browser re-sends the credentials: fetches answered 200, one prompt",
              polled and prompts == [origin + "/ui"] and
              all(st == 200 for u, st in statuses(b) if "/v1/" in u), (prompts, statuses(b)[:8]))
        check("auth: no banner once logged in", page(b)["banner"] is None, page(b))
    finally:
        if b is not None:
            b.close()
        r.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    missing = [what for what, ok in (("chromium", os.access(CHROMIUM, os.X_OK)),
                                     ("python3-websocket", websocket is not None)) if not ok]
    if missing:
        print(f"SKIP test_ui: {' and '.join(missing)} not installed (Debian packages chromium, "
              "python3-websocket)", flush=True)
        sys.exit(0)
    if KVR is None:
        sys.exit("usage: test_ui.py <path to kvrouter> [screenshot directory]")
    run_scenarios([("live", scenario_live), ("replicas", scenario_replicas),
                   ("auth", scenario_auth)], 5)
