"""Run timeline: ordering, restarts, and world-size changes detected from who pushed."""
import json
import random

from healthsvc_detectors.finding import Finding
from healthsvc_detectors.offline.economics.records import Attempt, CheckpointWrite, Incident, RunEvent
from healthsvc_detectors.offline.economics.timeline import build_timeline


def elastic_run():
    attempts = [Attempt(0, 0.0, 1000.0, 0, 999, ranks=frozenset(range(8)), step_time_s=1.0),
                Attempt(1, 1100.0, 2000.0, 750, 1649, ranks=frozenset(range(6)), step_time_s=1.0)]
    ckpts = [CheckpointWrite(step=749, uri="c/749", written_at_s=750.0, duration_s=12.0),
             CheckpointWrite(step=999, uri="c/999", written_at_s=1000.0, duration_s=12.0)]
    findings = [(990.0, Finding(kind="hang", step=990, ranks=(6, 7), severity="critical"))]
    incidents = [Incident("restart", 1100.0, step=750, summary="attempt 1")]
    events = [RunEvent("rollback", 1095.0, step=749), RunEvent("note", 1500.0, reason="lr warmup done")]
    return dict(attempts=attempts, checkpoints=ckpts, findings=findings, incidents=incidents,
                events=events)


def test_entries_are_in_time_order_with_attempt_boundaries_around_their_contents():
    tl = build_timeline(**elastic_run(), per_rank_batch_size=16)
    assert [(e.kind, e.at_s) for e in tl.entries] == [
        ("attempt_started", 0.0), ("checkpoint", 750.0), ("finding", 990.0),
        # the checkpoint at the attempt's last second is inside the attempt
        ("checkpoint", 1000.0), ("attempt_ended", 1000.0),
        ("event", 1095.0), ("attempt_started", 1100.0), ("world_size_change", 1100.0),
        ("incident", 1100.0), ("event", 1500.0), ("attempt_ended", 2000.0)]
    restart = tl.entries[6]
    assert (restart.is_restart, restart.resumed_from_step, restart.downtime_s) == (True, 749, 100.0)
    assert tl.entries[1].attempt == 0 and tl.entries[9].attempt == 1
    d = tl.to_dict()
    assert (d["attempts"], d["restarts"], d["world_size_changes"]) == (2, 1, 1)
    json.dumps(d)


def test_input_order_does_not_change_the_timeline():
    run = elastic_run()
    expected = build_timeline(**run).to_dict()
    rng = random.Random(3)
    for _ in range(5):
        shuffled = {k: rng.sample(v, len(v)) for k, v in run.items()}
        assert build_timeline(**shuffled).to_dict() == expected


def test_world_size_change_is_detected_from_the_ranks_that_pushed():
    tl = build_timeline(**elastic_run(), per_rank_batch_size=16)
    (change,) = tl.of_kind("world_size_change")
    assert (change.source, change.old_world_size, change.new_world_size) == ("detected", 8, 6)
    assert (change.old_effective_batch_size, change.new_effective_batch_size) == (128, 96)
    assert change.ranks_lost == (6, 7) and change.ranks_added == ()
    assert (change.step, change.attempt) == (750, 1)


def test_a_trainer_event_is_not_duplicated_by_detection():
    run = elastic_run()
    run["events"] = run["events"] + [RunEvent("world_size_change", 1090.0, step=750,
                                              old_world_size=8, new_world_size=6)]
    (change,) = build_timeline(**run).of_kind("world_size_change")
    assert change.source == "event" and change.new_effective_batch_size is None


def test_same_world_size_after_restart_is_no_change_and_reported_size_wins_over_rank_count():
    same = [Attempt(0, 0.0, 10.0, 0, 9, ranks=frozenset(range(4))),
            Attempt(1, 20.0, 30.0, 5, 14, ranks=frozenset(range(4)))]
    assert build_timeline(attempts=same).of_kind("world_size_change") == []
    # a rank-0 aggregator pushes for everyone: one rank pushing, world size 8 reported
    aggregated = [Attempt(0, 0.0, 10.0, 0, 9, ranks=frozenset({0}), reported_world_size=8),
                  Attempt(1, 20.0, 30.0, 5, 14, ranks=frozenset({0}), reported_world_size=8)]
    assert build_timeline(attempts=aggregated).of_kind("world_size_change") == []


def test_first_attempt_is_compared_with_the_configured_world_size():
    tl = build_timeline(attempts=[Attempt(0, 0.0, 10.0, 0, 9, ranks=frozenset(range(12)))],
                        initial_world_size=16, per_rank_batch_size=4)
    (change,) = tl.of_kind("world_size_change")
    assert (change.old_world_size, change.new_world_size, change.new_effective_batch_size) == (16, 12, 48)
    assert tl.entries[0].effective_batch_size == 48
