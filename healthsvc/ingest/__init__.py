"""The ingest hot path: body bytes -> validated columnar numpy batch."""
