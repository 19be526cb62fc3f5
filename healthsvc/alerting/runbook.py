"""The on-call runbook: what each alert name means in a sentence, and where its section is.

The runbook itself is ``docs/runbook.md``: one ``## <kind>`` section per finding kind (what it
means, what to check, what to do), whose "What it means" opens with :data:`KIND_MEANING`'s
sentence (a test holds the two together). Every alert carries a ``description`` annotation built
on that sentence and a ``runbook_url`` annotation, the runbook's base URL (setting
``HEALTHSVC_ALERT_RUNBOOK_URL``; by default the copy the service serves at ``/runbook``) with the
kind's section as the fragment: the heading is the kind, so the anchor is too, on GitHub and on
the served page alike.

Example::

    >>> runbook_section("https://svc.example.com/runbook", "loss_spike")
    'https://svc.example.com/runbook#loss_spike'
"""
from __future__ import annotations

KIND_MEANING: dict[str, str] = {
    "non_finite": "A metric was NaN or infinite: the weights are likely corrupted from this step on.",
    "loss_spike": "The loss jumped far above the baseline that follows the training curve.",
    "grad_spike": "The gradient norm jumped far above its recent baseline.",
    "straggler": "One rank is persistently slower than its peers and holds every step back.",
    "slowdown": "The whole job got slower than its own recent step time.",
    "hang": "Some ranks went silent while others still report.",
    "stall": "Every rank went silent: the job makes no progress.",
    "rank_outlier": "One rank's values disagree with its peers': a silent data corruption suspect.",
    "divergence": "The loss is degrading slowly against its own trend.",
    "replica_mismatch": "Data-parallel replicas hold different parameters: proof of a corrupted replica.",
    "resume_mismatch": "A resume did not continue the checkpoint's data position or schedule.",
}


def describe_kind(kind: str) -> str:
    """The runbook's one-sentence meaning of an alert name."""
    return KIND_MEANING[kind]


def runbook_section(base_url: str, kind: str) -> str:
    """The URL of a kind's section of the runbook at ``base_url``."""
    return f"{base_url.split('#', 1)[0]}#{kind}"
