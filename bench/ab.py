"""A/B: one bench script on two trees, alternated, and each figure's ratio B / A with its spread.

A is a git ref checked out into a scratch worktree (``git worktree add --detach``, removed
afterwards); B is the working tree, uncommitted changes included. The runs alternate in
counterbalanced pairs, A B, B A, A B, ... (``--pairs`` pairs), so a machine that slows or speeds
up through the session favours neither side: over an even number of pairs its drift reads high in
half of them and low in the other half (it widens the spread instead of moving every ratio one
way). Each run has ``PYTHONPATH``
set to its own tree (and to links to its ``detectors/`` and ``clients/`` by their import names,
``RENAMED_PACKAGES``), so its code is what runs, in the server subprocesses the bench starts too.
Each run's figures are the rows of the markdown tables it prints (``bench/tables.py``); the
ratio is taken within each pair, and the table shows its median and its min-max over pairs.

    .venv/bin/python bench/ab.py 91dd201 bench/ingest.py                 # 4 pairs, default sizes
    .venv/bin/python bench/ab.py 91dd201 bench/ingest.py --pairs 6 -- --seconds 6

Both trees run the working tree's copy of the script (copied into A's scratch worktree, so it
imports A's code): the same workload on both, only the service differs. ``--script-of each`` runs
each tree's own copy instead (when the script itself changed what it measures, that is what to
compare). ``--same FILE`` copies more of the working tree into A's: a module the script takes
its workload from (``bench/ingest.py`` makes the payloads of the in-process benches). Arguments
after ``--`` go to the bench script, the same on both trees. Progress goes to stderr; the table
to stdout. Whether a ratio above 1 is better depends on the figure: read its unit (per
CPU-second: higher is better; ms, instructions: lower). Take timed figures on a quiet machine:
on a loaded one the spread says how much they are worth (``bench/instructions.py`` counts
instead, the same on every run).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tables import Figure, parse  # noqa: E402  (bench/tables.py)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


class ScratchTree:
    """``ref`` checked out, detached, next to the working tree (benches find shared data such as
    ``../shared`` relative to their tree); removed on exit."""

    def __init__(self, repo: Path, ref: str, script_from_b: str | None = None, same: tuple[str, ...] = ()) -> None:
        self.repo, self.ref, self.script_from_b, self.same = repo, ref, script_from_b, same
        self.path = Path(tempfile.mkdtemp(prefix=".ab-", dir=repo.parent))

    def __enter__(self) -> Path:
        git(self.repo, "worktree", "add", "--detach", str(self.path), self.ref)
        for name in ([self.script_from_b] if self.script_from_b is not None else []) + list(self.same):
            shutil.copyfile(self.repo / name, self.path / name)   # B's workload, A's code
        return self.path

    def __exit__(self, *exc) -> None:
        git(self.repo, "worktree", "remove", "--force", str(self.path))
        if self.path.exists():
            self.path.rmdir()


# Packages imported under another name than their folder's (setup.py's package_dir). The
# editable install maps those names to the folders of the tree it was installed from, so on
# PYTHONPATH=tree alone A's run would import B's detectors and client: each run's path also holds
# links by those names to its own tree's folders (found before the editable install's mapping).
RENAMED_PACKAGES = {"healthsvc_detectors": "detectors", "healthsvc_client": "clients"}


def own_names(tree: Path, links: Path) -> Path:
    """A folder of links, by import name, to ``tree``'s renamed packages (those it has)."""
    links.mkdir(parents=True, exist_ok=True)
    for name, folder in RENAMED_PACKAGES.items():
        if (tree / folder).is_dir() and not (links / name).exists():
            (links / name).symlink_to(tree / folder, target_is_directory=True)
    return links


def run_bench(tree: Path, script: str, args: list[str], label: str, links: Path | None = None) -> list[Figure]:
    """One run of ``script`` in ``tree``: its figures. The bench's own stderr passes through.
    ``links``: a scratch folder for the tree's renamed packages (:func:`own_names`)."""
    path = [str(tree)] + ([str(own_names(tree, links))] if links is not None else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(tree / script), *args], cwd=tree, env=env,
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout)
        raise SystemExit(f"ab: {label}: {script} exited {proc.returncode}")
    figures = parse(proc.stdout)
    if not figures:
        sys.stderr.write(proc.stdout)
        raise SystemExit(f"ab: {label}: {script} printed no markdown table (bench/tables.py)")
    print(f"ab: {label}: {len(figures)} figures in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return figures


def describe(repo: Path, ref: str) -> tuple[str, str]:
    """One line for each side of the comparison, for the header."""
    a = git(repo, "log", "-1", "--format=%h %s", ref)
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no")
    b = git(repo, "log", "-1", "--format=%h %s", "HEAD")
    return (f"A = {ref} (scratch worktree): {a[:100]}",
            f"B = working tree {repo}{', with uncommitted changes' if dirty else ''}: HEAD {b[:100]}")


def compare(a_runs: list[list[Figure]], b_runs: list[list[Figure]]) -> tuple[list[str], list[str]]:
    """Markdown rows (median A, median B, median ratio, min-max ratio) and the keys only one side has."""
    def by_key(runs):
        out: dict[tuple, list[float]] = {}
        for figures in runs:
            for f in figures:
                out.setdefault(f.key, []).append(f.value)
        return out
    a, b = by_key(a_runs), by_key(b_runs)
    rows = []
    uneven = []
    for key in b:
        if key not in a:
            continue
        if len(a[key]) != len(b[key]):   # printed by some runs only: no pairs to divide
            uneven.append(f"not in every run: {' / '.join(key)}")
            continue
        ratios = [y / x for x, y in zip(a[key], b[key]) if x != 0]
        ratio = (f"{statistics.median(ratios):.2f} | {min(ratios):.2f}–{max(ratios):.2f}" if ratios else "n/a | n/a")
        rows.append(f"| {' | '.join(key)} | {statistics.median(a[key]):,.4g} | {statistics.median(b[key]):,.4g} | {ratio} |")
    lonely = [f"only in A: {' / '.join(k)}" for k in a if k not in b] + \
             [f"only in B: {' / '.join(k)}" for k in b if k not in a] + uneven
    return rows, lonely


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ref", help="git ref of tree A (a commit, tag or branch)")
    ap.add_argument("script", help="the bench script, relative to the repository root, e.g. bench/ingest.py")
    ap.add_argument("--pairs", type=int, default=4, help="A, B pairs to run (alternated, counterbalanced: A B, B A, ...)")
    ap.add_argument("--script-of", choices=("B", "each"), default="B",
                    help="B: the working tree's script on both trees (default); each: each tree's own")
    ap.add_argument("--same", action="append", default=[], metavar="FILE",
                    help="a file of the working tree copied into A's tree too (repeatable): a module the script "
                         "takes its workload from, such as bench/ingest.py's payloads")
    ap.epilog = "Arguments after -- go to the bench script."
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, bench_args = ap.parse_args(argv[:split]), argv[split + 1:]
    repo = Path(git(Path.cwd(), "rev-parse", "--show-toplevel"))
    if not (repo / args.script).is_file():
        ap.error(f"script: {args.script} is not a file of the working tree {repo}")
    if args.pairs < 1:
        ap.error("--pairs: must be at least 1")
    if subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{args.ref}^{{commit}}"],
                      capture_output=True).returncode != 0:
        ap.error(f"ref: {args.ref} is not a commit of {repo}")
    head_a, head_b = describe(repo, args.ref)
    a_runs, b_runs = [], []
    for name in args.same:
        if not (repo / name).is_file():
            ap.error(f"--same: {name} is not a file of the working tree {repo}")
    with ScratchTree(repo, args.ref, args.script if args.script_of == "B" else None, tuple(args.same)) as tree_a, \
            tempfile.TemporaryDirectory(prefix="ab-names-") as links:
        for i in range(1, args.pairs + 1):
            # Counterbalanced, A B | B A | A B ...: a machine that slows (or speeds up) through
            # the session would otherwise favour whichever side always runs first in its pair
            # (an A/A of bench/ingest.py, A first in every pair, read B / A 0.72-1.10 by row,
            # 9 rows of 13 below 1; docs/performance.md, "The A/B's own noise").
            sides = [("A", tree_a, a_runs), ("B", repo, b_runs)]
            for side, tree, runs in (sides if i % 2 else sides[::-1]):
                runs.append(run_bench(tree, args.script, bench_args, f"pair {i}/{args.pairs}, {side}", Path(links) / side))
    rows, lonely = compare(a_runs, b_runs)
    print(f"A/B of {args.script} {' '.join(bench_args)}".rstrip()
          + (" (the working tree's script on both)" if args.script_of == "B" else " (each tree's own script)"))
    print(head_a)
    print(head_b)
    print(f"{args.pairs} pair(s), run A B, B A, A B, ...; ratio = B / A within a pair: median and min–max over pairs\n")
    print("| table | row | figure | A (median) | B (median) | B / A | B / A min–max |")
    print("|---|---|---|---:|---:|---:|---:|")
    for row in rows:
        print(row)
    for line in lonely:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
