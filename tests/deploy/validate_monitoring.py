#!/usr/bin/env python3
"""Checks the monitoring files offline: the Grafana dashboard (deploy/grafana/), the Prometheus
alert rules and configuration (deploy/prometheus/), against the metrics a real vramswapd
exports. No Prometheus server, no Grafana, no network beyond loopback.

1. Starts vramswapd (host backend, a small pool, metrics on 127.0.0.1) with one real client
   (session_worker) taking turns, scrapes /metrics while the client is attached, and lints the
   scrape with `promtool check metrics`.
2. Dashboard: parses as JSON; every panel has an id, a type, a title and a place on the
   24-column grid; every query names the data source variable; every expression parses as
   PromQL (as a recording rule, through `promtool check rules`, with Grafana's variables
   given values); every metric it names is one the daemon exported in that scrape.
3. Rules: `promtool check rules`, their unit tests (`promtool test rules`), `promtool check
   config` of the example configuration; each alert has a severity, a summary and a
   description; every metric an expression or an annotation's query names is exported,
   except those listed in CONDITIONAL (metrics that exist only where their feature is
   configured, which this daemon run does not configure).
4. Shows that the checks can fail: a dashboard naming an unknown metric, an expression that
   does not parse and a rule naming an unknown metric must each be refused, by name.

Exit 0 when all is well, 1 on a failure (each says what was expected), 77 (ctest's skip) when
PyYAML or promtool is missing: then the checks that need neither still run, and what was not
checked is said. scripts/install-deps.sh puts promtool (from Debian's prometheus package) in
build/tools/.
"""
import argparse
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

# Metrics that the rules may name but this daemon run does not export, and why.
CONDITIONAL = {}
# Prometheus's own series that the files may name.
PROMETHEUS_OWN = {"up"}
GRID_COLUMNS = 24
PANEL_TYPES = {"row", "stat", "timeseries", "heatmap", "gauge", "table", "bargauge", "text", "state-timeline"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset", "inf", "nan"}
# Values for Grafana's variables, so that an expression can be parsed as PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "${datasource}": "prometheus",
                     "$instance": ".*", "$UUID": ".*"}

failures = []


def fail(message):
    failures.append(message)
    print(f"FAIL: {message}")


# --- the daemon and its scrape ---------------------------------------------------------------

def scrape_real_daemon(vramswapd, session_worker):
    """The text of a /metrics scrape of a real vramswapd with one client attached."""
    work = tempfile.mkdtemp(prefix="vramswap-monitoring-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSWAP_")}
    env.update({"VRAMSWAP_BACKEND": "host", "VRAMSWAP_HOST_DEVICE_MEMORY": "64MiB", "VRAMSWAP_FRAME_SIZE": "2MiB",
                "VRAMSWAP_POOL_SIZE": "16MiB", "VRAMSWAP_RUNTIME_DIR": os.path.join(work, "run"),
                "VRAMSWAP_SHM_PREFIX": f"vsmon{os.getpid()}-", "VRAMSWAP_LOG": "info", "VRAMSWAP_SERVER": vramswapd,
                "VRAMSWAP_SWAP_DIR": work})
    err_path = os.path.join(work, "vramswapd.err")
    server = client = None
    try:
        with open(err_path, "w") as err:
            server = subprocess.Popen([vramswapd, "--foreground", "--metrics-port", "0", "--metrics-address", "127.0.0.1"],
                                      env=env, stdout=subprocess.DEVNULL, stderr=err)
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            with open(err_path) as f:
                m = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", f.read())
            if m:
                port = int(m.group(1))
            elif server.poll() is not None:
                break
            else:
                time.sleep(0.05)
        if port is None:
            with open(err_path) as f:
                raise RuntimeError(f"vramswapd logged no metrics URL within 30 s; its stderr:\n{f.read()}")
        url = f"http://127.0.0.1:{port}/metrics"
        client = subprocess.Popen([session_worker, str(4 << 20), "3", "7", "100"], env={**env, "VRAMSWAP_LOG": "warn"},
                                  stdout=subprocess.DEVNULL)
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url, timeout=10) as r:
                text = r.read().decode()
            if re.search(r'^vramswap_process_holding\{.*job_name="session_worker"', text, re.M) and \
                    re.search(r'^vramswap_lock_hold_seconds_count\{.*\} [1-9]', text, re.M):
                return text
            time.sleep(0.05)
        raise RuntimeError(f"no scrape of {url} showed the client attached after a turn within 30 s; the last:\n{text}")
    finally:
        for p in (client, server):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM if p is server else signal.SIGKILL)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(work, ignore_errors=True)


def exported_names(text):
    """Metric names a scrape exports: each family of a # TYPE line, a histogram's with its series."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(name)
        if kind == "histogram":
            names.update({name + "_bucket", name + "_sum", name + "_count"})
    return names


# --- PromQL ---------------------------------------------------------------------------------

def promql_metric_names(expr):
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    names = set()
    for m in re.finditer(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        if word in KEYWORDS or s[m.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def grafana_to_promql(expr):
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def promtool_parse(promtool, exprs, work):
    """Parse each (name, expression) as PromQL, as recording rules that promtool checks: all in
    one file, then, when that fails, one by one to name each that does not parse."""
    path = os.path.join(work, "parse-rules.json")  # JSON is YAML: no PyYAML needed

    def check(batch):
        with open(path, "w") as f:
            json.dump({"groups": [{"name": "parse", "rules": [{"record": "parse:check", "expr": e} for _, e in batch]}]}, f)
        r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        return r.returncode == 0, (r.stdout + r.stderr).strip()

    if check(exprs)[0]:
        return []
    errors = []
    for name, expr in exprs:
        good, out = check([(name, expr)])
        if not good:
            errors.append(f"{name}: does not parse as PromQL: {expr!r}: {out}")
    return errors or [f"promtool refused the expressions together, yet each alone: {check(exprs)[1]}"]


# --- the dashboard --------------------------------------------------------------------------

def dashboard_queries(dash):
    """(where, PromQL) of every panel target and every query variable."""
    queries = []
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var.get("query")
            q = q.get("query", "") if isinstance(q, dict) else q or ""
            m = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\)\s*", q)
            queries.append((f"variable ${var.get('name')}", m.group(1) if m else q))
    for panel in dash.get("panels", []):
        for t in panel.get("targets", []):
            queries.append((f"panel {panel.get('id')} \"{panel.get('title')}\" query {t.get('refId')}", t.get("expr", "")))
    return queries


def check_dashboard(dash, exported, promtool, work, label="dashboard"):
    """Errors of the dashboard (a parsed JSON object)."""
    errors = []
    for key in ("title", "uid", "panels", "schemaVersion", "templating"):
        if key not in dash:
            errors.append(f"{label}: no \"{key}\"")
    names = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    if "datasource" not in names:
        errors.append(f"{label}: no datasource variable (panels use ${{datasource}} so that the dashboard imports anywhere)")
    ids = set()
    for panel in dash.get("panels", []):
        where = f"{label}: panel {panel.get('id')} \"{panel.get('title')}\""
        if panel.get("id") in ids or not isinstance(panel.get("id"), int):
            errors.append(f"{where}: its id is missing or not unique")
        ids.add(panel.get("id"))
        if panel.get("type") not in PANEL_TYPES:
            errors.append(f"{where}: unknown panel type {panel.get('type')!r}")
        if not panel.get("title"):
            errors.append(f"{where}: no title")
        gp = panel.get("gridPos", {})
        if not all(isinstance(gp.get(k), int) for k in "hwxy") or gp["x"] + gp["w"] > GRID_COLUMNS or gp["w"] <= 0:
            errors.append(f"{where}: gridPos {gp} is not a place on the {GRID_COLUMNS}-column grid")
        if panel.get("type") == "row":
            continue
        if not panel.get("targets"):
            errors.append(f"{where}: no queries")
        for t in panel.get("targets", []):
            if (t.get("datasource") or {}).get("uid") != "${datasource}":
                errors.append(f"{where} query {t.get('refId')}: its datasource is not ${{datasource}}")
            if not t.get("expr"):
                errors.append(f"{where} query {t.get('refId')}: no expression")
    queries = dashboard_queries(dash)
    for where, expr in queries:
        for name in sorted(promql_metric_names(grafana_to_promql(expr)) | set(re.findall(r"vramswap_[a-z0-9_]+", expr))):
            if name not in exported and name not in PROMETHEUS_OWN:
                errors.append(f"{label}: {where} names {name}, which vramswapd does not export")
    if promtool:
        errors += [f"{label}: {e}" for e in promtool_parse(promtool, [(w, grafana_to_promql(e)) for w, e in queries], work)]
    return errors


# --- the rules ------------------------------------------------------------------------------

def check_rules(rules, exported, label="rules"):
    """Errors of a parsed rule file that promtool does not look for."""
    errors = []
    groups = rules.get("groups") if isinstance(rules, dict) else None
    if not isinstance(groups, list) or not groups:
        return [f"{label}: no groups"]
    for g in groups:
        for rule in g.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            where = f"{label}: {name}"
            if "alert" in rule:
                if rule.get("labels", {}).get("severity") not in ("warning", "critical"):
                    errors.append(f"{where}: labels.severity should be warning or critical")
                for a in ("summary", "description"):
                    if not rule.get("annotations", {}).get(a):
                        errors.append(f"{where}: no annotations.{a}")
            text = rule.get("expr", "") + " " + " ".join(rule.get("annotations", {}).values())
            for metric in sorted(promql_metric_names(rule.get("expr", "")) | set(re.findall(r"vramswap_[a-z0-9_]+", text))):
                if metric not in exported and metric not in PROMETHEUS_OWN and metric not in CONDITIONAL:
                    errors.append(f"{where} names {metric}, which vramswapd does not export")
    return errors


def promtool_run(promtool, *args, cwd=None):
    r = subprocess.run([promtool, *args], capture_output=True, text=True, cwd=cwd)
    return r.returncode, (r.stdout + r.stderr).strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vramswapd", required=True)
    ap.add_argument("--session-worker", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--rules", required=True)
    ap.add_argument("--rules-test", required=True)
    ap.add_argument("--prometheus-config", required=True)
    ap.add_argument("--promtool", default="")
    args = ap.parse_args()
    for a in ("vramswapd", "session_worker", "dashboard", "rules", "rules_test", "prometheus_config"):
        setattr(args, a, os.path.abspath(getattr(args, a)))
    promtool = args.promtool if args.promtool and os.access(args.promtool, os.X_OK) else shutil.which("promtool")
    promtool = os.path.abspath(promtool) if promtool else None
    skipped = []
    try:
        import yaml
    except ImportError:
        yaml = None
        skipped.append(f"PyYAML is not installed in {sys.executable}: the rules' structure and names were not checked")
    if not promtool:
        skipped.append("promtool was not found (scripts/install-deps.sh puts it in build/tools/): the scrape was not linted, "
                       "the expressions not parsed, the rules not checked or unit-tested")
        if yaml is None:
            print("SKIP: " + "; ".join(skipped))
            sys.exit(77)
        promtool = None

    text = scrape_real_daemon(args.vramswapd, args.session_worker)
    exported = exported_names(text)
    print(f"scraped a real vramswapd: {len(exported)} metric names")
    work = tempfile.mkdtemp(prefix="vramswap-monitoring-check-")
    try:
        if promtool:
            r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"promtool check metrics on the scrape: {(r.stdout + r.stderr).strip()}")

        with open(args.dashboard) as f:
            try:
                dash = json.load(f)
            except json.JSONDecodeError as e:
                fail(f"{args.dashboard}: not valid JSON: {e}")
                dash = None
        if dash is not None:
            for e in check_dashboard(dash, exported, promtool, work):
                fail(e)
            print(f"dashboard: {len(dash.get('panels', []))} panels, {len(dashboard_queries(dash))} queries checked")
            # It can fail: an unknown metric, an expression that does not parse.
            broken = copy.deepcopy(dash)
            target = next(t for p in broken["panels"] for t in p.get("targets", []))
            target["expr"] = "rate(vramswap_no_such_metric_total[5m])"
            if not any("vramswap_no_such_metric_total" in e for e in check_dashboard(broken, exported, None, work, "broken")):
                fail("a dashboard naming vramswap_no_such_metric_total was not refused")
            if promtool:
                unbalanced = "sum by (le (rate(vramswap_lock_wait_seconds_bucket[$__rate_interval]))"
                if not any("does not parse" in e for e in promtool_parse(promtool, [("broken", grafana_to_promql(unbalanced))], work)):
                    fail("a dashboard expression with unbalanced parentheses was not refused")

        if yaml is not None:
            with open(args.rules) as f:
                rules = yaml.safe_load(f)
            for e in check_rules(rules, exported):
                fail(e)
            broken = copy.deepcopy(rules)
            broken["groups"][0]["rules"][0]["expr"] = "vramswap_no_such_gauge > 1"
            if not any("vramswap_no_such_gauge" in e for e in check_rules(broken, exported, "broken")):
                fail("a rule naming vramswap_no_such_gauge was not refused")
            conditional = sorted(n for n in CONDITIONAL if n not in exported and n in json.dumps(rules))
            for n in conditional:
                print(f"note: the rules name {n}, not exported by this daemon run: {CONDITIONAL[n]}")
        if promtool:
            for what, cmd, cwd in (("check rules", ["check", "rules", args.rules], None),
                                   ("test rules", ["test", "rules", os.path.basename(args.rules_test)], os.path.dirname(args.rules_test)),
                                   ("check config", ["check", "config", args.prometheus_config], None)):
                rc, out = promtool_run(promtool, *cmd, cwd=cwd)
                if rc != 0:
                    fail(f"promtool {what}: {out}")
                else:
                    print(f"promtool {what}: ok")
            bad = os.path.join(work, "bad-rules.yml")
            with open(bad, "w") as f:
                f.write("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: up{job= == 0\n")
            if promtool_run(promtool, "check", "rules", bad)[0] == 0:
                fail("promtool check rules accepted a rule that does not parse")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if failures:
        print(f"{len(failures)} failed")
        sys.exit(1)
    if skipped:
        print("SKIP: " + "; ".join(skipped))
        sys.exit(77)
    print("all monitoring files are valid against the daemon's metrics")


if __name__ == "__main__":
    main()
