"""Which checkpoint to resume from, and why (:mod:`healthsvc_detectors.offline.rollback.decision`).

- :mod:`~healthsvc_detectors.offline.rollback.decision` — the decision: :func:`decide_rollback` from a run's
  history, findings, checkpoints and restarts, :func:`choose_rollback` from an onset estimate,
  and the reason in words;
- :mod:`~healthsvc_detectors.offline.rollback.evidence` — the evidence: findings grouped into episodes, the
  onset window they allow, a restart blow-up, a replica proof;
- :mod:`~healthsvc_detectors.offline.rollback.records` — what it reads and answers: checkpoints, restarts,
  the decision.
"""
from healthsvc_detectors.offline.rollback.decision import choose_rollback, decide_rollback
from healthsvc_detectors.offline.rollback.evidence import (RESTART_BLOWUP_STEPS,
                                                 TRANSIENT_STEPS, episodes, evidence_episodes,
                                                 onset_window)
from healthsvc_detectors.offline.rollback.records import Checkpoint, Restart, RollbackDecision

__all__ = ["Checkpoint", "RESTART_BLOWUP_STEPS", "Restart", "RollbackDecision",
           "TRANSIENT_STEPS", "choose_rollback", "decide_rollback", "episodes",
           "evidence_episodes", "onset_window"]
