"""Many silences stall nothing (issue 25, finding 1): a regex is compiled once, when its silence is
made; an alert is matched only against the silences that can match it; and the silences not yet
expired are capped, with a 422 that says the limit and how to free room."""
from __future__ import annotations

import json
import time

import httpx

from healthsvc_detectors.finding import Finding
from healthsvc.alerting import policy
from healthsvc.alerting.model import fire
from healthsvc.alerting.policy import Matcher, Silence
from healthsvc.settings import Settings
from tests.alerting.receiver import Receiver
from tests.server_process import ServerProcess

LIMIT = Settings().alert_max_silences
NOW = 1_700_000_000.0


def long_pattern(i: int) -> str:
    """A long alternation (133 characters), distinct per silence, like the issue's 141-character ones."""
    return f"exp{i:05d}-(" + "|".join(f"shard{j:02d}" for j in range(15)) + ")-.*"


def alerts(n_runs: int) -> list:
    return [fire(None, Finding("non_finite", step=1, metric="loss", ranks=(0,), severity="critical"), f"r{i}", (None,),
                 now=NOW) for i in range(n_runs)]


def test_matching_compiles_nothing_however_many_silences(monkeypatch):
    """Past the old 1,024-pattern cache every evaluation compiled each regex again: twice the
    limit's worth of regex silences, matched twice, compile nothing after they are made."""
    import re2
    silences = [Silence(f"sil_{i}", (Matcher("run", long_pattern(i), "=~"),), NOW - 1, NOW + 3600)
                for i in range(2 * LIMIT)]
    compiled = []
    real = re2.compile
    monkeypatch.setattr(re2, "compile", lambda *a, **k: compiled.append(a[0]) or real(*a, **k))
    for _ in range(2):
        assert policy.silenced(alerts(3), silences, NOW) == set()
    assert compiled == []


def test_an_alert_is_matched_only_against_the_silences_that_can_match_it(monkeypatch):
    """The limit's worth of silences, each naming its run exactly and a regex: an alert of one
    run evaluates that run's silence only (it was every silence's first matcher, per alert)."""
    silences = [Silence(f"sil_{i}", (Matcher("run", f"r{i}"), Matcher("alertname", "non_.*", "=~")), NOW - 1, NOW + 3600)
                for i in range(LIMIT)]
    evaluated = []
    real = Matcher.matches
    monkeypatch.setattr(Matcher, "matches", lambda self, labels: evaluated.append(self) or real(self, labels))
    muted = policy.silenced(alerts(3), silences, NOW)
    assert len(muted) == 3
    assert len(evaluated) == 3 * 2     # per alert: its run's silence, both matchers


def test_the_limit_worth_of_silences_delays_no_page_and_one_more_is_refused(tmp_path):
    with Receiver() as rx:
        env = {"HEALTHSVC_ALERT_WEBHOOKS": json.dumps([{"id": "oncall", "url": rx.url, "format": "json"}])}
        limit = LIMIT   # the default
        with ServerProcess(tmp_path / "s.db", env=env) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            for i in range(limit):   # two matchers each, one a long regex: the silences
                r = c.post("/v1/silences", json={"matchers": [{"name": "run", "value": long_pattern(i), "op": "=~"},
                                                              {"name": "alertname", "value": "stall"}],
                                                 "duration_s": 3600})
                assert r.status_code == 201, r.text
            refused = c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "x"}], "duration_s": 60})
            assert refused.status_code == 422, refused.text
            msg = refused.json()["detail"][0]["msg"]
            assert f"at most {limit} silences" in msg and "alert_max_silences" in msg and "DELETE /v1/silences" in msg
            # Expiring one frees room.
            first = c.get("/v1/silences").json()["silences"][0]["id"]
            assert c.delete(f"/v1/silences/{first}").status_code == 200
            assert c.post("/v1/silences", json={"matchers": [{"name": "run", "value": "x"}],
                                                "duration_s": 60}).status_code == 201
            started = time.monotonic()
            assert c.post("/v1/runs/r1/metrics", json={"records": [{"step": 0, "rank": 0, "loss": "NaN"}]}).status_code == 202
            rx.wait_for(1, timeout_s=30)
            # A critical page goes out at once (group_wait 0); 5 s is generous on a loaded machine.
            assert time.monotonic() - started < 5.0
            assert c.get("/v1/alerts").json()["alerts"][0]["silenced_by"] == []


def test_a_replica_reload_compiles_only_new_silences(monkeypatch):
    """Replicas read the silences again at every tick: unchanged ones are not parsed again."""
    import re2
    from healthsvc.alerting.silences import Silences
    stored = {f"sil_{i}": Silence(f"sil_{i}", (Matcher("run", long_pattern(i), "=~"),), NOW, NOW + 60).to_dict()
              for i in range(50)}
    s = Silences()
    s.reload(stored)
    new = Silence("sil_new", (Matcher("run", "new-.*", "=~"),), NOW, NOW + 60).to_dict()
    compiled = []
    real = re2.compile
    monkeypatch.setattr(re2, "compile", lambda *a, **k: compiled.append(a[0]) or real(*a, **k))
    for _ in range(3):
        s.reload(stored)
    assert compiled == []
    stored["sil_new"] = new
    del stored["sil_0"]
    s.reload(stored)
    assert compiled == ["new-.*"] and len(s) == 50 and s.get("sil_0") is None


def test_a_stored_silence_this_release_cannot_parse_mutes_nothing_and_stops_nothing(caplog):
    """Before RE2 a silence could hold a backreference: its database must still start."""
    from healthsvc.alerting.silences import Silences
    good = Silence("sil_ok", (Matcher("run", "r1"),), NOW - 1, NOW + 60).to_dict()
    old = {**good, "id": "sil_old", "matchers": [{"name": "run", "value": "(a)\\1", "op": "=~"}]}
    s = Silences()
    for _ in range(2):   # replicas reload every tick: said once
        s.reload({"sil_ok": good, "sil_old": old})
    assert [x.id for x in s.values()] == ["sil_ok"]
    assert s.matching({"run": "r1"}, NOW) == ["sil_ok"]
    said = [r for r in caplog.records if "sil_old" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"
