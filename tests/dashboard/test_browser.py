"""The dashboard in a real headless Chromium against a real server holding a run with a straggler
(rank 5, 2x compute time from step 100) and a NaN (rank 3's loss at step 300).

Screenshots go to ``$HEALTHSVC_ARTIFACTS`` (default: pytest's tmp dir, path printed); one of
them is docs/dashboard.png.
"""
from __future__ import annotations

import httpx
import pytest

from healthsvc.alerting.formats import generator_url
from healthsvc.alerting.model import Alert
from tests.dashboard import browser, replay
from tests.dashboard.conftest import open_page

RUN = "llm-straggler-nan"
OK_RUN = "clean-run"
N_STEPS = 400


@pytest.fixture(scope="module")
def http(dash_server):
    with httpx.Client(base_url=dash_server.url, timeout=30) as client:
        client.put(f"/v1/runs/{RUN}", json={"world_size": replay.N_RANKS}).raise_for_status()
        trace = replay.make_trace(N_STEPS + 100)
        replay.push_steps(client, RUN, trace, 0, N_STEPS)
        client.post(f"/v1/runs/{OK_RUN}/metrics", json={"records": [
            {"step": s, "rank": r, "loss": 2.0 - s / 100, "compute_time": 0.4} for s in range(40) for r in range(4)]}
        ).raise_for_status()
        client.trace = trace  # the rest, for the live test
        # Barrier: the detectors have judged what was pushed (both findings stored).
        browser.poll(lambda: {f["kind"] for f in client.get(f"/v1/runs/{RUN}/findings").json()}
                     >= {"straggler", "non_finite"}, what="straggler and non_finite findings")
        # ... and the dashboard's rollups hold every step pushed (its thread folds what gathered
        # since its last fold once a second, whatever the monitor has judged).
        for run, last in ((RUN, N_STEPS - 1), (OK_RUN, 39)):
            browser.poll(lambda: client.get(f"/v1/runs/{run}/dashboard/series").json()["step_max"] >= last,
                         what=f"the rollups of {run} up to step {last}")
        yield client


def test_runs_page_lists_the_run_as_critical(driver, dash_server, http, artifacts):
    open_page(driver, dash_server, "/")
    health = browser.wait_for(driver, f"(document.querySelector('tr[data-run=\"{RUN}\"]') || {{}}).dataset?.health",
                              what="the run's row")
    assert health == "critical"
    assert driver.execute_script(f"return document.querySelector('tr[data-run=\"{OK_RUN}\"]').dataset.health") == "ok"
    row = driver.execute_script(f"return document.querySelector('tr[data-run=\"{RUN}\"]').innerText")
    assert "non_finite" in row and "straggler" in row and str(N_STEPS - 1) in row
    driver.save_screenshot(str(artifacts / "runs.png"))
    # The filter keeps only critical runs; the search narrows by name.
    driver.execute_script("const s = document.getElementById('f-health'); s.value = 'critical';"
                          " s.dispatchEvent(new Event('change'))")
    assert driver.execute_script("return [...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.run)") == [RUN]
    driver.execute_script("const s = document.getElementById('f-health'); s.value = '';"
                          " s.dispatchEvent(new Event('change'));"
                          " const q = document.getElementById('q'); q.value = 'clean'; q.dispatchEvent(new Event('input'))")
    assert driver.execute_script("return [...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.run)") == [OK_RUN]
    # It refreshes itself: a run that starts now appears without a reload.
    driver.execute_script("const q = document.getElementById('q'); q.value = ''; q.dispatchEvent(new Event('input'))")
    http.post("/v1/runs/late-run/metrics", json={"records": [{"step": 0, "rank": 0, "loss": 1.0}]}).raise_for_status()
    browser.wait_for(driver, "document.querySelector('tr[data-run=\"late-run\"]')", timeout_s=10, what="the new run's row")
    assert browser.console_errors(driver) == []


def test_run_page_draws_curves_markers_heatmap_and_rollback(driver, dash_server, http, artifacts):
    open_page(driver, dash_server, f"/runs/{RUN}")
    browser.wait_for(driver, "window.dashboard.slowLoaded", what="rollback, alerts and economics")
    charts = driver.execute_script("return window.dashboard.charts")
    assert charts["loss"]["points"] == N_STEPS and charts["grad_norm"]["points"] == N_STEPS
    assert charts["loss"]["nonfinite_steps"] == [replay.NAN_STEP]
    assert driver.execute_script("return document.querySelectorAll('#chart-loss canvas, #chart-grad_norm canvas').length") >= 2

    # Each finding's marker sits at its step: its stored step, at the pixel the chart maps it to.
    findings = {f["kind"]: f for f in http.get(f"/v1/runs/{RUN}/findings").json()}
    assert findings["non_finite"]["step"] == replay.NAN_STEP
    for kind in ("non_finite", "straggler"):
        f = findings[kind]
        el = driver.execute_script(
            "const el = document.querySelector(`#chart-loss .marker[data-finding='${arguments[0]}']`);"
            "return el && {step: +el.dataset.step, left: parseFloat(el.style.left),"
            " want: window.dashboard.plots.loss.valToPos(+el.dataset.step, 'x')}", f["id"])
        assert el is not None, f"no marker for {kind}"
        assert el["step"] == f["step"]
        assert abs(el["left"] - el["want"]) < 1.0
    assert replay.STRAGGLER_STEP <= findings["straggler"]["step"] <= replay.STRAGGLER_STEP + 50

    # The heatmap's hottest row is the slow rank, and it is drawn hotter (redder) than its peers.
    heat = driver.execute_script("return window.dashboard.heatmap")
    assert heat["rank_width"] == 1 and heat["n_rows"] == replay.N_RANKS
    assert heat["hottest"]["rank_lo"] == replay.SLOW_RANK and heat["hottest"]["ratio"] > 1.5
    reds = driver.execute_script(
        "const c = document.getElementById('heat'), g = c.getContext('2d'), h = window.dashboard.heatmap;"
        "const x = Math.floor(c.width * 0.9);"
        "return [...Array(h.n_rows).keys()].map(r => g.getImageData(x, Math.floor((r + 0.5) * h.rowHeight), 1, 1).data[0]);")
    assert max(range(len(reds)), key=reds.__getitem__) == replay.SLOW_RANK
    assert reds[replay.SLOW_RANK] > 200 and sorted(reds)[-2] < 120

    # The rollback answer, as the API gives it, with its reason.
    answer = http.get(f"/v1/runs/{RUN}/rollback").json()
    shown = driver.execute_script("return document.getElementById('rollback-checkpoint').dataset.step")
    assert shown == str(answer["checkpoint"]["step"])
    assert driver.find_element("id", "rollback-reason").text == answer["reason"]
    assert "bisection" in driver.find_element("id", "rollback").text
    assert driver.find_element("id", "advice-recommended").text.startswith("every")
    assert "%" in driver.find_element("id", "goodput-fraction").text
    driver.save_screenshot(str(artifacts / "run.png"))
    assert browser.console_errors(driver) == []
    assert driver.execute_script("return window.dashboard.errors") == []
    # Nothing was fetched from anywhere but the service itself.
    origins = driver.execute_script("return [...new Set(performance.getEntriesByType('resource')"
                                    ".map(e => new URL(e.name).origin))]")
    assert origins == [dash_server.url]


def test_dragging_zooms_both_curves_and_the_heatmap_with_server_detail(driver, dash_server, http):
    from selenium.webdriver.common.action_chains import ActionChains

    open_page(driver, dash_server, f"/runs/{RUN}")
    over = driver.find_element("css selector", "#chart-loss .u-over")
    w = over.size["width"]
    # From 40 % to 50 % of the plot's width: about steps 160-200 of 0-399.
    ActionChains(driver).move_to_element_with_offset(over, int(-0.1 * w), 0).click_and_hold() \
        .move_by_offset(int(0.1 * w), 0).release().perform()
    first, last = browser.wait_for(driver, "window.dashboard.charts.loss.points < 100 && "
                                           "[window.dashboard.charts.loss.first, window.dashboard.charts.loss.last]",
                                   what="the zoomed series")
    assert 140 <= first < last <= 220
    assert driver.execute_script("return [window.dashboard.charts.grad_norm.first, window.dashboard.charts.grad_norm.last]") == [first, last]
    heat = browser.wait_for(driver, "window.dashboard.heatmap.step_min > 0 && window.dashboard.heatmap", what="zoomed heatmap")
    assert heat["step_min"] == first and heat["step_width"] == 1
    # Double-click goes back to the whole run.
    ActionChains(driver).double_click(over).perform()
    browser.wait_for(driver, f"window.dashboard.charts.loss.points === {N_STEPS}", what="zoom reset")
    assert browser.console_errors(driver) == []


def test_restart_and_world_size_change_are_marked(driver, dash_server, http):
    # Attempt 1: 8 ranks to step 199; the job restarts from the checkpoint at 150 on 4 ranks.
    run_id = "elastic-run"
    trace = replay.make_trace(250)
    replay.push_steps(http, run_id, trace, 0, 200)
    cols = {"step": [s for s in range(150, 250) for _ in range(4)], "rank": list(range(4)) * 100,
            "loss": trace.values["loss"][150:250, :4].reshape(-1).tolist(),
            "compute_time": trace.values["compute_time"][150:250, :4].reshape(-1).tolist()}
    http.post(f"/v1/runs/{run_id}/metrics", json={"columns": cols}).raise_for_status()
    timeline = browser.poll(lambda: (t := http.get(f"/v1/runs/{run_id}/timeline").json())["world_size_changes"] and t,
                            what="the world-size change")
    change = next(e for e in timeline["entries"] if e["kind"] == "world_size_change")
    open_page(driver, dash_server, f"/runs/{run_id}")
    browser.wait_for(driver, "window.dashboard.slowLoaded && window.dashboard.charts.loss.last === 249", what="attempt 2 drawn")
    marks = driver.execute_script("return window.dashboard.markers.filter(m => m.chart === 'loss')"
                                  ".map(m => [m.kind, m.step])")
    assert ["restart", 150] in marks
    assert ["world_size", change["step"]] in marks
    assert ["checkpoint", 150] in marks
    assert browser.console_errors(driver) == []


def test_a_supervised_restart_says_who_decided_why_and_which_hosts_are_out(driver, dash_server, http):
    # Attempt 1 on 8 ranks to step 199; healthsvc supervise restarts it from the checkpoint at 150
    # without node-5 (the event it posts, docs/supervise.md); attempt 2 runs on 7 ranks.
    run_id = "supervised-run"
    trace = replay.make_trace(250)
    replay.push_steps(http, run_id, trace, 0, 200)
    reason = "Restart from step 150 (clean by proof) without node-5 because replica_mismatch (critical) at step 180."
    http.post(f"/v1/runs/{run_id}/events", json={"kind": "rollback", "step": 150, "data": {
        "decided_by": "healthsvc supervise", "reason": reason, "reason_code": "finding",
        "resume_from_checkpoint_step": 150, "uri": "file:///ckpt/150.pt", "causes": [["replica_mismatch", 180]],
        "finding_ids": [], "exclude_hosts": ["node-5"], "world_size": {"old": 8, "new": 7},
        "from_attempt": 1}}).raise_for_status()
    cols = {"step": [s for s in range(150, 250) for _ in range(7)], "rank": list(range(7)) * 100,
            "loss": trace.values["loss"][150:250, :7].reshape(-1).tolist(),
            "compute_time": trace.values["compute_time"][150:250, :7].reshape(-1).tolist()}
    http.post(f"/v1/runs/{run_id}/metrics", json={"columns": cols}).raise_for_status()
    browser.poll(lambda: http.get(f"/v1/runs/{run_id}").json()["attempt"] == 2, what="attempt 2")
    open_page(driver, dash_server, f"/runs/{run_id}")
    browser.wait_for(driver, "window.dashboard.slowLoaded && window.dashboard.charts.loss.last === 249", what="attempt 2 drawn")
    said = f" — healthsvc supervise: {reason} Hosts left out: node-5. World size 8 → 7."
    title = browser.wait_for(driver, "(document.querySelector('.marker[data-kind=restart]') || {}).title",
                             what="the restart marker")
    assert title == f"attempt 2 resumed at step 150{said}"
    item = driver.execute_script("return document.querySelector('#attempts li[data-attempt=\"2\"]').textContent")
    assert item == f"#2 from step 150{said}"
    assert browser.console_errors(driver) == []


def test_alert_link_opens_the_run_at_the_finding(driver, dash_server, http, artifacts):
    # The link an alert body carries (Alertmanager's generatorURL; Slack's "open"), opened.
    alert = next(a for a in http.get("/v1/alerts", params={"run": RUN}).json()["alerts"]
                 if a["labels"]["alertname"] == "non_finite")
    url = generator_url(dash_server.url, Alert.from_dict(alert))
    assert url == f"{dash_server.url}/runs/{RUN}?kind=non_finite&step={replay.NAN_STEP}"
    open_page(driver, dash_server, url.removeprefix(dash_server.url))
    focused = browser.wait_for(driver, "[...document.querySelectorAll('#findings tr.focus')].map(r => [r.dataset.kind, +r.dataset.step])",
                               what="the focused finding")
    assert focused == [["non_finite", replay.NAN_STEP]]
    first, last = browser.wait_for(
        driver, "window.dashboard.charts.loss && window.dashboard.charts.loss.points < 400"
                " && [window.dashboard.charts.loss.first, window.dashboard.charts.loss.last]", what="zoom to the finding")
    assert first < replay.NAN_STEP < last
    driver.save_screenshot(str(artifacts / "run-at-finding.png"))
    assert browser.console_errors(driver) == []
    # A finding's own link (the findings table's id) does the same by id.
    straggler = next(f for f in http.get(f"/v1/runs/{RUN}/findings").json() if f["kind"] == "straggler")
    open_page(driver, dash_server, f"/runs/{RUN}?finding={straggler['id']}")
    focused = browser.wait_for(driver, "[...document.querySelectorAll('#findings tr.focus')].map(r => r.id)",
                               what="the focused finding")
    assert focused == [f"finding-{straggler['id']}"]
    browser.wait_for(driver, f"window.dashboard.charts.loss.first <= {straggler['step']} && "
                             f"{straggler['step']} <= window.dashboard.charts.loss.last && window.dashboard.charts.loss.points < 400",
                     what="zoom to the straggler")


def test_acknowledge_from_the_page(driver, dash_server, http):
    open_page(driver, dash_server, f"/runs/{RUN}")
    browser.wait_for(driver, "document.querySelector('#alerts tr[data-fingerprint] .ack')", what="alert rows")
    fp = driver.execute_script("const tr = [...document.querySelectorAll('#alerts tr[data-fingerprint]')]"
                               ".find(r => r.innerText.includes('straggler')); tr.querySelector('.ack').click();"
                               " return tr.dataset.fingerprint")
    browser.poll(lambda: http.get(f"/v1/alerts/{fp}").json().get("acknowledged_at"), what="the alert acknowledged")
    assert "acknowledge: done" in browser.wait_for(driver, "document.getElementById('banner').innerText", what="banner")
    # Silence the NaN alert for 4 h: a silence matching exactly its identity labels.
    driver.execute_script("const tr = [...document.querySelectorAll('#alerts tr[data-fingerprint]')]"
                          ".find(r => r.innerText.includes('non_finite')); tr.querySelector('.sil-dur').value = '14400';"
                          " tr.querySelector('.silence').click()")
    silence = browser.poll(lambda: http.get("/v1/silences").json()["silences"], what="a silence")[0]
    assert {(m["name"], m["value"]) for m in silence["matchers"]} == {
        ("alertname", "non_finite"), ("run", RUN), ("rank", str(replay.NAN_RANK)), ("metric", "loss")}
    assert abs(silence["ends_at"] - silence["starts_at"] - 14400) < 1


def test_page_follows_a_live_run(driver, dash_server, http):
    open_page(driver, dash_server, f"/runs/{RUN}")
    assert driver.find_element("id", "run-last-step").text == str(N_STEPS - 1)
    replay.push_steps(http, RUN, http.trace, N_STEPS, N_STEPS + 50)
    browser.wait_for(driver, f"document.getElementById('run-last-step').innerText === '{N_STEPS + 49}'",
                     timeout_s=10, what="the header to show the new last step")
    browser.wait_for(driver, f"window.dashboard.charts.loss.last === {N_STEPS + 49}", timeout_s=10,
                     what="the curves to extend")
    assert browser.console_errors(driver) == []
