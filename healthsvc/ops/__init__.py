"""Operations (a feature): liveness, readiness and Prometheus ``/metrics`` (``api``)."""
