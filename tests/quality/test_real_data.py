"""The quality gate: the real-data corpus (``../shared/quality``) replayed into a real server on
default settings, judged by the corpus's own ``score.py``; every case must pass.

The corpus holds real 4- and 8-rank ``torch.distributed`` trainings with injected faults and exact
labels, and public LLM loss curves (Pythia, modded-nanogpt). ``score.py`` replays each through the
public v1 HTTP contract and judges findings and rollback answers by the rules in its README. The
cases are independent (each under a fresh run id), so they run concurrently against one server to
keep CI short; the hang cases wait for real detection, the rest only for their replay.

Nothing here tunes the service: it runs on its defaults, as a user would start it.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.server_process import ServerProcess

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "quality"


def _score_module():
    path = CORPUS / "score.py"
    if not path.exists():
        pytest.fail(f"the quality corpus is missing: {path} (CI lays shared/ beside the checkout)")
    spec = importlib.util.spec_from_file_location("quality_score", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _trace_names() -> list[str]:
    traces = CORPUS / "traces"
    return sorted(p.name for p in traces.iterdir() if (p / "labels.json").exists()) if traces.exists() else []


def _curve_specs() -> list[dict]:
    path = CORPUS / "curves" / "curves.json"
    return json.loads(path.read_text())["curves"] if path.exists() else []


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, tuple[bool, str]]:
    """case name -> (passed, note) for every case of the corpus, scored on one default server."""
    score = _score_module()
    with ServerProcess(tmp_path_factory.mktemp("quality") / "quality.db") as server:
        svc = score.Service(server.url)
        jobs = [(score.judge_trace, score.TRACES / name) for name in _trace_names()]
        jobs += [(score.judge_curve, spec) for spec in _curve_specs()]
        # Slowest first (hangs wait for detection, long curves replay 143k steps) so the pool's
        # tail is short; four workers keep the 2-core machine busy without starving the server.
        jobs.sort(key=lambda j: (0 if "hang" in str(j[1]) else 1 if "pythia" in str(j[1]) else 2))
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = [r for rs in pool.map(lambda job: job[0](svc, job[1]), jobs) for r in rs]
    out = {name: (ok, note) for name, ok, note in results}
    print("\nreal-data quality corpus:")
    for name, (ok, note) in sorted(out.items()):
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {note}")
    print(f"  {sum(ok for ok, _ in out.values())} passed, {sum(not ok for ok, _ in out.values())} failed")
    return out


CASES = ([f"detect {n}" for n in _trace_names()]
         + [f"rollback {n}" for n in _trace_names()
            if n.split("_")[0] in ("clean", "nan", "sdc", "spike")]
         + [f"curve {c['name']}" for c in _curve_specs()])


@pytest.mark.parametrize("case", CASES)
def test_real_data_case_passes_on_default_settings(verdicts, case):
    assert case in verdicts, f"score.py produced no verdict for {case}"
    ok, note = verdicts[case]
    assert ok, f"{case}: {note}"


def test_the_whole_corpus_was_scored(verdicts):
    assert len(_trace_names()) >= 20 and len(_curve_specs()) >= 8, "the corpus looks truncated"
    assert set(verdicts) == set(CASES)
