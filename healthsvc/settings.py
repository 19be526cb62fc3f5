"""Service settings: defaults, then ``HEALTHSVC_*`` environment variables, then CLI flags.

Nothing is read at import time: :func:`healthsvc.app.create_app` takes a :class:`Settings`.
"""
from __future__ import annotations

import socket

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HEALTHSVC_", extra="ignore")

    db: str = Field("sqlite:///healthsvc.db",
                    description="Store URI: sqlite:///relative.db, sqlite:////absolute.db, a plain path, or "
                                "postgresql://user@host:5432/db.")
    host: str = Field("127.0.0.1", description="Address to listen on.")
    admin_token: str = Field("", description="Bootstrap admin token (HEALTHSVC_ADMIN_TOKEN): with it, or once a token "
                                             "exists, every request needs a Bearer token. Never stored.")
    insecure: bool = Field(False, description="Allow listening on a non-loopback address with no token configured (open to anyone).")
    allowed_hosts: str = Field("", description="Comma-separated Host header names served besides the loopback names, the listen "
                                               "address and external_url's host (on 0.0.0.0 also any IP address and this "
                                               "machine's names), e.g. healthsvc.internal; * serves any (docs/security.md).")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on (0 = any free port).")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024,
                                description="Largest accepted request body, before and after gzip, bytes.")
    max_ranks: int = Field(1_048_576, ge=1, le=2**31,
                           description="Largest world size a run may have; rank ids are below it (memory per run grows with the ranks actually seen).")
    max_runs: int = Field(10_000, ge=1, le=10_000_000, description="Most runs the service holds (each keeps about 100 KB "
                                                                  "of state in memory); a write that would make one more is a 429.")
    max_runs_per_token: int = Field(1_000, ge=0, le=10_000_000, description="Most runs one token's requests may create "
                                    "(0 = no cap); a write that would make one more is a 429 naming the token. Admin "
                                    "tokens and an open service (no token) are held by max_runs only.")
    max_metric_names: int = Field(1024, ge=1, le=1_000_000, description="Most distinct metric names (fields) one run may have; "
                                                                       "a push that would take a run beyond is a 422.")
    dedupe_window_s: float = Field(3600.0, gt=0, description="How long a re-sent batch is recognised as a duplicate, seconds.")
    snapshot_every_s: float = Field(5.0, gt=0, description="How often run state is snapshotted, seconds (a run whose "
                                  "detector-state snapshot took over 50 ms waits 100 times that, if longer).")
    run_release_after_s: float = Field(600.0, ge=0, description="A finished run with no input for this long "
                                       "is let go from memory (its state stays in the store and is restored if "
                                       "it is pushed to again), seconds; 0 keeps every run in memory.")
    malloc_arena_max: int = Field(2, ge=0, le=1024, description="healthsvc serve on glibc: most malloc arenas (mallopt M_ARENA_MAX, "
                                  "set at start-up); 0 keeps glibc's default of 8 per core (healthsvc.ops.allocator).")
    malloc_trim_every_s: float = Field(30.0, ge=0, description="On glibc: give the memory malloc freed back to the system "
                                       "(malloc_trim) this often, seconds; 0 never (healthsvc.ops.allocator).")
    malloc_trim_grown_mib: float = Field(4.0, ge=0, le=1e6, description="On glibc: also trim as soon as the RSS grew this much "
                                         "above what the last trim left, MiB (checked every second); 0: only every "
                                         "malloc_trim_every_s (healthsvc.ops.allocator).")
    lease_ttl_s: float = Field(10.0, gt=0, description="Replicas (a postgresql:// store): a run's owner renews its lease every third of this; "
                                                       "when the owner dies another replica takes the run over within it, seconds.")
    replica_id: str = Field("", description="Replicas: this replica's name in the leases table (default: host:port, so a replica "
                                            "restarted on its port takes its runs back at once).")
    external_url: str = Field("", description="Public base URL of the service, for links in alerts (Slack links, "
                                              "generatorURL, externalURL). Default: the address it listens on, "
                                              "http://<host>:<port>, with this machine's name for 0.0.0.0 / ::.")
    ingest_fast_path: bool = Field(True, description="Serve metrics pushes below the web framework (same code; saves 10-20 % per push, bench/ingest.py).")
    detect: bool = Field(True, description="Run the detectors on ingested data (off: a storage-only service: nothing is found, and "
                         "alerts already stored are neither ticked nor resolved by rollbacks).")
    tick_interval_s: float = Field(1.0, gt=0, description="How often absence checks (hang, stall) run, seconds.")
    align_timeout_s: float = Field(5.0, gt=0, description="How long a step waits for missing ranks before detectors see it with them masked, seconds.")
    supervise_settle_s: float = Field(5.0, ge=0, description="GET /v1/runs/{run}/action: how long a restart or stop for a "
                                      "corruption finding at step S waits for every rank of the attempt to store a step after S "
                                      "(checkpoints before S, sent by rank 0 behind its records, are then in), seconds; when it "
                                      "runs out the decision is made on what is stored and says so (0: never wait).")
    log_level: str = Field("info", description="Log level: debug, info, warning, error.")
    access_log: bool = Field(False, description="Log every request (off: ingest is high-rate).")
    # Per-run series on /metrics (healthsvc.run_metrics).
    metrics_run_window_s: float = Field(3600.0, gt=0, description="A running run has per-run series on /metrics "
                                                                  "while its last push is this recent, seconds.")
    metrics_max_runs: int = Field(100, ge=0, description="At most this many runs (the most recently pushed) have "
                                                         "per-run series on /metrics (bounded cardinality).")
    metrics_top_ranks: int = Field(8, ge=0, le=256, description="Per-rank series on /metrics for at most this many "
                                   "ranks per run: those named by active findings, then the slowest.")
    # Alerting (healthsvc.alerting; docs/alerting.md).
    alert_webhooks: list[dict] = Field(
        default_factory=list,
        description='Webhook subscriptions from settings, a JSON list: [{"id": "oncall", "url": "http://am:9093/...",'
                    ' "format": "alertmanager|slack|json", "runs": [], "kinds": [], "min_severity": "warning",'
                    ' "secret": "whsec_..."}] (min_severity omitted: warning, info for format json).. API subscriptions (/v1/webhooks) are kept in the store.')
    webhook_allowed_networks: str = Field(
        "", description="Comma-separated CIDRs webhooks may reach although they are loopback, link-local, private or"
                        " reserved (refused by default), e.g. 10.0.0.0/8,127.0.0.0/8.")
    alert_runbook_url: str = Field("", description="Base URL of the on-call runbook (docs/runbook.md: one section "
                                                   "per finding kind); every alert's runbook_url annotation is it "
                                                   "plus #<kind>. Default: the copy this service serves at /runbook "
                                                   "(under external_url).")
    alert_resolve_timeout_s: float = Field(300.0, gt=0, description="A non-latched alert resolves this long after its last finding when no resolved finding ends it (one does at once), seconds.")
    alert_timings: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description='Per-severity overrides of group_wait_s, group_interval_s, repeat_interval_s, e.g.'
                    ' {"warning": {"group_wait_s": 10}}. Defaults: docs/alerting.md.')
    alert_max_silences: int = Field(1000, ge=1, le=100_000, description="Most silences active or pending at once; one more is a 422 "
                                                                       "(expire one with DELETE /v1/silences/{id}). Bounds the work of matching alerts.")
    alert_tick_s: float = Field(1.0, gt=0, description="How often alerts are re-evaluated (resolve timeouts, group intervals), seconds.")
    alert_delivery_timeout_s: float = Field(5.0, gt=0, description="HTTP timeout of one webhook attempt, seconds.")
    alert_retry_base_s: float = Field(1.0, gt=0, description="First webhook retry backoff (full jitter, doubling), seconds.")
    alert_retry_cap_s: float = Field(10.0, gt=0, description="Largest webhook retry backoff, seconds (small, so delivery resumes within seconds of a receiver's recovery; a success also makes the subscription's other pending deliveries due at once).")
    alert_dead_after_s: float = Field(24 * 3600.0, gt=0, description="A webhook still failing this long after it was queued goes to the dead letters, seconds.")

    def runbook_url(self) -> str:
        """``alert_runbook_url``, else the runbook this service serves (``/runbook``)."""
        return self.alert_runbook_url or self.public_url() + "/runbook"

    def public_url(self) -> str:
        """``external_url``, else the listening address, so links in alerts are never relative."""
        if self.external_url:
            return self.external_url.rstrip("/")
        host = socket.getfqdn() if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:  # an IPv6 literal
            host = f"[{host}]"
        return f"http://{host}:{self.port}"
