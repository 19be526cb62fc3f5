"""Offline maths over a run's stored history: pure numpy, no HTTP, no storage, no clock reads.

Where the streaming detectors (``detectors/*.py``, ``detectors/*/``) judge each block as it
arrives, these answer questions about the whole history, asked by the service's features:

- :mod:`~healthsvc_detectors.offline.onset` — where the corruption began (an interval for the first
  corrupted update): the signals in :mod:`~healthsvc_detectors.offline.onset_signals`, the change point
  machinery in :mod:`~healthsvc_detectors.offline.changepoint`, the data model in
  :mod:`~healthsvc_detectors.offline.onset_model`;
- :mod:`~healthsvc_detectors.offline.rollback` — which checkpoint to resume from, and why;
- :mod:`~healthsvc_detectors.offline.bisection` — which checkpoint to probe next when the statistics
  cannot decide;
- :mod:`~healthsvc_detectors.offline.replay` — the verdict of a replay probe (hardware or data);
- :mod:`~healthsvc_detectors.offline.economics` — goodput, checkpoint intervals, retention and the run's
  timeline.
"""
