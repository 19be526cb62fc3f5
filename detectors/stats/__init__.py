"""Robust statistics the value detectors share: deterministic, vectorised over ranks and
split-invariant (the state carried between blocks is exactly what a step-by-step recursion would
carry, so feeding a series in one block or in many gives the same numbers).

- :mod:`~healthsvc_detectors.stats.scales` — the two scales detectors judge on: log space for positive
  values (``log_positive``) and the common score (``excess_score``);
- :mod:`~healthsvc_detectors.stats.cross_section` — per-step centre (median) and scale (IQR / 1.349) across
  ranks, on at most ``max_ranks`` ranks chosen by id (flat cost at 16k ranks; permutation-proof);
- :mod:`~healthsvc_detectors.stats.rank_table` — per-rank state arrays keyed by rank id;
- :mod:`~healthsvc_detectors.stats.machines` — block-vectorised state machines with a carry from the
  previous block (hysteresis, run lengths, the last step where, per-rank EWMA);
- :mod:`~healthsvc_detectors.stats.trend` — a scalar level + trend baseline in log space (Holt's linear
  smoothing with a robust scale and warm-up);
- :mod:`~healthsvc_detectors.stats.state_json` — numbers in a JSON state dict (non-finite floats as strings).
"""
