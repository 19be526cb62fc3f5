"""Prometheus metrics of the service itself, in a registry owned by one app (no globals).

The registry also carries prometheus_client's process, platform and garbage-collector collectors
(``process_*``: CPU seconds, resident memory, open file descriptors, start time; ``python_info``;
``python_gc_*``: collections and objects collected per generation), which the default global
registry would have had: the usual node and process dashboards work on it."""
from __future__ import annotations

from typing import Callable

from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram, PlatformCollector,
                               ProcessCollector)


class ServiceMetrics:
    def __init__(self, store_size: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.ingest_requests = Counter("healthsvc_ingest_requests", "Metrics ingest requests by outcome.",
                                       ["outcome"], registry=r)
        # Each outcome's series bound once: at zero on /metrics from the start (a rate over it
        # needs the series before the first event), and no label lookup on every push.
        self.ingest_outcome = {outcome: self.ingest_requests.labels(outcome)
                               for outcome in ("accepted", "duplicate", "rejected", "failed")}
        self.ingest_records = Counter("healthsvc_ingest_records", "Per-rank step records accepted.", registry=r)
        self.ingest_points = Counter("healthsvc_ingest_points", "Metric values accepted (NaN included, missing excluded).",
                                     registry=r)
        self.ingest_duplicates = Counter("healthsvc_ingest_duplicate_batches", "Re-sent batches recognised and skipped.",
                                         registry=r)
        self.ingest_latency = Histogram(
            "healthsvc_ingest_latency_seconds", "Metrics ingest latency from body read to durable, seconds.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0), registry=r)
        self.store_size = Gauge("healthsvc_store_size_bytes", "Size of the store on disk, bytes.", registry=r)
        self.store_size.set_function(store_size)
        self.supervise_settling = Gauge(
            "healthsvc_supervise_settling", "Action decisions waiting now for the job's ranks to store the steps "
            "after their cause (supervise_settle_s).", registry=r)
        self.supervise_settle_expired = Counter(
            "healthsvc_supervise_settle_expired", "Action decisions made when supervise_settle_s ran out with a rank "
            "still behind the cause's step.", registry=r)
