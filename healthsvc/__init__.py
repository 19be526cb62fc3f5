"""healthsvc: the training-run health service (FastAPI ingest, store, detectors, alerts)."""
__version__ = "0.1.0"
