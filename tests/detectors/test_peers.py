"""PeerDeviation: each rank against its peers, by its own history (any world size from 2)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from healthsvc_detectors.peers import PeerDeviation


def trace(n_steps: int, n_ranks: int, seed: int = 0, offsets=None, noise: float = 0.05) -> np.ndarray:
    """Log values: a shared decreasing curve, per-rank micro-batch noise and normal offsets."""
    rng = np.random.default_rng(seed)
    curve = np.log(2.0 + 3.0 / np.sqrt(1.0 + np.arange(n_steps) / 50.0))[:, None]
    off = np.zeros(n_ranks) if offsets is None else np.asarray(offsets, dtype=float)
    return (curve + off[None, :] + rng.normal(0.0, noise, (n_steps, n_ranks))).astype(np.float32)


def run(pd: PeerDeviation, y: np.ndarray, cuts=(), valid=None):
    steps = np.arange(1, len(y) + 1)
    zs, rises = [], []
    for a, b in zip([0, *cuts], [*cuts, len(y)]):
        z, rise = pd.update(y[a:b], None if valid is None else valid[a:b], steps[a:b])
        zs.append(z)
        rises.append(rise)
    return np.vstack(zs), np.vstack(rises)


@pytest.mark.parametrize("n_ranks", [2, 3, 4, 16])
def test_a_jump_on_one_rank_stands_out_at_any_world_size(n_ranks):
    y = trace(400, n_ranks, seed=n_ranks)
    y[300, 1] += np.log(2.0)                         # one rank's value doubles for one step
    z, rise = run(PeerDeviation(), y)
    assert int(np.nanargmax(z[300])) == 1 and z[300, 1] > 8
    if n_ranks == 2:
        # Two ranks mirror each other (each one's centre is the other): its rise over its one
        # peer is the whole jump, and the peer's is the same jump downwards.
        assert rise[300, 1] == pytest.approx(np.log(2.0), abs=0.15) and z[300, 0] < -8
    else:
        assert rise[300, 1] == pytest.approx(np.log(2.0), abs=0.15)
        # Its peers are not dragged the other way (the centre is taken again without it).
        assert np.nanmax(np.abs(np.delete(z[300], 1))) < 4


def test_normal_offsets_are_learned_not_flagged():
    y = trace(2_000, 4, seed=1, offsets=[0.0, 0.1, -0.1, 0.05])    # ranks sit 10 % apart
    z, _ = run(PeerDeviation(), y)
    assert np.nanmax(np.abs(z[200:])) < 5.5
    assert abs(np.nanmean(z[500:])) < 0.1


def test_first_values_are_learned_not_judged():
    z, _ = run(PeerDeviation(warmup_steps=50), trace(100, 4))
    assert np.isnan(z[:50]).all() and np.isfinite(z[64:]).all()


def test_a_wild_lasting_fault_is_not_absorbed_and_the_scale_does_not_collapse():
    y = trace(1_500, 4, seed=2)
    y[800:, 3] += np.log(3.0)                        # a corrupted rank: 3x from step 800 on
    pd = PeerDeviation()
    z, _ = run(pd, y)
    assert np.nanmin(z[1_400:, 3]) > 10              # still 3x its usual place 600 steps later
    sd = pd.table["mean_abs"] * 1.2533
    assert (sd > 0.03).all() and (sd < 0.08).all()   # every rank's scale near the true 0.05*sqrt(...)


def test_one_rank_has_no_peers():
    z, rise = run(PeerDeviation(), trace(100, 1))
    assert np.isnan(z).all() and np.isnan(rise).all()


def test_missing_cells_neither_count_nor_move_anything():
    y = trace(300, 4, seed=3)
    valid = np.ones(y.shape, dtype=bool)
    valid[150:200, 2] = False
    holey = y.copy()
    holey[150:200, 2] = 1e6                          # garbage where not reported
    z, _ = run(PeerDeviation(), holey, valid=valid)
    assert np.isnan(z[150:200, 2]).all() and np.nanmax(np.abs(z[200:])) < 6


@pytest.mark.parametrize("cuts", [(), (1,), (7, 8, 9), (33, 100, 161, 250), tuple(range(5, 400, 13))])
def test_any_split_of_the_input_gives_the_same_numbers(cuts):
    y = trace(400, 5, seed=4)
    y[250:255, 0] += 1.5
    z0, r0 = run(PeerDeviation(), y)
    z1, r1 = run(PeerDeviation(), y, cuts=cuts)
    np.testing.assert_array_equal(z0, z1)
    np.testing.assert_array_equal(r0, r1)


def test_state_round_trips_through_json_mid_period():
    y = trace(300, 4, seed=5)
    whole, _ = run(PeerDeviation(), y)
    a = PeerDeviation()
    steps = np.arange(1, 301)
    first, _ = a.update(y[:157], None, steps[:157])
    b = PeerDeviation()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    second, _ = b.update(y[157:], None, steps[157:])
    np.testing.assert_array_equal(np.vstack([first, second]), whole)
