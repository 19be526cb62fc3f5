"""``loss_spike`` and ``grad_spike``: a sudden jump above a robust baseline that follows the curve.

Two views of one metric, both in log space (a spike is a *ratio* above normal):

1. **The job**: the per-step median across ranks (``metric``: the loss, or the global
   ``grad_norm``) against a :class:`~healthsvc_detectors.stats.trend.RobustTrend` baseline (level + trend, so it
   follows a decreasing training curve; robust scale; warm-up). A step is a spike when its
   residual exceeds ``z_threshold`` robust standard deviations *and* the value is at least
   ``min_rise`` above the baseline (``0.1`` = 10 %). The level learns only values judged normal;
   the scale learns every value outside an episode, clipped, so it can neither collapse to its
   floor nor be widened by a spike. The finding blames the ranks that stand out from their usual
   place among their peers at that step when they are few (at most ``blame_fraction``).
2. **Single ranks**: each rank's ``rank_metric`` (the loss, or ``local_grad_norm``) against the
   cross-rank median, judged by the rank's own history of deviating from its peers
   (:class:`~healthsvc_detectors.peers.PeerDeviation`), so a 2-, 4- or 16,384-rank job needs no tuning and a
   rank's normal offset is not a spike. A rank more than ``rank_z_threshold`` of its own sds and
   ``rank_min_rise`` above where it usually sits, while the job as a whole did not spike, is
   reported with its rank named. With two ranks the deviations mirror; the one that rose is named.

**Severity means something** (the same policy in both views):

| what happened | severity |
|---|---|
| a spike that recovers within ``confirm_steps`` observed steps | ``info`` (recorded, no page) |
| the loss at least ``large_ratio`` x its baseline (2x), or back at its initialisation level | ``warning`` at once |
| a spike still not recovered after ``confirm_steps`` | ``warning`` (``evidence.reason = "lasting"``) |
| gradient norm only (``leading_signal``): the loss follows within ``follow_steps`` (+``follow_rise``) | ``warning`` (``"loss followed"``) |
| gradient norm only: the ``recur_count``-th spike within ``recur_window_steps`` | ``warning`` (``"recurring"``) |
| after ``escalate_steps`` still at least half its peak rise above the baseline | ``critical`` (``evidence.escalated``) |

Recovery (the residual below ``exit_z`` sds, or the rise below half of ``min_rise``) emits a
``resolved`` finding (``info``). A shift that lasts ``rebaseline_steps`` is taken as the new normal:
the baseline re-anchors and a ``resolved`` finding says so (``evidence.reason``). A large gradient
norm jump on its own stays ``info``: early in training a 3-4x jump for one step is normal.

Score: ``(z - z_threshold) / z_threshold`` clipped to [0, 1]: 0 at the threshold, 1 at twice it.

>>> from simulation import simulate_run, LossSpike
>>> run = simulate_run(n_steps=1_500, n_ranks=32, seed=3, faults=[LossSpike(step=1200, factor=1.5)])
>>> [(f.kind, f.step, f.severity, f.status) for f in LossSpikeDetector().update(run.block)]
[('loss_spike', 1200, 'info', 'firing'), ('loss_spike', 1201, 'info', 'resolved')]
>>> run = simulate_run(n_steps=1_500, n_ranks=32, seed=3, faults=[LossSpike(step=1200, factor=3.0)])
>>> [(f.kind, f.step, f.severity, f.status) for f in LossSpikeDetector().update(run.block)]
[('loss_spike', 1200, 'warning', 'firing'), ('loss_spike', 1201, 'info', 'resolved')]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from healthsvc_detectors.base import BlockDetector, Detector
from healthsvc_detectors.finding import Finding
from healthsvc_detectors.kinds import Kind
from healthsvc_detectors.frame import StepBlock
from healthsvc_detectors.peers import PeerDeviation
from healthsvc_detectors.spike.job import JobJudging
from healthsvc_detectors.spike.ranks import RankJudging, _RankView
from healthsvc_detectors.stats.cross_section import ReferenceRanks, cross_section
from healthsvc_detectors.stats.rank_table import RankTable
from healthsvc_detectors.stats.scales import log_positive
from healthsvc_detectors.stats.trend import RobustTrend


class SpikeDetector(JobJudging, RankJudging, Detector, BlockDetector):
    """Sudden jumps of ``metric`` (job-wide) and ``rank_metric`` (per rank); see the module doc.

    Parameters (log-space quantities are natural-log units; 0.01 ~ 1 %)
    ----------
    kind: finding kind, ``"loss_spike"`` or ``"grad_spike"``.
    metric: the job-wide series (its cross-rank median per step is the signal).
    rank_metric: the per-rank series compared across ranks (None: no per-rank view).
    z_threshold: residual, in robust sds of the baseline, above which a step is a spike.
    min_rise: the value must also be at least this fraction above the baseline.
    exit_z: the spike has recovered when the residual falls below this many sds.
    warmup_steps: observed steps learned before judging (the baseline settles meanwhile).
    alpha, beta, scale_alpha, min_scale: baseline gains and scale floor (see RobustTrend).
    confirm_steps: observed steps a spike may last and still be transient (``info``).
    large_ratio: a value at least this many times its baseline (or back at the first value of the
        run, once the curve has fallen well below it) is a ``warning`` at once; None: never (a
        gradient norm's size alone says little).
    follow_metric, follow_steps, follow_rise: a spike of ``metric`` is a ``warning`` when the job
        median of ``follow_metric`` rises ``follow_rise`` above its level at the spike within
        ``follow_steps`` steps (None: off).
    recur_count, recur_window_steps: the ``recur_count``-th spike within ``recur_window_steps``
        steps is a ``warning`` (None: off).
    escalate_steps: observed steps without recovery after which the spike turns critical (if it
        is still at least half its peak rise above the baseline).
    rebaseline_steps: observed steps after which a lasting shift becomes the new baseline.
    rank_z_threshold, rank_min_rise, rank_exit_z, rank_min_scale: the per-rank view's entry
        threshold (the rank's own sds of its deviation from its peers), minimum rise above where
        it usually sits, exit threshold and scale floor (log units).
    rank_warmup_steps: values of a rank learned before its deviations are judged.
    blame_fraction: at most this share of ranks may stand out for a job-wide spike to name them.
    max_reference_ranks: ranks (chosen by id) used to estimate the cross-rank median.
    min_ranks: fewest valid ranks for a per-rank judgement at a step (2: any job with peers).
    leading_signal: mark findings as a leading signal (the gradient norm leads the loss).
    """

    kind = "loss_spike"

    def __init__(self, kind: str = "loss_spike", metric: str = "loss",
                 rank_metric: str | None = "loss", z_threshold: float = 6.0,
                 min_rise: float = 0.1, exit_z: float = 2.0, warmup_steps: int = 50,
                 alpha: float = 0.1, beta: float = 0.1, scale_alpha: float = 0.02,
                 min_scale: float = 0.005, confirm_steps: int = 5,
                 large_ratio: float | None = 2.0, follow_metric: str | None = None,
                 follow_steps: int = 5, follow_rise: float = 0.1,
                 recur_count: int | None = None, recur_window_steps: int = 50,
                 escalate_steps: int = 20, rebaseline_steps: int = 200,
                 rank_z_threshold: float = 8.0, rank_min_rise: float = 0.5,
                 rank_exit_z: float = 3.0, rank_min_scale: float = 0.01,
                 rank_warmup_steps: int = 50, blame_fraction: float = 0.25,
                 max_reference_ranks: int = 256, min_ranks: int = 2,
                 leading_signal: bool = False) -> None:
        if kind not in ("loss_spike", "grad_spike"):
            raise ValueError(f"SpikeDetector kind must be 'loss_spike' or 'grad_spike', got {kind!r}")
        if min_ranks < 2:
            raise ValueError(f"min_ranks must be >= 2 (a rank needs a peer), got {min_ranks}")
        self.kind = kind
        self.metric, self.rank_metric = metric, rank_metric
        self.z_threshold, self.min_rise, self.exit_z = z_threshold, min_rise, exit_z
        self.warmup_steps = warmup_steps
        self.alpha, self.beta, self.scale_alpha, self.min_scale = alpha, beta, scale_alpha, min_scale
        self.confirm_steps, self.large_ratio = confirm_steps, large_ratio
        self.follow_metric, self.follow_steps, self.follow_rise = follow_metric, follow_steps, follow_rise
        self.recur_count, self.recur_window_steps = recur_count, recur_window_steps
        self.escalate_steps, self.rebaseline_steps = escalate_steps, rebaseline_steps
        self.rank_z_threshold, self.rank_min_rise = rank_z_threshold, rank_min_rise
        self.rank_exit_z, self.rank_min_scale = rank_exit_z, rank_min_scale
        self.rank_warmup_steps = rank_warmup_steps
        self.blame_fraction = blame_fraction
        self.max_reference_ranks, self.min_ranks = max_reference_ranks, min_ranks
        self.leading_signal = leading_signal
        super().__init__()

    def peer_deviations(self) -> dict[str, PeerDeviation]:
        """The per-rank trackers by metric (the suite may share one with another detector)."""
        return {} if self.rank_metric is None else {self.rank_metric: self._peers}

    def use_peer_deviation(self, metric: str, tracker: PeerDeviation) -> None:
        if metric == self.rank_metric:
            self._peers = tracker

    def _reset(self) -> None:
        self._reference = ReferenceRanks(self.max_reference_ranks)
        self._trend = RobustTrend(alpha=self.alpha, beta=self.beta, scale_alpha=self.scale_alpha,
                                  warmup_steps=self.warmup_steps, min_scale=self.min_scale)
        self._episode: dict[str, Any] | None = None   # the job-wide spike in progress
        self._first: float | None = None               # the first job value (initialisation level)
        self._starts: list[int] = []                    # steps of recent job-wide spikes
        self._follow: dict[str, Any] | None = None      # a leading spike whose consequence we await
        if getattr(self, "_peers", None) is not None and self._peers.shared:
            self._peers.reset()
        else:
            self._peers = PeerDeviation(warmup_steps=self.rank_warmup_steps, min_scale=self.rank_min_scale)
        self._ranks = RankTable({"active": False, "run": 0, "covered": False, "warned": False,
                                 "peak": 0.0})

    # ------------------------------------------------------------------------------- update
    def update(self, block: StepBlock) -> list[Finding]:
        if block.n_steps == 0:
            return []
        # NaN rows (nobody reported) flow through the arithmetic on purpose: one errstate here
        # instead of one per operation (each costs microseconds on one-step blocks).
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self._update(block)

    def _update(self, block: StepBlock) -> list[Finding]:
        n = block.n_steps
        ref = self._reference(block.ranks)
        view = None
        if self.rank_metric is not None and self.rank_metric in block.values:
            view = _RankView(self, block, ref)
        if self.metric in block.values:
            if view is not None and self.metric == self.rank_metric:
                job = view.centre
            else:
                job = self._job_centre(block, ref)
        else:
            job = np.full(n, np.nan)
        findings, spike_rows = self._judge_job(block, job, view, ref)
        if view is not None:
            findings += self._judge_ranks(block, view, spike_rows)
        findings.sort(key=_order)
        return findings

    def _job_centre(self, block: StepBlock, ref: np.ndarray) -> np.ndarray:
        """Per row, the cross-rank median of the log of ``metric`` over the reference ranks."""
        x, present = block.values[self.metric], block.present[self.metric]
        if present.all() and bool((x.min(axis=1) == x.max(axis=1)).all()):
            # An all-reduced value (grad_norm): every rank holds the very same number, which is
            # its own median; two row reductions instead of a gather, a log and a sort per row
            # (NaN fails ==, so a row with one takes the general path).
            first = x[:, 0]
            job = np.full(len(first), np.nan)
            np.log(first, out=job, where=(first > 0) & (first < np.inf))
            return job
        yj, vj = log_positive(x[:, ref], present[:, ref])
        return cross_section(yj, vj, None, 1, with_scale=False)[0]

    # -------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"trend": self._trend.state_dict(), "episode": self._episode, "first": self._first,
                "starts": list(self._starts), "follow": self._follow, "peers": self._peers.state_dict(),
                "ranks": self._ranks.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._trend.load_state_dict(state["trend"])
        self._episode = None if state["episode"] is None else dict(state["episode"])
        self._first = state.get("first")
        self._starts = [int(s) for s in state.get("starts", [])]
        self._follow = None if state.get("follow") is None else dict(state["follow"])
        self._peers.load_state_dict(state["peers"])
        self._ranks.load_state_dict(state["ranks"])


def _order(f: Finding) -> tuple:
    return (f.step, f.status != "firing", f.severity, f.metric or "", f.ranks)


class LossSpikeDetector(SpikeDetector):
    """``loss_spike``: the median loss across ranks jumps; or some ranks' loss jumps above peers."""

    kinds = (Kind("loss_spike", "The loss jumped far above the baseline that follows the training curve.", resolves="condition",
                  mutes=frozenset(), corruption="abrupt", heals=True, onset_guessed=False,
                  probe=True, incident=None, restarts_at="critical", blames_host=False, label="loss spike", colour="#ff7f0e"),)

    def __init__(self, z_threshold: float = 6.0, min_rise: float = 0.1, **kwargs: Any) -> None:
        super().__init__(kind="loss_spike", metric="loss", rank_metric="loss",
                         z_threshold=z_threshold, min_rise=min_rise, **kwargs)

    def params(self) -> dict[str, Any]:
        return _spike_params(self)


class GradSpikeDetector(SpikeDetector):
    """``grad_spike``: the global gradient norm jumps (a leading signal of a loss spike); or some
    ranks' ``local_grad_norm`` jumps above their peers'."""

    kinds = (Kind("grad_spike", "The gradient norm jumped far above its recent baseline.", resolves="condition",
                  mutes=frozenset(), corruption="abrupt", heals=True, onset_guessed=False,
                  probe=True, incident=None, restarts_at="critical", blames_host=False, label="gradient spike", colour="#e377c2"),)

    def __init__(self, z_threshold: float = 6.0, min_rise: float = 0.5, **kwargs: Any) -> None:
        kwargs.setdefault("leading_signal", True)
        kwargs.setdefault("large_ratio", None)        # size alone: a leading signal, not a page
        kwargs.setdefault("follow_metric", "loss")
        kwargs.setdefault("recur_count", 3)
        super().__init__(kind="grad_spike", metric="grad_norm", rank_metric="local_grad_norm",
                         z_threshold=z_threshold, min_rise=min_rise, **kwargs)

    def params(self) -> dict[str, Any]:
        return _spike_params(self)


def _spike_params(det: SpikeDetector) -> dict[str, Any]:
    import inspect
    names = [p for p in inspect.signature(SpikeDetector.__init__).parameters if p != "self"]
    return {n: getattr(det, n) for n in names}
