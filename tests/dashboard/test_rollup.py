"""The dashboard rollup and its downsampling: what the curves and the heatmap are built from."""
from __future__ import annotations

import numpy as np

from healthsvc_detectors.frame import StepBlock
from healthsvc.dashboard.downsample import bucket_envelope, lttb, rebin_heat
from healthsvc.dashboard.rollup import MAX_RANK_BINS, MAX_STEP_BINS, RunRollup


def block(steps, n_ranks, slow_rank=None, nan_at=None, seed=0):
    rng = np.random.default_rng(seed)
    steps = np.asarray(steps)
    ct = 0.4 * (1 + 0.02 * rng.standard_normal((len(steps), n_ranks)))
    if slow_rank is not None:
        ct[:, slow_rank] *= 2.0
    loss = 3.0 + 0.1 * rng.standard_normal((len(steps), n_ranks))
    if nan_at is not None:
        loss[nan_at] = np.nan
    return StepBlock.from_dense(steps, np.arange(n_ranks), loss=loss, compute_time=ct)


def test_median_band_and_nonfinite_count_per_step():
    r = RunRollup()
    b = block(range(16), 8, nan_at=(5, 3))
    r.add_block(b)
    st = r.lines["loss"]
    finite = np.where(np.isfinite(b.values["loss"]), b.values["loss"], np.nan)
    assert np.allclose(st["median"][:16], np.nanmedian(finite, axis=1), rtol=1e-6)
    assert np.allclose(st["max"][:16], np.nanmax(finite, axis=1), rtol=1e-6)
    assert st["nonfinite"][:16].tolist() == [0] * 5 + [1] + [0] * 10  # the NaN is counted, not dropped
    assert st["reported"][:16].tolist() == [8] * 16 and r.last_step == 15


def test_heatmap_keeps_one_slow_rank_visible_among_many():
    r = RunRollup()
    for s0 in range(0, 64, 16):
        r.add_block(block(range(s0, s0 + 16), 4096, slow_rank=1234, seed=s0))
    grid = r.heat["compute_time"]
    assert grid.rank_width == 16  # 4096 ranks in 256 rows
    mean, _ = rebin_heat(grid.sums, grid.counts, 0, grid.sums.shape[1], 10)
    row = np.nanargmax(np.nanmean(mean, axis=1))
    assert row == 1234 // 16 and np.nanmean(mean[row]) > 1.9
    assert np.nanmax(np.delete(mean, row, axis=0)) < 1.2


def test_grids_stay_bounded_as_runs_grow():
    r = RunRollup()
    r.add_block(block(range(16), 8, slow_rank=2))
    r.add_block(block([MAX_STEP_BINS * 3], 600, slow_rank=2))  # far later, and more ranks (elastic)
    grid = r.heat["compute_time"]
    assert grid.sums.shape[0] == MAX_RANK_BINS and grid.sums.shape[1] <= MAX_STEP_BINS
    assert grid.step_width == 4 and grid.rank_width == 4
    assert np.nanmax(grid.sums[0, :4] / np.maximum(grid.counts[0, :4], 1)) > 1.9  # rank 2 still hot (row 0)


def test_new_attempt_truncates_and_snapshot_round_trips():
    r = RunRollup()
    r.add_block(block(range(32), 8))
    r.truncate(20)
    assert r.last_step == 19 and r.lines["loss"]["reported"][20:32].sum() == 0
    r2 = RunRollup.from_bytes(r.to_bytes())
    assert r2.last_step == 19
    assert np.array_equal(r2.lines["loss"]["median"][:20], r.lines["loss"]["median"][:20])
    assert np.array_equal(r2.heat["compute_time"].sums, r.heat["compute_time"].sums)


def _every_array(r: RunRollup) -> dict[str, np.ndarray]:
    out = {f"line:{f}:{k}": a for f, st in r.lines.items() for k, a in st.items()}
    for f, g in r.heat.items():
        out.update({f"heat:{f}:sums": g.sums, f"heat:{f}:counts": g.counts,
                    f"heat:{f}:widths": np.array([g.rank_width, g.step_width])})
    return out


def test_a_grown_runs_snapshot_gives_back_every_array_writable_and_folding_goes_on_alike():
    r = RunRollup()
    for s0 in range(0, 3 * MAX_STEP_BINS, 512):   # past the grid's width: bins widened
        r.add_block(block(range(s0, s0 + 512, 8), 300, slow_rank=7, nan_at=(3, 5), seed=s0))
    r2 = RunRollup.from_bytes(r.to_bytes())
    before, after = _every_array(r), _every_array(r2)
    assert before.keys() == after.keys() and r.heat["compute_time"].step_width > 1
    for name, arr in before.items():
        assert after[name].dtype == arr.dtype and np.array_equal(after[name], arr, equal_nan=True), name
    assert (r2.n_steps, r2.max_rank, r2.steps_seen, r2.last_step) == (r.n_steps, r.max_rank, r.steps_seen, r.last_step)
    nxt = block(range(3 * MAX_STEP_BINS, 3 * MAX_STEP_BINS + 64, 4), 300, seed=99)
    r.add_block(nxt)
    r2.add_block(nxt)   # writes into the restored arrays
    for name, arr in _every_array(r).items():
        assert np.array_equal(_every_array(r2)[name], arr, equal_nan=True), name


def test_an_empty_rollup_round_trips():
    r2 = RunRollup.from_bytes(RunRollup().to_bytes())
    assert r2.n_steps == 0 and r2.heat == {} and all(len(a) == 0 for st in r2.lines.values() for a in st.values())


def test_a_snapshot_written_before_the_arrays_were_compressed_one_by_one_still_loads():
    """What to_bytes wrote until December 2026: numpy's deflated npz of the arrays as they are."""
    import io
    r = RunRollup()
    r.add_block(block(range(40), 16, slow_rank=3, nan_at=(2, 1)))
    arrays = {"meta": np.array([r.n_steps, r.max_rank, r.steps_seen, r.last_step], np.int64)}
    for f, st in r.lines.items():
        arrays.update({f"line:{f}:{k}": a for k, a in st.items()})
    for f, g in r.heat.items():
        arrays.update({f"heat:{f}:widths": np.array([g.rank_width, g.step_width], np.int64),
                       f"heat:{f}:sums": g.sums, f"heat:{f}:counts": g.counts})
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    r2 = RunRollup.from_bytes(buf.getvalue())
    for name, arr in _every_array(r).items():
        assert np.array_equal(_every_array(r2)[name], arr, equal_nan=True), name


def test_lttb_keeps_a_spike_and_the_envelope_its_extremes():
    x = np.arange(10_000)
    y = np.sin(x / 300.0)
    y[7777] = 50.0
    idx = lttb(x, y, 300)
    assert len(idx) == 300 and 7777 in idx and idx[0] == 0 and idx[-1] == 9999
    assert (np.diff(idx) > 0).all()
    lo, hi = bucket_envelope(y - 1, y + 1, 300)
    assert np.nanmax(hi) == 51.0 and np.isclose(np.nanmin(lo), -2.0, atol=1e-3)
    assert len(lo) == 300


def test_the_rows_medians_are_numpys_whatever_the_block():
    # The rollup's median (one partition, then the largest value left of the upper middle) must
    # give np.median's numbers exactly: odd and even widths, one and two ranks, ties, large values.
    from healthsvc.dashboard.rollup import _median_of_rows
    rng = np.random.default_rng(3)
    for trial in range(500):
        rows, width = int(rng.integers(1, 20)), int(rng.integers(1, 300))
        v = rng.standard_normal((rows, width)) * 10.0 ** int(rng.integers(-3, 300))
        if trial % 3 == 0:
            v = np.round(v)   # ties
        assert np.array_equal(_median_of_rows(v), np.median(v, axis=1)), (rows, width)


def test_a_heat_grid_adds_each_steps_bins_to_its_column_whatever_the_block():
    # HeatGrid.add by slices (consecutive columns), by index (gaps) or summing steps that share a
    # column first (wide step bins): each cell gets the sum of its steps' values and counts.
    from healthsvc.dashboard.rollup import HeatGrid
    rng = np.random.default_rng(6)
    for trial in range(200):
        grid, want_s, want_c = HeatGrid(step_width=int(rng.choice([1, 2, 4]))), {}, {}
        grid.fit_ranks(MAX_RANK_BINS)   # what RunRollup asks of a grid before it adds
        for _ in range(int(rng.integers(1, 5))):
            steps = np.sort(rng.choice(300, int(rng.integers(1, 12)), replace=False)) if trial % 2 else \
                np.arange(s0 := int(rng.integers(0, 300)), s0 + int(rng.integers(1, 12)))
            bins = rng.uniform(0.5, 2.0, (len(steps), MAX_RANK_BINS)).astype(np.float32)
            bins[rng.random(bins.shape) < 0.3] = np.nan
            grid.add(steps, bins)
            for i, step in enumerate(steps.tolist()):
                col = step // grid.step_width
                ok = np.isfinite(bins[i])
                want_s[col] = want_s.get(col, 0) + np.where(ok, bins[i], 0).astype(np.float64)
                want_c[col] = want_c.get(col, 0) + ok
        for col in range(grid.sums.shape[1]):
            np.testing.assert_allclose(grid.sums[:, col], want_s.get(col, np.zeros(MAX_RANK_BINS)), rtol=1e-5)
            assert np.array_equal(grid.counts[:, col], want_c.get(col, np.zeros(MAX_RANK_BINS)))


def test_the_heat_bins_maxima_are_numpys_whatever_the_width():
    # The heat's max over each bin's ranks (pairwise maxima) must be ``max(axis=2)``'s numbers:
    # every width a grid can have (and odd ones, from any snapshot), NaN and the no-rank marker.
    from healthsvc.dashboard.rollup import _NO_RANK, _max_of_bins
    rng = np.random.default_rng(4)
    for width in (1, 2, 3, 4, 6, 8, 16, 64, 256):
        for _ in range(20):
            x = rng.uniform(0.1, 5.0, (int(rng.integers(1, 5)), MAX_RANK_BINS, width)).astype(np.float32)
            x[rng.random(x.shape) < 0.3] = _NO_RANK
            x[rng.random(x.shape) < 0.02] = np.nan
            assert np.array_equal(_max_of_bins(x), x.max(axis=2), equal_nan=True), width


def test_a_blocks_heat_is_the_ranks_scattered_into_their_bins_whatever_ranks_it_holds():
    # The heat takes a block of ranks 0..n-1 by a slice of the row (n the row's width or less)
    # and other ranks by index: either way each bin holds the largest ratio to the step's median
    # of its ranks (numpy's scatter and max over the bins, computed here), NaN where none reported.
    rng = np.random.default_rng(8)
    for trial in range(60):
        n_ranks = int(rng.choice([1, 2, 5, 256, 300, 512, 1024, 1500]))
        ranks = np.arange(n_ranks) if trial % 3 else np.sort(rng.choice(2 * n_ranks, n_ranks, replace=False))
        steps = np.arange(10 * trial, 10 * trial + int(rng.integers(1, 20)))
        ct = rng.uniform(0.5, 2.0, (len(steps), n_ranks))
        present = rng.random(ct.shape) > 0.1
        ct[rng.random(ct.shape) < 0.05] = np.nan
        r = RunRollup()
        r.add_block(StepBlock(steps, ranks, {"compute_time": ct}, {"compute_time": present}))
        assert_heat_is_the_row_by_row_ratio(r.heat["compute_time"], ct, present, steps, ranks, trial)


def test_a_blocks_lines_and_heat_are_the_masked_statistics_whether_or_not_every_value_counts():
    # A block whose every value is reported, finite and positive (the usual one) is folded
    # without masks; any other by them. Either way each step's line is the median, min and max
    # of its reported finite values with their counts, and its heat each bin's largest ratio of a
    # reported finite positive value to their median (float32, rounded once): computed here
    # row by row, for blocks of every kind (one NaN, an infinity, a zero or negative value, a
    # missing value, huge ratios) over widths below, at and above the grid's 256 bins.
    rng = np.random.default_rng(11)
    kinds = ("clean", "nan", "inf", "-inf", "negative", "zero", "missing", "huge")
    for trial in range(96):
        kind = kinds[trial % len(kinds)]
        n_ranks = int(rng.choice([1, 2, 3, 64, 256, 300, 1024]))
        ranks = np.arange(n_ranks) if trial % 5 else np.sort(rng.choice(3 * n_ranks, n_ranks, replace=False))
        steps = np.arange(20 * trial, 20 * trial + int(rng.integers(1, 18)))
        values, present = {}, {}
        for f in ("loss", "grad_norm", "step_time", "compute_time"):
            v = rng.uniform(0.5, 2.0, (len(steps), n_ranks)) * 10.0 ** int(rng.integers(-4, 4))
            p = np.ones(v.shape, bool)
            cell = (int(rng.integers(len(steps))), int(rng.integers(n_ranks)))
            if f in ("step_time", "compute_time") or rng.random() < 0.5:
                if kind == "missing":
                    p[cell] = False
                elif kind == "huge":
                    v[cell] = 1e308 if rng.random() < 0.5 else 1e-300
                elif kind != "clean":
                    v[cell] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "negative": -v[cell], "zero": 0.0}[kind]
            values[f], present[f] = v, p
        r = RunRollup()
        with np.errstate(all="ignore"):
            r.add_block(StepBlock(steps, ranks, {f: v.copy() for f, v in values.items()},
                                  {f: p.copy() for f, p in present.items()}))
        for f in ("loss", "grad_norm", "step_time"):
            v, p = values[f], present[f]
            ok = p & np.isfinite(v)
            st = {k: a[steps] for k, a in r.lines[f].items()}
            for i in range(len(steps)):
                row = v[i][ok[i]]
                want = (np.median(row), row.min(), row.max()) if len(row) else (np.nan, np.nan, np.nan)
                got = (st["median"][i], st["min"][i], st["max"][i])
                with np.errstate(over="ignore"):   # 1e308 is inf in float32, there as here
                    want = np.array(want, np.float32)
                assert np.array_equal(np.array(got), want, equal_nan=True), (trial, kind, f, i)
            assert np.array_equal(st["nonfinite"], (p & ~np.isfinite(v)).sum(axis=1)), (trial, kind, f)
            assert np.array_equal(st["reported"], p.sum(axis=1)), (trial, kind, f)
        for f in ("step_time", "compute_time"):
            assert_heat_is_the_row_by_row_ratio(r.heat[f], values[f], present[f], steps, ranks, (trial, kind, f))


def assert_heat_is_the_row_by_row_ratio(grid, v, present, steps, ranks, what) -> None:
    """Each heat bin of each step holds the largest ratio of a reported finite positive value of
    its ranks to the step's median of those (float32; empty bins count 0), computed row by row."""
    with np.errstate(invalid="ignore"):
        ok = present & np.isfinite(v) & (v > 0)
    med = np.array([np.median(row[m]) if m.any() else np.nan for row, m in zip(v, ok)])
    full = np.full((len(steps), grid.rank_width * MAX_RANK_BINS), -1.0, np.float32)
    with np.errstate(all="ignore"):
        full[:, ranks] = np.where(ok, v / med[:, None], -1.0)
    want = full.reshape(len(steps), MAX_RANK_BINS, grid.rank_width).max(axis=2)
    want[want == -1.0] = np.nan
    cols = steps // grid.step_width
    # The grid holds rows up to the highest rank's bin (a power of two of them), no more.
    rows = len(grid.sums)
    assert rows == min(MAX_RANK_BINS, 1 << int(np.ceil(np.log2(ranks.max() // grid.rank_width + 1)))), what
    assert np.isnan(want[:, rows:]).all(), what
    want = want[:, :rows]
    assert np.array_equal(grid.counts[:, cols].T, np.isfinite(want).astype(np.float32)), what
    assert np.array_equal(grid.sums[:, cols].T, np.where(np.isfinite(want), want, 0.0)), what
