#!/usr/bin/python3
"""Writes tests/deploy/rules_test.yml (the promtool unit tests of deploy/prometheus/rules.yml)
from the rules file and the cases below: for every alert a case that fires, with the labels and
annotations it must carry (the rule's own templates expanded with the case's labels and value),
and one that does not; plus checks of some recording rules. promtool compares annotations
exactly, so after editing an alert's text run this again (needs PyYAML: python3-yaml) and then
`promtool test rules tests/deploy/rules_test.yml`; after adding an alert, add its two cases here
(tests/integration/test_deploy.py fails an alert without both).
Usage: python3 tests/deploy/gen_rules_test.py
"""
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
rules = yaml.safe_load(open(f"{ROOT}/deploy/prometheus/rules.yml"))
alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}

J = 'job="kvrouter",instance="router-1:8080"'
BASE = {"job": "kvrouter", "instance": "router-1:8080"}


def expand(text, labels, value):
    def sub(m):
        inner = m.group(1).strip()
        if inner.startswith("$labels."):
            return labels[inner[len("$labels."):]]
        if inner.startswith("$value"):
            assert value is not None, text
            return value
        raise ValueError(inner)
    return re.sub(r"\{\{(.*?)\}\}", sub, text)


def exp_alert(name, labels, value):
    a = alerts[name]
    lab = dict(BASE)
    lab.update(labels)
    full = dict(lab)
    full.update(a["labels"])
    ann = {k: expand(v, full, value) for k, v in a["annotations"].items()}
    return {"exp_labels": full, "exp_annotations": ann}


tests = []


def case(name, series, eval_time, fires, labels=None, value=None, more=None, interval="1m"):
    exp = []
    if fires:
        exp.append(exp_alert(name, labels or {}, value))
        for lb, v in more or []:
            exp.append(exp_alert(name, lb, v))
    tests.append({
        "name": f"{name} {'fires' if fires else 'stays quiet'}",
        "interval": interval,
        "input_series": [{"series": s, "values": v} for s, v in series],
        "alert_rule_test": [{"eval_time": eval_time, "alertname": name, "exp_alerts": exp}],
    })


def s(metric, labels=""):
    return f"{metric}{{{J}{',' if labels else ''}{labels}}}"

# --- fleet -------------------------------------------------------------------------------
case("KvrRankIndexNotExact",
     [(s("kvr_worker_index_state", 'worker_id="1",dp_rank="0",state="unreachable"'), "1x4 stale"),
      (s("kvr_worker_index_state", 'worker_id="1",dp_rank="0",state="error"'), "_x5 1x20"),
      (s("kvr_worker_index_state", 'worker_id="2",dp_rank="0",state="exact"'), "1x25")],
     "15m", True, {"worker_id": "1", "dp_rank": "0"})
case("KvrRankIndexNotExact",
     [(s("kvr_worker_index_state", 'worker_id="1",dp_rank="0",state="unreachable"'), "1x5 stale"),
      (s("kvr_worker_index_state", 'worker_id="1",dp_rank="0",state="exact"'), "_x6 1x20"),
      (s("kvr_worker_index_state", 'worker_id="2",dp_rank="0",state="degraded"'), "1x25"),
      (s("kvr_worker_index_state", 'worker_id="3",dp_rank="0",state="no_events"'), "1x25")],
     "15m", False)
case("KvrRankIndexDegraded",
     [(s("kvr_worker_index_state", 'worker_id="1",dp_rank="0",state="degraded"'),
       "1x10 stale 1x30"),
      (s("kvr_worker_index_state", 'worker_id="1",dp_rank="0",state="recovering"'), "_x11 1 stale"),
      (s("kvr_worker_index_state", 'worker_id="2",dp_rank="0",state="exact"'), "1x42")],
     "40m", True, {"worker_id": "1", "dp_rank": "0"})
case("KvrRankIndexDegraded",
     [(s("kvr_worker_index_state", 'worker_id="1",dp_rank="0",state="degraded"'), "1x20 stale"),
      (s("kvr_worker_index_state", 'worker_id="1",dp_rank="0",state="exact"'), "_x21 1x20"),
      (s("kvr_worker_index_state", 'worker_id="2",dp_rank="0",state="unreachable"'), "1x42")],
     "40m", False)
case("KvrWorkerFenced",
     [(s("kvr_worker_fenced", 'worker_id="1",dp_rank="0"'), "0 0 1x10"),
      (s("kvr_worker_fenced", 'worker_id="1",dp_rank="1"'), "0 0 1x10"),
      (s("kvr_worker_fenced", 'worker_id="2",dp_rank="0"'), "0x12")],
     "8m", True, {"worker_id": "1"})
case("KvrWorkerFenced",
     [(s("kvr_worker_fenced", 'worker_id="1",dp_rank="0"'), "0 1 1 0x10"),
      (s("kvr_worker_fenced", 'worker_id="2",dp_rank="0"'), "0x12")],
     "8m", False)
case("KvrAllWorkersFenced",
     [(s("kvr_worker_fenced", 'worker_id="1",dp_rank="0"'), "0 1x10"),
      (s("kvr_worker_fenced", 'worker_id="2",dp_rank="0"'), "0 0 1x10")],
     "6m", True)
case("KvrAllWorkersFenced",
     [(s("kvr_worker_fenced", 'worker_id="1",dp_rank="0"'), "1x10"),
      (s("kvr_worker_fenced", 'worker_id="2",dp_rank="0"'), "0x10")],
     "6m", False)
# --- queue -------------------------------------------------------------------------------
case("KvrQueueGrowing", [(s("kvr_queue_pending"), "1+1x30")], "20m", True, value="21")
case("KvrQueueGrowing", [(s("kvr_queue_pending"), "10x30")], "20m", False)
case("KvrQueueRequestsExpiring", [(s("kvr_queue_expired_total"), "0+2x20")], "10m", True,
     value="10")
case("KvrQueueRequestsExpiring", [(s("kvr_queue_expired_total"), "5x20")], "10m", False)
case("KvrQueueFull", [(s("kvr_queue_rejected_total"), "0+3x20")], "10m", True, value="15")
case("KvrQueueFull", [(s("kvr_queue_rejected_total"), "7x20")], "10m", False)
# --- KV events ---------------------------------------------------------------------------
case("KvrKvEventsLost",
     [(s("kvr_kv_gaps_lost_total"), "0x10 1x10"), (s("kvr_kv_replay_timeouts_total"), "0x20"),
      (s("kvr_kv_replay_hold_overflows_total"), "0x20")], "15m", True, value="1")
case("KvrKvEventsLost",
     [(s("kvr_kv_gaps_lost_total"), "3x30"), (s("kvr_kv_replay_timeouts_total"), "2x30"),
      (s("kvr_kv_replay_hold_overflows_total"), "0x30")], "15m", False)
case("KvrKvEventGapsFrequent", [(s("kvr_kv_gaps_total"), "0+3x40")], "35m", True, value="45")
case("KvrKvEventGapsFrequent", [(s("kvr_kv_gaps_total"), "0+1x40")], "35m", False)
DROP = "kvr_kv_events_dropped_total"
case("KvrKvEventsRejected",
     [(s("kvr_kv_events_applied_total"), "0+100x40"),
      (s(DROP, 'cause="rejected_by_index"'), "0+5x40"),
      (s(DROP, 'cause="unknown_tag"'), "0+50x40")], "30m", True, value="4.762%")
case("KvrKvEventsRejected",
     [(s("kvr_kv_events_applied_total"), "0+100x40"),
      (s(DROP, 'cause="rejected_by_index"'), "0x40"),
      (s(DROP, 'cause="unknown_tag"'), "0+50x40"),
      (s(DROP, 'cause="remote_locality"'), "0+50x40")], "30m", False)
# --- replicas ----------------------------------------------------------------------------
LAG = "kvr_sync_lag_seconds_bucket"
case("KvrReplicaSyncLagHigh",
     [(s(LAG, 'le="0.1"'), "0x20"), (s(LAG, 'le="0.5"'), "0x20"),
      (s(LAG, 'le="1"'), "0+10x20"), (s(LAG, 'le="+Inf"'), "0+10x20")],
     "15m", True, value="995ms")
case("KvrReplicaSyncLagHigh",
     [(s(LAG, 'le="0.1"'), "0+10x20"), (s(LAG, 'le="0.5"'), "0+10x20"),
      (s(LAG, 'le="1"'), "0+10x20"), (s(LAG, 'le="+Inf"'), "0+10x20")], "15m", False)
case("KvrReplicaSyncBatchesLost", [(s("kvr_sync_lost_batches_total"), "0x10 2x10")], "15m", True,
     value="2")
case("KvrReplicaSyncBatchesLost", [(s("kvr_sync_lost_batches_total"), "4x20")], "15m", False)
case("KvrNatsDisconnected", [(s("kvr_nats_connected"), "1 1 0x5")], "5m", True)
case("KvrNatsDisconnected", [(s("kvr_nats_connected"), "1 0 1x5")], "5m", False)
case("KvrReplicaNotJoined", [(s("kvr_sync_joined"), "0x10")], "6m", True)
case("KvrReplicaNotJoined", [(s("kvr_sync_joined"), "0 0 1x10")], "8m", False)
# --- prediction --------------------------------------------------------------------------
case("KvrPredictionDrifting",
     [(s("kvr_prediction_drifting", 'worker_id="2",dp_rank="0"'), "0 1x10"),
      (s("kvr_prediction_drifting", 'worker_id="1",dp_rank="0"'), "0x11")],
     "8m", True, {"worker_id": "2", "dp_rank": "0"})
case("KvrPredictionDrifting",
     [(s("kvr_prediction_drifting", 'worker_id="2",dp_rank="0"'), "0 1 1 0x10"),
      (s("kvr_prediction_drifting", 'worker_id="1",dp_rank="0"'), "0x13")], "8m", False)
ANS = "kvr_prediction_answers_total"
case("KvrCachedTokensUnreported",
     [(s(ANS, 'report="reported"'), "0+1x60"), (s(ANS, 'report="unreported"'), "0+3x60")],
     "50m", True, value="75%")
case("KvrCachedTokensUnreported",
     [(s(ANS, 'report="reported"'), "0+3x60"), (s(ANS, 'report="unreported"'), "0+1x60")],
     "50m", False)
# streams whose clients did not ask for usage are not the engines' fault
case("KvrCachedTokensUnreported",
     [(s(ANS, 'report="reported"'), "0+1x60"), (s(ANS, 'report="unreported"'), "0+0x60"),
      (s(ANS, 'report="not_asked"'), "0+9x60")],
     "50m", False)
SET = "kvr_inflight_settled_total"
case("KvrInflightCreditsExpiring",
     [(s(SET, 'outcome="expired"'), "0+1x40"), (s(SET, 'outcome="confirmed"'), "3x40")],
     "30m", True, value="15")
case("KvrInflightCreditsExpiring",
     [(s(SET, 'outcome="expired"'), "0+1x40"), (s(SET, 'outcome="confirmed"'), "0+1x40")],
     "30m", False)
# --- errors ------------------------------------------------------------------------------
REP = "kvr_frontend_replies_total"
case("KvrFrontendErrorRatioHigh",
     [(s(REP, 'class="2xx"'), "0+60x20"), (s(REP, 'class="stream"'), "0+30x20"),
      (s(REP, 'class="4xx"'), "0x20"), (s(REP, 'class="5xx"'), "0+10x20")],
     "15m", True, value="10%")
case("KvrFrontendErrorRatioHigh",
     [(s(REP, 'class="2xx"'), "0+60x20"), (s(REP, 'class="stream"'), "0+30x20"),
      (s(REP, 'class="4xx"'), "0+20x20"), (s(REP, 'class="5xx"'), "0+1x20")], "15m", False)
RT = "kvr_routes_total"
case("KvrRoutingRejectionRatioHigh",
     [(s(RT, 'result="ok"'), "0+80x20"), (s(RT, 'result="busy"'), "0+15x20"),
      (s(RT, 'result="no_worker"'), "0+15x20"), (s(RT, 'result="full"'), "0+5x20"),
      (s(RT, 'result="invalid"'), "0x20")],
     "15m", True, value="20%")
case("KvrRoutingRejectionRatioHigh",
     [(s(RT, 'result="ok"'), "0+80x20"), (s(RT, 'result="busy"'), "0+400x20"),
      (s(RT, 'result="invalid"'), "0+19x20"), (s(RT, 'result="no_worker"'), "0+1x20"),
      (s(RT, 'result="full"'), "0x20")],
     "15m", False)
# --- disaggregation ----------------------------------------------------------------------
case("KvrDisaggPrefillUnavailable", [(s("kvr_disagg_state"), "1 1 2x5")], "5m", True)
case("KvrDisaggPrefillUnavailable", [(s("kvr_disagg_state"), "1 2 1x5")], "5m", False)
BY = "kvr_disagg_bypass_total"
DR = "kvr_disagg_requests_total"
case("KvrDisaggPrefillFailing",
     [(s(BY, 'reason="prefill_failed"'), "0+10x20"), (s(BY, 'reason="isl"'), "0x20"),
      (s(DR, 'mode="pull"'), "0+90x20"), (s(DR, 'mode="aggregated"'), "0+10x20")],
     "15m", True, value="10%")
case("KvrDisaggPrefillFailing",
     [(s(BY, 'reason="prefill_failed"'), "0x20"), (s(BY, 'reason="isl"'), "0+50x20"),
      (s(DR, 'mode="pull"'), "0+50x20"), (s(DR, 'mode="aggregated"'), "0+50x20")],
     "15m", False)
# --- index -------------------------------------------------------------------------------
case("KvrIndexNearBudget",
     [(s("kvr_index_pairs"), "990x40"), (s("kvr_index_max_pairs"), "1000x40")], "35m", True,
     value="99%")
case("KvrIndexNearBudget",
     [(s("kvr_index_pairs"), "500x40"), (s("kvr_index_max_pairs"), "1000x40")], "35m", False)

case("KvrIndexerStaleRanks", [(s("kvr_indexer_stale_ranks"), "2x20")], "10m", True, value="2")
case("KvrIndexerStaleRanks", [(s("kvr_indexer_stale_ranks"), "0x20")], "10m", False)

missing = set(alerts) - {t["alert_rule_test"][0]["alertname"] for t in tests}
assert not missing, missing

# --- recording rules ---------------------------------------------------------------------
tests.append({
    "name": "recording rules: ratios and quantiles",
    "interval": "1m",
    "input_series": [
        {"series": s(RT, 'result="ok"'), "values": "0+90x20"},
        {"series": s(RT, 'result="busy"'), "values": "0+50x20"},
        {"series": s(RT, 'result="full"'), "values": "0+10x20"},
        {"series": s("kvr_pool_cached_tokens_total", 'pool="decode"'), "values": "0+300x20"},
        {"series": s("kvr_pool_prompt_tokens_total", 'pool="decode"'), "values": "0+1200x20"},
        {"series": s("kvr_frontend_time_to_first_token_seconds_bucket", 'model="m",le="0.1"'),
         "values": "0+10x20"},
        {"series": s("kvr_frontend_time_to_first_token_seconds_bucket", 'model="m",le="0.5"'),
         "values": "0+20x20"},
        {"series": s("kvr_frontend_time_to_first_token_seconds_bucket", 'model="m",le="+Inf"'),
         "values": "0+20x20"},
    ],
    "promql_expr_test": [
        {"expr": "kvr:routes_rejected:ratio_rate5m", "eval_time": "15m",
         "exp_samples": [{"labels": f"kvr:routes_rejected:ratio_rate5m{{{J}}}", "value": 0.1}]},
        {"expr": "kvr:pool_predicted_hit:ratio_rate5m", "eval_time": "15m",
         "exp_samples": [{"labels": f'kvr:pool_predicted_hit:ratio_rate5m{{{J},pool="decode"}}',
                          "value": 0.25}]},
        {"expr": "kvr:frontend_ttft_seconds:p50_5m", "eval_time": "15m",
         "exp_samples": [{"labels": f'kvr:frontend_ttft_seconds:p50_5m{{{J},model="m"}}',
                          "value": 0.1}]},
    ],
})

head = """\
# promtool unit tests of deploy/prometheus/rules.yml: for every alert, one case where it fires
# (its labels and annotations, templates expanded) and one where it does not; and some of the
# recording rules. Run: promtool test rules tests/deploy/rules_test.yml (from anywhere: the
# rule file's path is relative to this file). tests/integration/test_deploy.py runs it and
# checks that every alert of the rules file has both cases here.
# Generated by tests/deploy/gen_rules_test.py: edit the cases there and run it again.
"""
doc = {"rule_files": ["../../deploy/prometheus/rules.yml"], "evaluation_interval": "1m",
       "tests": tests}
with open(f"{ROOT}/tests/deploy/rules_test.yml", "w") as f:
    f.write(head + "\n")
    yaml.safe_dump(doc, f, sort_keys=False, width=100, allow_unicode=True)
print(len(tests), "tests")
