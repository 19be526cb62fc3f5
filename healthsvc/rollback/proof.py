"""Whether a rollback answer can rest on proof: did the run send replica fingerprints?

Statistics see a corrupted replica only when it moves the loss or a gradient norm beyond its
peers' noise; a bit flip that moves the loss by 1 % is invisible to them. The replicas' parameter
digests (``param_digest``, sent by the client's ``fingerprint()``) see any such flip exactly. An
answer for a run that sent none says so, so nobody takes "no corruption seen" for "none".
"""
from __future__ import annotations

FINGERPRINT_FIELD = "param_digest"

NO_FINGERPRINTS = (
    "This run sent no replica fingerprints, so the answer rests on statistics, not on proof: "
    "silent corruption of a replica that moves the loss too little to see (a flipped bit in a "
    "weight) cannot be excluded. Call the client's fingerprint(model) after the optimizer step "
    "every few steps (or log fingerprint_fields(model) in the step's record) and the replicas' "
    "parameter digests will prove where any such corruption began.")


def sent_fingerprints(store, run_id: str) -> bool:
    """True when any record of the run carried a replica fingerprint."""
    names, _ = store.reads.fields(run_id)
    return FINGERPRINT_FIELD in names


def proof_note(fingerprints: bool) -> str | None:
    """The sentence an answer carries about what it cannot know (None when fingerprints came)."""
    return None if fingerprints else NO_FINGERPRINTS
