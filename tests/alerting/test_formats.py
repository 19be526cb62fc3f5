"""Webhook bodies: the Alertmanager v4 shape, Slack's message, our JSON."""
from __future__ import annotations

import json

import jsonschema
import pytest

from healthsvc_detectors.finding import Finding
from healthsvc.alerting import model
from healthsvc.alerting.formats import GO_ZERO_TIME, Notification, render, rfc3339
from healthsvc.alerting.policy import NotifyReason, group_key
from tests.alerting.amschema import ALERTMANAGER_V4


def group(now=1_700_000_000.0):
    nan = model.fire(None, Finding("non_finite", step=41, ranks=tuple(range(512)), severity="critical",
                                   metric="loss", evidence={"value": float("nan"), "inf": float("-inf")}),
                     "run-7", tuple(f"node{r // 8}" for r in range(512)), now)
    spike = model.resolve_by_hand(model.fire(None, Finding("grad_spike", step=40, ranks=(3,), metric="grad_norm"),
                                             "run-7", (), now - 60), now - 10)
    return Notification(group_key("run-7"), "run-7", "oncall", NotifyReason.FIRST_NOTIFICATION,
                        (nan, spike), "http://healthsvc:8080", now)


def test_rfc3339():
    assert rfc3339(0.0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_700_000_000.25) == "2023-11-14T22:13:20.250Z"


def test_alertmanager_body_validates_against_the_documented_shape():
    body = json.loads(render("alertmanager", group()))
    jsonschema.validate(body, ALERTMANAGER_V4)
    assert (body["version"], body["groupKey"], body["status"], body["receiver"]) == (
        "4", '{}:{run="run-7"}', "firing", "oncall")
    assert body["groupLabels"] == {"run": "run-7"}
    assert body["commonLabels"] == {"run": "run-7"}  # alertname, rank, metric, severity differ
    firing, resolved = body["alerts"]
    assert firing["labels"] == {"alertname": "non_finite", "run": "run-7", "rank": "0-511", "metric": "loss",
                                "severity": "critical"}
    assert firing["endsAt"] == GO_ZERO_TIME and resolved["endsAt"] != GO_ZERO_TIME
    assert firing["annotations"]["ranks"] == "0-511" and firing["annotations"]["rank_count"] == "512"
    assert firing["generatorURL"] == "http://healthsvc:8080/runs/run-7?kind=non_finite&step=41"
    assert resolved["status"] == "resolved"


def test_schema_check_is_not_vacuous():
    body = json.loads(render("alertmanager", group()))
    del body["alerts"][0]["fingerprint"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, ALERTMANAGER_V4)


def test_slack_body_is_an_incoming_webhook_message():
    body = json.loads(render("slack", group()))
    assert set(body) == {"text", "blocks"} and "run run-7" in body["text"]
    assert body["blocks"][0]["type"] == "header"
    sections = [b["text"]["text"] for b in body["blocks"] if b["type"] == "section"]
    assert any("*non_finite*" in s and "ranks: 0-511" in s for s in sections)
    assert any("<http://healthsvc:8080/runs/run-7|Open run" in s for s in sections)
    assert any("<http://healthsvc:8080/runs/run-7?kind=non_finite&step=41|open>" in s for s in sections)


def test_json_body_carries_our_alerts_and_keeps_nan_distinct_from_missing():
    raw = render("json", group())
    body = json.loads(raw)   # strict JSON: no NaN tokens
    assert b"NaN," not in raw
    assert body["reason"] == "first_notification" and len(body["alerts"]) == 2
    assert body["alerts"][0]["evidence"] == {"value": "NaN", "inf": "-Infinity"}
    assert body["alerts"][0]["ranks"] == list(range(512))


def test_unknown_format_says_which_exist():
    with pytest.raises(ValueError, match="alertmanager"):
        render("pagerduty", group())
