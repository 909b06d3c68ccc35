#!/usr/bin/python3
"""What a production router ships for its operators, checked against real processes:
deploy/prometheus/rules.yml (recording rules and alerts), tests/deploy/rules_test.yml (their
promtool unit tests), the Grafana dashboards in deploy/grafana/ and docs/operations.md.
  - promtool_check: `promtool check rules` finds the rules file clean;
  - promtool_test: `promtool test rules` passes, and every alert has a case where it fires and
    one where it does not;
  - static: every dashboard has schemaVersion >= 36, the ${DS_PROMETHEUS} datasource variable,
    a unit and a description on every panel, Grafana variables used only as `=~"$var"`
    matchers of variables it defines; docs/operations.md names every dashboard and every panel,
    and has a section (an anchor) per alert;
  - live: two fleets on loopback, scraped by a real Prometheus (1 s scrapes, the rules loaded):
    an aggregated one (two `kvrouter mocker`s with KV events and replay behind a `kvrouter
    serve`) and a disaggregated one behind two router replicas (a nats-server, a prefill and a
    decode mocker in vLLM's pull convention, two `kvrouter serve --nats-url ...
    --router-replica-sync true`). Completions (streamed and not) go through every router's
    OpenAI front end, and a POST /v1/route to each. Then every PromQL expression of every
    panel of every dashboard (Grafana's $__rate_interval as 1m, template variables as `.*`) and
    every variable query must evaluate through Prometheus's HTTP API with at least one series;
    every metric a rule or a panel names must be one a router or engine exported; every rule is
    evaluated without error, and none is pending or firing on the healthy fleets.
Skipped, saying so, only when prometheus or promtool is not installed (Debian's `prometheus`
package, installed by scripts/install-deps.sh). Every wait polls an observable condition under
a bound. Usage: test_deploy.py <path to kvrouter>.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from kvr_harness import (Child, NatsServer, check, eventually, free_ports, run_scenarios,
                         with_free_ports, terminate)

KVR = sys.argv[1]
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "tests" / "deploy" / "rules_test.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = ("router-overview.json", "workers.json", "replicas.json", "disaggregation.json")
OPS_DOC = ROOT / "docs" / "operations.md"
BS = 16
# Grafana's own variables, as fixed values a query can take
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m",
                    "__range_s": "300", "__interval_ms": "15000"}

# Panels that must show a non-zero value on the test's fleets (not only a series of zeros): the
# traffic the test sends moves them. The others (errors, losses, queues) stay at 0 when healthy.
LIVE_PANELS = {
    "router-overview.json": (
        "Routing decisions/s by result", "Decisions whose chosen worker held part of the prompt",
        "KV hit ratio: predicted by the router vs reported by the engines",
        "Routing decision time p99 by stage", "Time to first token p50 / p99 by model",
        "Inter-token latency p50 / p99 by model", "Request duration p50 / p99 by model",
        "Front-end answers/s by status class", "KV events/s: applied and dropped",
        "Prefix index size", "Prefix index memory"),
    "workers.json": (
        "Index state per rank (now)", "Ranks by index state", "Blocks in the index per rank",
        "Prediction accuracy per rank", "Answers compared/s per rank, and drift flags"),
    "replicas.json": (
        "Replica sync lag p50 / p99", "Sync events/s", "Replicas seen", "NATS traffic",
        "NATS link and sync join"),
    "disaggregation.json": (
        "Prefill pool state", "Requests/s by how they were served", "Placements/s per pool",
        "Prompt tokens placed/s per pool", "Predicted hit ratio per pool",
        "Prefill leg duration p50 / p99", "Prefill answers/s by outcome"),
}

PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus"
                                            if os.path.exists("/usr/bin/prometheus") else None)
PROMTOOL = shutil.which("promtool") or ("/usr/bin/promtool"
                                        if os.path.exists("/usr/bin/promtool") else None)


def alert_names():
    """The alert names of the rules file, in order (a line `- alert: Name`)."""
    return re.findall(r"^\s*-\s*alert:\s*(\w+)\s*$", RULES.read_text(), re.M)


def load_dashboards():
    return {name: json.loads((GRAFANA / name).read_text()) for name in DASHBOARDS}


def panels_of(dash):
    """Every panel, rows' nested panels included, rows themselves left out."""
    out = []
    for p in dash.get("panels", []):
        if p.get("type") == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute(expr, values=None):
    """expr with Grafana's variables replaced: builtins by fixed ranges, template variables
    by `values` (name -> regex; default `.*`, what "All" means with allValue `.*`)."""
    values = values or {}

    def sub(m):
        name = m.group(1) or m.group(2)
        if name in GRAFANA_BUILTINS:
            return GRAFANA_BUILTINS[name]
        return values.get(name, ".*")
    return VAR_RE.sub(sub, expr)


# ---- promtool --------------------------------------------------------------------------------

def scenario_promtool_check():
    p = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True,
                       timeout=60)
    out = p.stdout + p.stderr
    check("promtool check rules: clean", p.returncode == 0 and "SUCCESS" in out, out[-3000:])
    n = re.search(r"SUCCESS: (\d+) rules found", out)
    print(f"    promtool check rules: {n.group(1) if n else '?'} rules, "
          f"{len(alert_names())} alerts", flush=True)


def scenario_promtool_test():
    p = subprocess.run([PROMTOOL, "test", "rules", str(RULES_TEST)], capture_output=True,
                       text=True, timeout=120, cwd=str(ROOT))
    out = p.stdout + p.stderr
    check("promtool test rules: passes", p.returncode == 0 and "SUCCESS" in out, out[-4000:])
    text = RULES_TEST.read_text()
    for a in alert_names():
        fires = re.search(rf"^\s*-?\s*name: {a} fires\s*$", text, re.M)
        quiet = re.search(rf"^\s*-?\s*name: {a} stays quiet\s*$", text, re.M)
        check(f"rules_test.yml: {a} has a case where it fires and one where it does not",
              fires is not None and quiet is not None)


# ---- static checks ---------------------------------------------------------------------------

def slug(heading):
    """GitHub's anchor for a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def doc_anchors(text):
    anchors = {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}
    anchors |= set(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    return anchors


def scenario_static():
    dashes = load_dashboards()
    uids = [d.get("uid") for d in dashes.values()]
    check("dashboards: distinct uids", len(set(uids)) == len(uids), uids)
    doc = OPS_DOC.read_text()
    for name, d in dashes.items():
        check(f"{name}: schemaVersion >= 36", d.get("schemaVersion", 0) >= 36,
              d.get("schemaVersion"))
        tvars = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
        ds = tvars.get("DS_PROMETHEUS", {})
        check(f"{name}: a Prometheus datasource variable DS_PROMETHEUS",
              ds.get("type") == "datasource" and ds.get("query") == "prometheus", ds)
        for v in tvars.values():
            if v.get("type") == "query":
                check(f"{name}: variable {v['name']} reads ${{DS_PROMETHEUS}} and means .* for All",
                      v.get("datasource", {}).get("uid") == "${DS_PROMETHEUS}"
                      and v.get("allValue") == ".*", v)
        check(f"{name}: named in docs/operations.md", name in doc)
        for p in panels_of(d):
            where = f"{name} / {p.get('title')!r}"
            check(f"{where}: has a description", len(p.get("description", "")) >= 20)
            unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            check(f"{where}: has a unit", bool(unit), p.get("fieldConfig"))
            check(f"{where}: reads ${{DS_PROMETHEUS}}",
                  p.get("datasource", {}).get("uid") == "${DS_PROMETHEUS}" and
                  all(t.get("datasource", {}).get("uid") == "${DS_PROMETHEUS}"
                      for t in p.get("targets", [])))
            check(f"{where}: has PromQL targets",
                  len(p.get("targets", [])) >= 1 and all(t.get("expr") for t in p["targets"]))
            check(f"{where}: described in docs/operations.md", p.get("title", "") in doc)
            for t in p.get("targets", []):
                for m in VAR_RE.finditer(t["expr"]):
                    v = m.group(1) or m.group(2)
                    if v in GRAFANA_BUILTINS:
                        continue
                    ok = v in tvars and re.search(r'=~"\$\{?' + v + r'\}?"', t["expr"])
                    check(f"{where}: ${v} is a defined variable used as a =~ matcher",
                          bool(ok), t["expr"])
    anchors = doc_anchors(doc)
    for m in re.finditer(r"runbook:\s*(\S+)", RULES.read_text()):
        path, _, anchor = m.group(1).partition("#")
        check(f"runbook {m.group(1)}: points at docs/operations.md",
              path == "docs/operations.md" and anchor != "")
        check(f"runbook {m.group(1)}: the anchor exists in docs/operations.md", anchor in anchors)


# ---- the live fleets and Prometheus ----------------------------------------------------------

def mocker(name, *extra, replay=True):
    def start(ev, rp):
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}"}
        if replay:
            cfg["replay_endpoint"] = f"tcp://*:{rp}"
        return Child([KVR, "mocker", "--host", "127.0.0.1", "--port", "0", "--model", "m",
                      "--block-size", BS, "--speedup", "100", "--kv-events-config",
                      json.dumps(cfg)] + [str(a) for a in extra], f"mocker {name}")
    (ev, rp), m = with_free_ports(start, 1, 1)
    m.spec = f"url={m.url},events=tcp://127.0.0.1:{ev}" + \
        (f",replay=tcp://127.0.0.1:{rp}" if replay else "")
    return m


def subscribed(*ms):
    return all(eventually(lambda: (m.metric("kvr_mocker_kv_event_subscribers") or 0) >= 1,
                          timeout=15) for m in ms)


class Prometheus:
    """A real Prometheus on a free loopback port, its config and TSDB in a temporary
    directory; stopped with SIGTERM."""

    def __init__(self, config):
        self.dir = tempfile.mkdtemp(prefix="kvr-prom-")
        with open(os.path.join(self.dir, "prometheus.yml"), "w") as f:
            f.write(config)
        self.proc = None
        for _ in range(8):
            self.port = free_ports(1)
            self.url = f"http://127.0.0.1:{self.port}"
            self.log = open(os.path.join(self.dir, "prometheus.log"), "wb")
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.dir}/prometheus.yml",
                 f"--storage.tsdb.path={self.dir}/data",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
            if eventually(lambda: self.proc.poll() is not None or self.ready(), timeout=30) \
                    and self.proc.poll() is None:
                return
            self.proc.wait(timeout=10)
            self.log.close()
            if "address already in use" not in self.log_text():
                raise RuntimeError("prometheus did not start: " + self.log_text()[-2000:])
        raise RuntimeError("prometheus: no free port")

    def log_text(self):
        with open(os.path.join(self.dir, "prometheus.log"), "rb") as f:
            return f.read().decode(errors="replace")

    def ready(self):
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def api(self, path, **params):
        """(HTTP status, parsed JSON) of a GET on the HTTP API."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=20) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read())
            except ValueError:
                return e.code, {"status": "error", "error": str(e)}

    def query(self, expr):
        return self.api("query", query=expr)

    def stop(self):
        if self.proc is not None:
            terminate(self.proc, "prometheus")
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def traffic(r, seed, n=4):
    """Completions through r's front end, streamed (with usage) and not, each prompt twice
    (the second finds the first's blocks), and one POST /v1/route (booked, then freed)."""
    ok = True
    for i in range(n):
        toks = [(seed * 7919 + i * 131 + k) % 30000 + 1 for k in range(4 * BS + 5)]
        for stream in (False, True):
            body = {"model": "m", "prompt": toks, "max_tokens": 4}
            if stream:
                body.update(stream=True, stream_options={"include_usage": True})
            st, _, raw = r.request("POST", "/v1/completions", body)
            ok = ok and st == 200
    st, rt = r.call("POST", "/v1/route", {"tokens": list(range(seed, seed + 3 * BS))})
    ok = ok and st == 200
    if st == 200:
        ok = ok and r.call("DELETE", f"/v1/requests/{rt['request_id']}")[0] == 200
    return ok


def scrapes(prom, job, n_targets, at_least):
    """True once every target of job was scraped up at least `at_least` times in the last
    minute."""
    st, body = prom.query(f'count_over_time(up{{job="{job}"}}[1m]) and up{{job="{job}"}} == 1')
    if st != 200 or body.get("status") != "success":
        return False
    res = body["data"]["result"]
    return len(res) == n_targets and all(float(x["value"][1]) >= at_least for x in res)


def scrape_count(prom, job):
    st, body = prom.query(f'min(count_over_time(up{{job="{job}"}}[1m]))')
    res = body.get("data", {}).get("result", []) if st == 200 else []
    return int(float(res[0]["value"][1])) if res else 0


def metric_names_in(expr):
    """Metric names an expression selects (identifiers followed by { or [ or standing as a
    selector), with recording-rule names (kvr:...) left out."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    names = set()
    for m in re.finditer(r"(?<![\w:$])([a-zA-Z_][\w:]*)\s*(\{|\[)", expr):
        names.add(m.group(1))
    keywords = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                "unless", "offset", "bool"}
    return {n for n in names if n not in keywords and not n.startswith("kvr:")}


def scenario_live():
    t0 = time.monotonic()
    # the aggregated fleet
    a1, a2 = mocker("a1"), mocker("a2")
    ra = Child([KVR, "serve", "--http-port", "0", "--block-size", BS, "--log-level", "warn",
                "--worker", f"id=1,{a1.spec},model=m", "--worker", f"id=2,{a2.spec},model=m"],
               "router aggregated")
    # the disaggregated fleet behind two replicas
    nats = NatsServer()
    pf = mocker("prefill", "--role", "prefill", "--kv-transfer", "pull", replay=False)
    dc = mocker("decode", "--role", "decode", "--kv-transfer", "pull", replay=False)
    common = ["--block-size", BS, "--log-level", "warn", "--nats-url", nats.url,
              "--router-replica-sync", "true",
              "--worker", f"id=11,{pf.spec},role=prefill,model=m",
              "--worker", f"id=13,{dc.spec},role=decode,model=m"]
    rb1 = Child([KVR, "serve", "--http-port", "0"] + [str(x) for x in common], "replica 1")
    rb2 = Child([KVR, "serve", "--http-port", "0"] + [str(x) for x in common], "replica 2")
    routers, engines = [ra, rb1, rb2], [a1, a2, pf, dc]
    prom = None
    try:
        check("live: every router subscribed to its engines' KV events", subscribed(*engines))
        check("live: every router ready (the replicas joined)",
              eventually(lambda: all(r.call("GET", "/ready")[0] == 200 for r in routers), 20))
        check("live: the replicas see each other",
              eventually(lambda: rb1.metric("kvr_replicas_peers") == 1
                         and rb2.metric("kvr_replicas_peers") == 1, 15))
        check("live: first round of requests answered 200",
              all(traffic(r, 100 + i) for i, r in enumerate(routers)))
        print(f"    fleets up and first requests served: {time.monotonic() - t0:.1f} s",
              flush=True)
        targets = lambda cs: ", ".join(f'"{c.addr}"' for c in cs)  # noqa: E731
        config = f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {RULES}
scrape_configs:
  - job_name: kvrouter
    static_configs:
      - targets: [{targets([ra])}]
        labels: {{fleet: aggregated}}
      - targets: [{targets([rb1, rb2])}]
        labels: {{fleet: disaggregated-replicas}}
  - job_name: engines
    static_configs:
      - targets: [{targets(engines)}]
"""
        prom = Prometheus(config)
        print(f"    prometheus ready: {time.monotonic() - t0:.1f} s", flush=True)
        check("live: prometheus scraped every router and engine twice",
              eventually(lambda: scrapes(prom, "kvrouter", 3, 2)
                         and scrapes(prom, "engines", 4, 2), timeout=30),
              prom.query('up')[1])
        print(f"    two scrapes of every target: {time.monotonic() - t0:.1f} s", flush=True)
        check("live: second round of requests answered 200",
              all(traffic(r, 200 + i) for i, r in enumerate(routers)))
        base = scrape_count(prom, "kvrouter")
        check("live: two more scrapes after the second round",
              eventually(lambda: scrape_count(prom, "kvrouter") >= base + 2, timeout=20))
        print(f"    scraped (about {scrape_count(prom, 'kvrouter')} times): "
              f"{time.monotonic() - t0:.1f} s", flush=True)

        st, names = prom.api("label/__name__/values")
        exported = set(names.get("data", [])) if st == 200 else set()
        check("live: Prometheus lists the exported metric names", len(exported) > 100,
              len(exported))

        # every panel's every expression, and every variable query, with data
        n_expr, only_b = 0, []
        dashes = load_dashboards()
        for name, titles in LIVE_PANELS.items():
            known = {p["title"] for p in panels_of(dashes[name])}
            for t in titles:
                check(f"{name}: LIVE_PANELS names a panel it has: {t!r}", t in known)
        for name, d in dashes.items():
            for v in d.get("templating", {}).get("list", []):
                if v.get("type") != "query":
                    continue
                q = v["definition"]
                m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
                check(f"{name}: variable {v['name']}: a label_values(metric, label) query",
                      m is not None, q)
                if m:
                    expr = substitute(f"count by ({m.group(2)}) ({m.group(1)})")
                    st, body = prom.query(expr)
                    check(f"{name}: variable {v['name']} has values ({expr})",
                          st == 200 and body.get("status") == "success"
                          and len(body["data"]["result"]) > 0, body)
            for p in panels_of(d):
                nonzero = False
                for t in p.get("targets", []):
                    expr = substitute(t["expr"])
                    n_expr += 1
                    st, body = prom.query(expr)
                    res = body.get("data", {}).get("result", []) if st == 200 else []
                    check(f"{name} / panel {p['title']!r} / {t['refId']}: evaluates "
                          f"with data: {expr}",
                          st == 200 and body.get("status") == "success" and len(res) > 0,
                          (st, body.get("error"), len(res)))
                    nonzero = nonzero or any(
                        x["value"][1] not in ("0", "NaN", "+Inf", "-Inf") for x in res)
                    for mn in metric_names_in(t["expr"]):
                        check(f"{name} / panel {p['title']!r}: {mn} is exported", mn in exported)
                    # which expressions have data only from the replica/disaggregated fleet
                    sta, ba = prom.query(substitute(t["expr"], {"instance": ra.addr}))
                    if "$instance" in t["expr"] and sta == 200 and not ba["data"]["result"]:
                        only_b.append(f"{name} / {p['title']} ({t['refId']})")
                if p["title"] in LIVE_PANELS.get(name, ()):
                    check(f"{name} / panel {p['title']!r}: shows a non-zero value on the test's "
                          f"fleets", nonzero)
        print(f"    {n_expr} panel expressions evaluated with data; {len(only_b)} have it only "
              f"from the replica/disaggregated fleet: {', '.join(only_b)}", flush=True)

        # every rule: names real metrics, evaluated without error, nothing pending or firing
        check("live: every alert group evaluated once",
              eventually(lambda: all(g["rules"] and all(r.get("lastEvaluation", "").startswith(
                  "0001") is False for r in g["rules"])
                  for g in prom.api("rules")[1]["data"]["groups"]
                  if g["name"] != "kvrouter-recording"), timeout=15))
        st, body = prom.api("rules")
        groups = body["data"]["groups"] if st == 200 else []
        rules = [r for g in groups for r in g["rules"]]
        n_alerts = sum(1 for r in rules if r["type"] == "alerting")
        check("live: Prometheus loaded every alert", n_alerts == len(alert_names()),
              (n_alerts, len(alert_names())))
        for r in rules:
            what = r["name"]
            check(f"rule {what}: evaluates without error", r.get("health") != "err",
                  r.get("lastError"))
            st, qb = prom.query(r["query"])
            check(f"rule {what}: its expression runs", st == 200 and qb.get("status") == "success",
                  qb.get("error"))
            for mn in metric_names_in(r["query"]):
                check(f"rule {what}: {mn} is a metric the router exports", mn in exported)
            if r["type"] == "alerting":
                check(f"alert {what}: has a severity, a summary, a description and a runbook",
                      r["labels"].get("severity") in ("critical", "warning", "info")
                      and all(r["annotations"].get(k) for k in ("summary", "description",
                                                                "runbook")), r)
                check(f"alert {what}: quiet on the healthy fleets", not r.get("alerts"),
                      r.get("alerts"))
        print(f"    {len(rules)} rules checked: {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        if prom is not None:
            prom.stop()
        for c in routers + engines:
            c.stop()
        nats.stop()


if __name__ == "__main__":
    if PROMETHEUS is None or PROMTOOL is None:
        print("SKIPPED: test_deploy needs Debian's prometheus package (prometheus and promtool; "
              "scripts/install-deps.sh installs it): "
              f"prometheus {'found' if PROMETHEUS else 'missing'}, "
              f"promtool {'found' if PROMTOOL else 'missing'}", flush=True)
        raise SystemExit(0)
    run_scenarios([("promtool_check", scenario_promtool_check),
                   ("promtool_test", scenario_promtool_test),
                   ("static", scenario_static),
                   ("live", scenario_live)], 0)
