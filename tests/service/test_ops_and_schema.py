"""healthz/readyz/metrics, the OpenAPI schema, the CLI and the import rules."""
from __future__ import annotations

import json
import subprocess
import sys


def test_health_ready_and_prometheus(http):
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json() == {"status": "ready"}
    http.post("/v1/runs/p/metrics", json={"records": [{"step": 0, "rank": r, "loss": 1.0, "lr": 0.1} for r in range(4)]})
    http.post("/v1/runs/p/metrics", content=b"{bad")
    text = http.get("/metrics").text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    assert values["healthsvc_ingest_records_total"] == 4
    assert values["healthsvc_ingest_points_total"] == 8
    assert values['healthsvc_ingest_requests_total{outcome="accepted"}'] == 1
    assert values['healthsvc_ingest_requests_total{outcome="rejected"}'] == 1
    # Outcomes not seen yet are there at zero: a rate() over them has a series from the start.
    assert values['healthsvc_ingest_requests_total{outcome="duplicate"}'] == 0
    assert values['healthsvc_ingest_requests_total{outcome="failed"}'] == 0
    assert values["healthsvc_ingest_latency_seconds_count"] == 1
    assert values["healthsvc_store_size_bytes"] > 0


def test_openapi_documents_every_field(http):
    schema = http.get("/openapi.json").json()
    comps = schema["components"]["schemas"]
    undocumented = [f"{name}.{field}" for name, sch in comps.items()
                    for field, spec in (sch.get("properties") or {}).items() if not spec.get("description")]
    assert undocumented == []
    params = [f"{m.upper()} {path} ?{p['name']}" for path, ops in schema["paths"].items() for m, op in ops.items()
              for p in op.get("parameters", []) if not p.get("description")]
    assert params == []
    # Every JSON answer has a schema with named fields, not an anonymous free-form object.
    untyped = []
    for path, ops in schema["paths"].items():
        for m, op in ops.items():
            ok = [code for code in op.get("responses", {}) if code.startswith("2")]
            content = op["responses"][ok[0]].get("content", {}) if ok else {}
            js = content.get("application/json", {}).get("schema")
            if js is not None and js.get("additionalProperties") is True and not js.get("properties"):
                untyped.append(f"{m.upper()} {path}")
    assert untyped == []
    # The hand-parsed ingest body is in the schema, with units.
    body = schema["paths"]["/v1/runs/{run_id}/metrics"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"$ref": "#/components/schemas/MetricsRows"} in body["oneOf"]
    assert "seconds" in comps["MetricRecord"]["properties"]["step_time"]["description"]
    assert set(comps["ErrorItem"]["properties"]) == {"loc", "msg", "type", "hint"}


def test_cli_help_and_python_m():
    out = subprocess.run([sys.executable, "-m", "healthsvc", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "serve" in out.stdout
    out = subprocess.run([sys.executable, "-m", "healthsvc", "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert "--db" in out.stdout and "--port" in out.stdout


IMPORT_CHECK = """
import sys, json
import {module}
loaded = sorted(m.split('.')[0] for m in sys.modules)
print(json.dumps(loaded))
"""


def _top_level_imports(module: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", IMPORT_CHECK.format(module=module)],
                         capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(out.stdout))


def test_import_direction():
    # detectors imports nothing of ours and no web/storage stack.
    mods = _top_level_imports("healthsvc_detectors, healthsvc_detectors.finding, healthsvc_detectors.frame, healthsvc_detectors.base")
    assert not mods & {"healthsvc", "healthsvc_client", "fastapi", "starlette", "sqlite3", "httpx"}
    # the trainer-side client pulls in no FastAPI, pandas, numpy or torch.
    import healthsvc_client
    mods = _top_level_imports(healthsvc_client.__name__)
    assert not mods & {"healthsvc", "healthsvc_detectors", "fastapi", "pandas", "numpy", "torch"}
    # every detector module is pure.
    import pkgutil
    import healthsvc_detectors
    for info in pkgutil.iter_modules(healthsvc_detectors.__path__):
        mods = _top_level_imports(f"{healthsvc_detectors.__name__}.{info.name}")
        assert not mods & {"healthsvc", "healthsvc_client", "fastapi", "sqlite3", "httpx"}, info.name
