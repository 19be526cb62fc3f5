"""Record a real training with an injected fault as a quality trace: the folder format of
``../shared/quality/traces`` (its README), for the gate in ``tests/quality``.

    .venv/bin/python examples/record_trace.py --out tests/quality/traces grad_noise_r2
    .venv/bin/python examples/record_trace.py --out tests/quality/traces --list

Each shape runs ``examples/train.py`` (4 gloo ranks on the CPU, two fake hosts) with the client in
offline mode (``--spool DIR``: every rank's requests in a JSON-lines file, exactly what it would
have sent), then turns the spool into the trace files:

- ``records.jsonl.gz``: one record per rank and step (``step`` 1-based, as in the corpus; the
  trainer counts from 0), ``grad_norm_local`` for the client's ``local_grad_norm``;
- ``checkpoints.jsonl.gz``: the checkpoints rank 0 registered (every 100 steps);
- ``events.jsonl.gz``: launch, exit and end, written here;
- ``labels.json``: scenario, fault (onset step, rank, host, end step), and whether each checkpoint
  is clean (the checkpoint of step k holds the state after update k, so a fault whose first bad
  update is the onset's makes that checkpoint and every later one dirty).

No heartbeats: the offline client sends none (the heartbeat thread talks to a live service), and
no shape here needs them. No ``plot.png``. The jsonl files are gzipped; the gate reads them so.
Runs are not bit-reproducible in their timings (a loaded 2-core machine), only in their values.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from healthsvc_client.spool import read_spool  # noqa: E402

HOSTS = ["node-0", "node-0", "node-1", "node-1"]
CKPT_EVERY = 100
# Two models, both on the project's docs as text (about 290k characters, ~100 symbols), with other
# learning rates and warm-ups than the corpus's (2 layers, d_model 64, lr 2e-3, 100 warm-up steps):
# a smaller one (2 layers, d_model 48, lr 3e-3, 50 steps) and a bigger one (3 layers, d_model 64,
# lr 4e-3, 200 steps). Small enough that 1,000 steps of 4 ranks take a few minutes on a loaded
# 2-core machine.
BASE = ["--n-layer", "2", "--n-embd", "48", "--n-head", "4", "--block-size", "32", "--batch-size", "8",
        "--lr", "3e-3", "--warmup-steps", "50", "--lr-schedule", "cosine"]
BIG = ["--n-layer", "3", "--n-embd", "64", "--n-head", "4", "--block-size", "32", "--batch-size", "8",
       "--lr", "4e-3", "--warmup-steps", "200", "--lr-schedule", "cosine"]

# name -> how to train it and what its label says. ``onset`` is 1-based (the trainer's
# --fault-step is onset - 1); ``dirty`` says whether the fault corrupts the model state.
SHAPES: dict[str, dict] = {
    "clean_big_s11": {
        "scenario": "clean", "variant": "big", "seed": 11, "steps": 1000, "model": BIG, "args": []},
    "spike_lr8_big_s11": {
        "scenario": "spike", "variant": "lr", "seed": 11, "steps": 1000, "model": BIG,
        "args": ["--fault", "lr_spike", "--fault-rank", "-1", "--lr-factor", "8", "--fault-steps", "20"],
        "onset": 500, "length": 20, "rank": None, "dirty": True,
        "detail": {"factor": 8.0, "length": 20}},
    "spike_lr8_late_big_s11": {
        "scenario": "spike", "variant": "lr", "seed": 11, "steps": 1000, "model": BIG,
        "args": ["--fault", "lr_spike", "--fault-rank", "-1", "--lr-factor", "8", "--fault-steps", "20"],
        "onset": 800, "length": 20, "rank": None, "dirty": True,
        "detail": {"factor": 8.0, "length": 20, "note": "late in the cosine decay: a smaller rise"}},
    "sdc_slow_noise_s12_r2": {
        "scenario": "sdc_slow", "variant": "noise", "seed": 12, "steps": 1000, "model": BASE,
        "args": ["--fault", "grad_noise", "--fault-rank", "2", "--noise-frac", "0.25"],
        "onset": 600, "rank": 2, "persistent": True, "dirty": True,
        "detail": {"noise_frac": 0.25, "noise": "N(0, 1) x the gradient's RMS on a fixed quarter of the elements"}},
    "clean_jitter_s13": {
        "scenario": "clean", "variant": "jitter2", "seed": 13, "steps": 1000, "model": BASE,
        "args": ["--jitter", "2"]},
    "straggler_mild_jitter_s13_r1": {
        "scenario": "straggler", "variant": "mild", "seed": 13, "steps": 1000, "model": BASE,
        "args": ["--jitter", "2", "--fault", "straggler", "--fault-rank", "1", "--slow-factor", "1.2"],
        "onset": 500, "rank": 1, "persistent": True, "dirty": False,
        "detail": {"extra_frac": 0.2, "jitter": 2.0}},
    # A bit flip of an output-head weight (x16) in rank 3's replica, recorded for the jump-and-offset
    # shape; its effect turned out to be within the per-step noise (labels: derived), so it is
    # judged as sdc_silent: the answer must say it rests on no proof. (Recorded under the name
    # sdc_burst_offset_s1337_r3, scenario sdc_burst; the corpus sha256 in its labels is of the
    # docs of that day.)
    "sdc_silent_head_s1337_r3": {
        "scenario": "sdc_silent", "variant": "head_weight", "seed": 1337, "steps": 1000, "model": BASE,
        "args": ["--fault", "weight_bitflip", "--fault-rank", "3", "--flip-bit", "25", "--flip-index", "3229"],
        "onset": 600, "end": 600, "rank": 3, "dirty": True,
        "detail": {"param": "head.weight", "flat_index": 3229, "bit": 25,
                   "note": "flip is in this rank's replica only; data-parallel replicas never re-sync"}},
    # The shape of a replica's weight bit flip that its own loss shows: an exponent bit of one
    # element of the most frequent character's embedding row (x256: the row becomes that one
    # channel, every later layer norm sees little else at those positions) in rank 3's replica
    # only. Its local loss jumps at once and then stays above its peers' for good, smaller, as
    # the shared weights (trained on the average of all ranks' gradients) adapt a quarter of the
    # way to it. Flat index 54 = row 1 (the space in the docs' text), column 6.
    "sdc_burst_embed_s1337_r3": {
        "scenario": "sdc_burst", "variant": "replica_jump_offset", "seed": 1337, "steps": 1000, "model": BASE,
        "args": ["--fault", "weight_bitflip", "--fault-rank", "3", "--flip-param", "tok.weight",
                 "--flip-bit", "26", "--flip-index", "54"],
        "onset": 600, "end": 600, "rank": 3, "dirty": True,
        "detail": {"param": "tok.weight", "flat_index": 54, "bit": 26,
                   "note": "flip is in this rank's replica only; data-parallel replicas never re-sync"}},
    "sdc_silent_s1337_r1": {
        "scenario": "sdc_silent", "variant": "mlp_bias", "seed": 1337, "steps": 1000, "model": BASE,
        "args": ["--fault", "bias_bitflip", "--fault-rank", "1", "--flip-bit", "25", "--flip-index", "35"],
        "onset": 600, "end": 600, "rank": 1, "dirty": True,
        "detail": {"param": "blocks[0].mlp[2].bias", "flat_index": 35, "bit": 25,
                   "note": "flip is in this rank's replica only; only replica fingerprints (off here) see it"}},
}


def corpus_text(into: Path) -> Path:
    """The project's docs, concatenated in name order: a larger text than the trainer's paragraph."""
    path = into / "corpus.txt"
    path.write_text("".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "docs").glob("*.md"))),
                    encoding="utf-8")
    return path


def run_trainer(name: str, shape: dict, work: Path, text: Path) -> tuple[list[int], float, float]:
    args = [sys.executable, str(REPO / "examples" / "train.py"), "--run-id", name,
            "--spool", str(work / "spool"), "--ckpt-dir", str(work / "ckpt"),
            "--ckpt-every", str(CKPT_EVERY), "--log-every", "100", "--fingerprint-every", "0",
            "--hosts", ",".join(HOSTS), "--text", str(text), "--steps", str(shape["steps"]),
            "--seed", str(shape["seed"]), *shape["model"], *shape["args"]]
    if "onset" in shape:
        args += ["--fault-step", str(shape["onset"] - 1)]
    start = time.time()
    done = subprocess.run(args, cwd=REPO, check=False)
    return [done.returncode], start, time.time()


def from_spool(spool: Path) -> tuple[list[dict], list[dict]]:
    """(records, checkpoints) in the corpus's format from every rank's spool file."""
    records, checkpoints = [], []
    for path in sorted(spool.glob("rank*.jsonl")):
        for method, url, body in read_spool(path):
            if url.endswith("/metrics"):
                records += [trace_record(r) for r in body["records"]]
            elif url.endswith("/checkpoints"):
                checkpoints.append({"step": body["step"] + 1, "path": body["uri"],
                                    "duration_s": body.get("duration_s"), "bytes": body.get("bytes")})
    records.sort(key=lambda r: (r["step"], r["rank"]))
    # The client sends no time with a checkpoint: rank 0 saves it right after its step's record.
    saved = {r["step"]: r["ts"] + 1e-3 for r in records if r["rank"] == 0}
    checkpoints = [{**c, "ts": saved.get(c["step"])} for c in checkpoints]
    return records, sorted(checkpoints, key=lambda c: c["step"])


FIELDS = ("loss", "grad_norm", "step_time", "compute_time", "comm_time", "data_time", "lr", "tokens")


def trace_record(r: dict) -> dict:
    metrics = r.get("metrics", r)
    out = {"step": r["step"] + 1, "rank": r["rank"], "world_size": r.get("world_size"),
           "host": HOSTS[r["rank"]], "ts": r.get("ts")}
    out.update({k: metrics.get(k) for k in FIELDS})
    out["grad_norm_local"] = metrics.get("local_grad_norm")
    out["attempt"] = 0
    return out


def labels(name: str, shape: dict, records: list[dict], checkpoints: list[dict], text: Path,
           wall_s: float) -> dict:
    onset = shape.get("onset")
    rank = shape.get("rank")
    fault = None
    if onset is not None:
        end = shape.get("end", onset + shape["length"] - 1 if "length" in shape else None)
        fault = {"type": shape["scenario"], "onset_step": onset, "rank": rank, "variant": shape["variant"],
                 "host": HOSTS[rank] if rank is not None else None, "end_step": end,
                 "persistent": shape.get("persistent", False), "corrupts_state": shape["dirty"],
                 "detail": shape.get("detail")}
    dirty_from = onset if onset is not None and shape.get("dirty") else None
    ckpts = [{"step": c["step"], "attempt": 0, "path": c["path"],
              "clean": dirty_from is None or c["step"] < dirty_from} for c in checkpoints]
    return {
        "schema_version": 1, "run_id": name, "scenario": shape["scenario"], "variant": shape["variant"],
        "seed": shape["seed"], "world_size": len(HOSTS), "hosts": {str(r): h for r, h in enumerate(HOSTS)},
        "step_indexing": "1-based; a checkpoint at step k holds the state after the update of step k; "
                         "resume starts at k+1",
        "fault": fault, "checkpoints": ckpts,
        "derived": derived(records, rank if shape.get("dirty") else None, onset),
        "outcome": {"first_step": records[0]["step"], "last_step": records[-1]["step"],
                    "n_records": len(records), "wall_s": round(wall_s, 1)},
        "config": {"trainer": "examples/train.py", "args": shape["model"] + shape["args"],
                   "steps": shape["steps"], "ckpt_every": CKPT_EVERY, "fingerprints": False,
                   "corpus": "docs/*.md concatenated",
                   "corpus_sha256": hashlib.sha256(text.read_bytes()).hexdigest()},
        "recorded_by": "examples/record_trace.py",
    }


def derived(records: list[dict], rank: int | None, onset: int | None) -> dict | None:
    """What the fault did to its rank's own loss against its peers (the median of the others):
    the ratio at the onset's next three steps, and the geometric mean ratio before the onset and
    from 50 steps after it to the end, with the per-step spread (log sd) of that ratio."""
    if rank is None or onset is None:
        return None
    by: dict[int, dict[int, float]] = {}
    for r in records:
        by.setdefault(r["step"], {})[r["rank"]] = r["loss"]
    rel = {s: math.log(v[rank] / statistics.median(x for k, x in v.items() if k != rank))
           for s, v in by.items() if rank in v and len(v) > 1}

    def summary(steps: list[int]) -> dict:
        xs = [rel[s] for s in steps if s in rel]
        return {"ratio": round(math.exp(statistics.fmean(xs)), 4), "log_sd": round(statistics.pstdev(xs), 4)}

    last = max(rel)
    return {"loss_ratio_to_peers_after_onset": [round(math.exp(rel[s]), 4) for s in range(onset, onset + 3) if s in rel],
            "before": summary(list(range(max(1, onset - 300), onset))),
            "from_onset_plus_50": summary(list(range(onset + 50, last + 1)))}


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, allow_nan=True) + "\n")


def record(name: str, out: Path) -> Path:
    shape = SHAPES[name]
    with tempfile.TemporaryDirectory(prefix=f"trace-{name}-") as tmp:
        work = Path(tmp)
        text = corpus_text(work)
        codes, start, end = run_trainer(name, shape, work, text)
        records, checkpoints = from_spool(work / "spool")
        folder = out / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        events = [{"run_id": name, "ts": start, "event": "launch", "attempt": 0, "world_size": len(HOSTS),
                   "hosts": HOSTS},
                  {"run_id": name, "ts": end, "event": "exit", "attempt": 0, "exit_codes": codes},
                  {"run_id": name, "ts": end, "event": "end", "attempt": 0,
                   "end_reason": "completed" if codes == [0] else "failed", "wall_s": round(end - start, 1)}]
        write_jsonl_gz(folder / "records.jsonl.gz", [{"run_id": name, **r} for r in records])
        write_jsonl_gz(folder / "checkpoints.jsonl.gz", [{"run_id": name, **c} for c in checkpoints])
        write_jsonl_gz(folder / "events.jsonl.gz", events)
        lab = labels(name, shape, records, checkpoints, text, end - start)
        (folder / "labels.json").write_text(json.dumps(lab, indent=1) + "\n")
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="shapes to record (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "quality" / "traces")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        print("\n".join(SHAPES))
        return 0
    for name in a.names or list(SHAPES):
        if name not in SHAPES:
            ap.error(f"unknown shape {name}; one of {', '.join(SHAPES)}")
        print(f"recorded {record(name, a.out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
