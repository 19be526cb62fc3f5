"""The on-call runbook: what each alert name means in a sentence, and where its section is.

The runbook itself is ``docs/runbook.md``: one ``## <kind>`` section per finding kind (what it
means, what to check, what to do), whose "What it means" opens with the kind's own ``meaning``
(:mod:`healthsvc_detectors.kinds`; a test holds the two together). Every alert carries a ``description`` annotation built
on that sentence and a ``runbook_url`` annotation, the runbook's base URL (setting
``HEALTHSVC_ALERT_RUNBOOK_URL``; by default the copy the service serves at ``/runbook``) with the
kind's section as the fragment: the heading is the kind, so the anchor is too, on GitHub and on
the served page alike.

Example::

    >>> runbook_section("https://svc.example.com/runbook", "loss_spike")
    'https://svc.example.com/runbook#loss_spike'
"""
from __future__ import annotations

from healthsvc_detectors import kinds as kind_table



def describe_kind(kind: str) -> str:
    """The one-sentence meaning of an alert name, as its kind declares it."""
    return kind_table.kind(kind).meaning if kind_table.known(kind) else f"A {kind} finding."


def runbook_section(base_url: str, kind: str) -> str:
    """The URL of a kind's section of the runbook at ``base_url``."""
    return f"{base_url.split('#', 1)[0]}#{kind}"
