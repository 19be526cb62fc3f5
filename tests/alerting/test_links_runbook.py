"""Links and attribution, through the real server (uvicorn on 127.0.0.1, a fake clock) and a real
receiver: the links in alerts open pages people read (the run's dashboard page, the kind's section
of the runbook), every alert says what it means, and a resolution by hand keeps who did it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from healthsvc_detectors.finding import Finding
from healthsvc_detectors import kinds
from healthsvc_detectors.registry import FINDING_KINDS
from healthsvc.alerting.policy import DEFAULT_TIMINGS
from tests.alerting.receiver import Receiver
from tests.harness import ServedService

pytestmark = [pytest.mark.timeout(120)]

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "runbook.md"
ROUTING_KEY = "0123456789abcdef0123456789abcdef"


def sections(markdown: str) -> dict[str, str]:
    """``## name`` -> the section's text."""
    parts = re.split(r"^## (\S+)\n\n", markdown, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_runbook_has_a_section_per_kind_that_says_what_it_means_what_to_check_what_to_do():
    found = sections(RUNBOOK.read_text())
    assert list(found) == list(FINDING_KINDS)
    for name, text in found.items():
        assert text.startswith(f"**What it means.** {kinds.kind(name).meaning}\n"), name
        assert "\n**What to check.**\n" in text and "\n**What to do.**\n" in text, name


def test_alert_links_open_the_dashboard_page_and_the_kinds_runbook_section(tmp_path):
    with Receiver() as rx:
        subs = [{"id": "am", "url": f"http://127.0.0.1:{rx.port}/am", "format": "alertmanager", "secret": ""},
                {"id": "slack", "url": f"http://127.0.0.1:{rx.port}/slack", "format": "slack", "secret": ""},
                {"id": "pd", "url": f"http://127.0.0.1:{rx.port}/pd", "format": "pagerduty", "secret": "",
                 "routing_key": ROUTING_KEY}]
        with ServedService(tmp_path, alert_webhooks=subs) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            ctx = srv.app.state.ctx
            ctx.store.control.submit_run_config("links-run", {}).result()
            nan = Finding("non_finite", step=7, ranks=(2,), severity="critical", metric="loss")
            ctx.findings.record("links-run", 1, [nan], {2: "node2"}).result()
            srv.drain()
            got = {r.path: json.loads(r.body) for r in rx.delivered()}
            ann = got["/am"]["alerts"][0]["annotations"]
            assert ann["run_url"] == f"{srv.url}/runs/links-run"
            assert got["/pd"]["client_url"] == ann["run_url"]
            assert ann["runbook_url"] == f"{srv.url}/runbook#non_finite"
            assert ann["description"].startswith("Non finite in loss on rank 2 of run links-run since step 7. "
                                                 + kinds.kind("non_finite").meaning)
            assert got["/pd"]["payload"]["custom_details"]["runbook_url"] == ann["runbook_url"]
            assert {"href": ann["runbook_url"], "text": "runbook: non_finite"} in got["/pd"]["links"]
            assert f"<{ann['runbook_url']}|runbook>" in json.dumps(got["/slack"]["blocks"])

            page = httpx.get(ann["run_url"])    # the dashboard's page, HTML for a person
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            runbook = httpx.get(ann["runbook_url"])
            assert runbook.status_code == 200 and runbook.headers["content-type"].startswith("text/html")
            for kind in FINDING_KINDS:   # every kind's section is an anchor of the page
                assert f'<h2 id="{kind}">' in runbook.text
            assert "<strong>What to check.</strong>" in runbook.text

            # Resolved by hand: the alert and the resolved notification keep who.
            (alert,) = c.get("/v1/alerts", params={"run": "links-run"}).json()["alerts"]
            refused = c.post(f"/v1/alerts/{alert['fingerprint']}/resolve", json={"by": "rollback"})
            assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "by"]
            r = c.post(f"/v1/alerts/{alert['fingerprint']}/resolve", json={"by": "alice"})
            assert r.status_code == 200 and r.json()["resolved_by"] == "alice"
            srv.advance(DEFAULT_TIMINGS["critical"].group_interval_s)
            resolved = [json.loads(x.body) for x in rx.delivered() if x.path == "/am"][-1]
            assert resolved["status"] == "resolved"
            assert resolved["alerts"][0]["annotations"]["resolved_by"] == "alice"
            assert c.get(f"/v1/alerts/{alert['fingerprint']}").json()["resolved_by"] == "alice"


def test_the_runbook_base_url_is_a_setting(tmp_path):
    with Receiver() as rx:
        subs = [{"id": "j", "url": rx.url, "format": "json", "secret": ""}]
        with ServedService(tmp_path, alert_webhooks=subs, alert_runbook_url="https://wiki.example.com/ml/runbook") as srv:
            ctx = srv.app.state.ctx
            ctx.store.control.submit_run_config("r", {}).result()
            ctx.findings.record("r", 1, [Finding("stall", step=3, severity="critical")], {}).result()
            srv.drain()
            (got,) = rx.delivered()
            assert json.loads(got.body)["alerts"][0]["annotations"]["runbook_url"] == \
                "https://wiki.example.com/ml/runbook#stall"
