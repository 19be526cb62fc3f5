"""False-alarm rates of the default detectors on the clean real data of ``../shared/quality`` and
of our own recordings (``tests/quality/traces``).

Feeds the clean traces (real 4- and 8-rank trainings on a shared 2-core machine: scheduling blips,
per-rank offsets, jitter) and the public loss curves (Pythia, modded-nanogpt) straight into the
default detector suite, in the service's 16-step blocks, and counts findings per severity and kind.
A warning or critical here is a false page; ``info`` is what the detectors record without paging.
Fault traces count only up to their onset (what came before a fault is clean too).

    .venv/bin/python bench/false_alarms.py            # prints markdown tables
    .venv/bin/python bench/false_alarms.py --sweep    # each default threshold and its neighbours
    .venv/bin/python bench/false_alarms.py --smoke    # the first clean trace only: proves it runs (tests)

``--sweep`` varies one parameter at a time around its default (the long Pythia 410m curves are
left out to keep it to minutes) and prints the warnings-or-worse per 10,000 clean steps each value
gives: the false-alarm rate of that threshold on real data.
"""
from __future__ import annotations

import csv
import gzip
import io
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from healthsvc_detectors.registry import FINDING_KINDS  # noqa: E402
from healthsvc_detectors.frame import StepBlock  # noqa: E402
from healthsvc.monitor.suite import build_suite  # noqa: E402

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "quality"
OURS = Path(__file__).resolve().parents[1] / "tests" / "quality" / "traces"
FIELDS = {"loss": "loss", "grad_norm": "grad_norm", "grad_norm_local": "local_grad_norm",
          "step_time": "step_time", "compute_time": "compute_time", "comm_time": "comm_time",
          "data_time": "data_time", "ts": "ts"}


def blocks(records: list[dict], block_steps: int = 16):
    """Per attempt: None (a new attempt resets the suite), then dense blocks of steps x ranks."""
    by_attempt: dict[int, list[dict]] = {}
    for r in records:
        by_attempt.setdefault(r.get("attempt", 0), []).append(r)
    for _, rs in sorted(by_attempt.items()):
        steps, ranks = sorted({r["step"] for r in rs}), sorted({r["rank"] for r in rs})
        si, ri = {s: i for i, s in enumerate(steps)}, {r: i for i, r in enumerate(ranks)}
        vals = {m: np.full((len(steps), len(ranks)), np.nan) for m in FIELDS.values()}
        pres = {m: np.zeros((len(steps), len(ranks)), bool) for m in FIELDS.values()}
        for r in rs:
            for src, dst in FIELDS.items():
                if r.get(src) is not None:
                    vals[dst][si[r["step"]], ri[r["rank"]]] = float(r[src])
                    pres[dst][si[r["step"]], ri[r["rank"]]] = True
        yield None
        for a in range(0, len(steps), block_steps):
            yield StepBlock(steps=np.array(steps[a:a + block_steps]), ranks=np.array(ranks),
                            values={m: v[a:a + block_steps] for m, v in vals.items()},
                            present={m: p[a:a + block_steps] for m, p in pres.items()})


def findings(records: list[dict], config: dict | None = None):
    suite = None
    for blk in blocks(records):
        if blk is None:
            suite = build_suite(config or {})
            continue
        for det in (*suite.arrival.values(), *suite.aligned.values()):
            yield from det.update(blk)


def _records(d: Path) -> list[dict]:
    """A trace's records: ``records.jsonl``, or gzipped as our own recordings keep them."""
    packed = d / "records.jsonl.gz"
    text = gzip.decompress(packed.read_bytes()).decode() if packed.exists() else (d / "records.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def clean_sources():
    # The corpus's traces, then our own recordings (tests/quality/traces: examples/record_trace.py).
    dirs = sorted((CORPUS / "traces").iterdir()) + sorted(p for p in OURS.iterdir() if (p / "labels.json").exists())
    for d in dirs:
        labels = json.loads((d / "labels.json").read_text())
        onset = (labels.get("fault") or {}).get("onset_step")
        recs = _records(d)
        if onset is not None:
            recs = [r for r in recs if r["step"] < onset]
        yield f"trace {d.name}", recs, len({r["step"] for r in recs})
    for spec in json.loads((CORPUS / "curves" / "curves.json").read_text())["curves"]:
        rows = csv.DictReader(io.StringIO(gzip.decompress((CORPUS / "curves" / spec["file"]).read_bytes()).decode()),
                              delimiter="\t")
        restarts, attempt, recs = set(spec.get("restart_steps", [])), 0, []
        for row in rows:
            step = int(row["step"])
            if step > spec.get("last_step", 10 ** 12):
                continue
            attempt += step in restarts
            v = row.get(spec["columns"]["loss"])
            recs.append({"step": step, "rank": 0, "attempt": attempt, "loss": None if v in (None, "") else float(v)})
        yield f"curve {spec['name']}", recs, len(recs)


SWEEP = {   # detector -> parameter -> values (the default in the middle)
    "loss_spike": {"z_threshold": (4.0, 6.0, 8.0), "confirm_steps": (2, 5, 10), "large_ratio": (1.5, 2.0, 3.0)},
    "grad_spike": {"z_threshold": (4.0, 6.0, 8.0), "recur_count": (2, 3, 5)},
    "rank_outlier": {"z_warning": (0.3, 0.6, 1.0)},
    "straggler": {"cusum_h": (10.0, 20.0, 30.0), "min_duration_s": (5.0, 30.0, 60.0)},
    "slowdown": {"min_duration_s": (30.0, 300.0, 600.0)},
    "divergence": {"min_rise": (0.01, 0.02, 0.05)},
}


def sweep() -> None:
    sources = [(n, r, k) for n, r, k in clean_sources() if "pythia-410m" not in n]
    steps = sum(k for _, _, k in sources)
    print(f"warnings or worse (info in brackets) per 10,000 clean steps, {steps:,} steps; "
          "one parameter varied at a time, the others at their defaults\n")
    print("| detector | parameter | value | warning+ / 10k | info / 10k |\n|---|---|---:|---:|---:|")
    for det, params in SWEEP.items():
        for param, values in params.items():
            for v in values:
                cfg = {"detectors": {det: {param: v}}}
                serious = info = 0
                for _, recs, _ in sources:
                    for f in findings(recs, cfg):
                        if f.kind == det and f.status == "firing":
                            info += f.severity == "info"
                            serious += f.severity != "info"
                print(f"| {det} | {param} | {v} | {1e4 * serious / steps:.2f} | {1e4 * info / steps:.2f} |",
                      flush=True)


def main() -> None:
    if "--sweep" in sys.argv[1:]:
        sweep()
        return
    total: Counter = Counter()
    steps = 0
    print("| source | steps | info | warning | critical |\n|---|---:|---:|---:|---:|")
    sources = clean_sources()
    for name, recs, n in (itertools.islice(sources, 1) if "--smoke" in sys.argv[1:] else sources):
        c = Counter((f.kind, f.severity) for f in findings(recs) if f.status == "firing")
        total.update(c)
        steps += n
        sev = Counter()
        for (_, s), k in c.items():
            sev[s] += k
        print(f"| {name} | {n:,} | {sev['info']} | {sev['warning']} | {sev['critical']} |")
    print(f"\nper detector over {steps:,} clean steps (firing findings; per 10,000 steps in brackets):\n")
    print("| kind | info | warning | critical |\n|---|---:|---:|---:|")
    # Every kind the suite's block detectors report (hang and stall need the service's clock).
    for kind in sorted(set(FINDING_KINDS) - {"hang", "stall"}):
        cells = [f"{total[(kind, s)]} ({1e4 * total[(kind, s)] / steps:.2f})" for s in ("info", "warning", "critical")]
        print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
