"""bench/ab.py on a scratch repository: a committed tree against the working tree, alternated.

The bench of the scratch repository reads its figure from a module of its tree in a subprocess
(as a bench's server would), so a ratio other than 1 proves each run ran its own tree's code,
in subprocesses too.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

AB = Path(__file__).resolve().parents[2] / "bench" / "ab.py"

BENCH = '''
import subprocess, sys
scale = float(sys.argv[sys.argv.index("--scale") + 1]) if "--scale" in sys.argv else 1.0
value = subprocess.run([sys.executable, "-c", "import figure; print(figure.VALUE)"], cwd="/",
                       capture_output=True, text=True, check=True).stdout
if "--fail" in sys.argv:
    sys.exit(3)
print("progress", file=sys.stderr)
print("| case | latency ms |\\n|---|---:|\\n| one | %g |" % (scale * float(value)))
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          check=True, capture_output=True, text=True).stdout


def scratch_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "fig.py").write_text(BENCH)
    (repo / "figure.py").write_text("VALUE = 2.0\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "two")
    (repo / "figure.py").write_text("VALUE = 3.0\n")   # B: the working tree, uncommitted
    return repo


def ab(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(AB), *args], cwd=repo, capture_output=True, text=True, timeout=60)


def worktrees(repo: Path) -> list[str]:
    return [line for line in git(repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")]


def test_ab_prints_each_figure_ratio_of_the_working_tree_over_the_ref(tmp_path):
    repo = scratch_repo(tmp_path)
    proc = ab(repo, "HEAD", "bench/fig.py", "--pairs", "2", "--", "--scale", "10")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "A/B of bench/fig.py --scale 10 (the working tree's script on both)"
    assert out[1] == "A = HEAD (scratch worktree): " + git(repo, "log", "-1", "--format=%h two").strip()
    assert out[2] == f"B = working tree {repo}, with uncommitted changes: HEAD " + git(repo, "log", "-1", "--format=%h two").strip()
    assert "| case | one | latency ms | 20 | 30 | 1.50 | 1.50–1.50 |" in out
    # Progress on stderr, alternated and counterbalanced (A B, B A); the bench's own stderr passes through.
    order = [line.split(":")[1].strip() for line in proc.stderr.splitlines() if line.startswith("ab: pair")]
    assert order == ["pair 1/2, A", "pair 1/2, B", "pair 2/2, B", "pair 2/2, A"]
    assert proc.stderr.count("progress") == 4
    assert worktrees(repo) == [f"worktree {repo}"]        # the scratch worktree is gone
    assert [p.name for p in tmp_path.iterdir()] == ["repo"]


def test_both_trees_run_the_working_trees_script_unless_each_is_asked_for(tmp_path):
    # The workload is the script: by default B's copy measures both trees (only the code under
    # test differs); --script-of each runs each tree's own copy.
    repo = scratch_repo(tmp_path)
    (repo / "bench" / "fig.py").write_text(BENCH.replace("scale * float(value)", "100 * scale * float(value)"))
    same = ab(repo, "HEAD", "bench/fig.py", "--pairs", "1")
    assert same.returncode == 0, same.stderr
    assert "| case | one | latency ms | 200 | 300 | 1.50 | 1.50–1.50 |" in same.stdout.splitlines()
    each = ab(repo, "HEAD", "bench/fig.py", "--pairs", "1", "--script-of", "each")
    assert each.returncode == 0, each.stderr
    assert each.stdout.splitlines()[0] == "A/B of bench/fig.py (each tree's own script)"
    assert "| case | one | latency ms | 2 | 300 | 150.00 | 150.00–150.00 |" in each.stdout.splitlines()
    assert worktrees(repo) == [f"worktree {repo}"]


def test_same_gives_a_the_working_trees_copy_of_a_module_the_script_takes_its_workload_from(tmp_path):
    # The script reads a factor from bench/load.py: without --same A runs its own (committed)
    # load, with --same both run the working tree's.
    repo = scratch_repo(tmp_path)
    (repo / "bench" / "load.py").write_text("FACTOR = 1\n")
    (repo / "bench" / "fig.py").write_text(BENCH.replace(
        "scale * float(value)", "scale * float(value) * __import__('runpy').run_path("
        "__import__('os').path.join(__import__('os').path.dirname(__file__), 'load.py'))['FACTOR']"))
    git(repo, "add", "bench")
    git(repo, "commit", "-q", "-m", "load")
    (repo / "bench" / "load.py").write_text("FACTOR = 10\n")   # B's workload
    own = ab(repo, "HEAD", "bench/fig.py", "--pairs", "1")
    assert own.returncode == 0, own.stderr
    assert "| case | one | latency ms | 2 | 30 | 15.00 | 15.00–15.00 |" in own.stdout.splitlines()
    same = ab(repo, "HEAD", "bench/fig.py", "--pairs", "1", "--same", "bench/load.py")
    assert same.returncode == 0, same.stderr
    assert "| case | one | latency ms | 20 | 30 | 1.50 | 1.50–1.50 |" in same.stdout.splitlines()
    refused = ab(repo, "HEAD", "bench/fig.py", "--same", "bench/nope.py")
    assert refused.returncode == 2 and "--same: bench/nope.py is not a file of the working tree" in refused.stderr
    assert worktrees(repo) == [f"worktree {repo}"]


def test_a_failing_run_stops_ab_and_still_removes_the_scratch_worktree(tmp_path):
    repo = scratch_repo(tmp_path)
    proc = ab(repo, "HEAD", "bench/fig.py", "--", "--fail")
    assert proc.returncode != 0
    assert "pair 1/4, A: bench/fig.py exited 3" in proc.stderr
    assert worktrees(repo) == [f"worktree {repo}"]
    assert [p.name for p in tmp_path.iterdir()] == ["repo"]


def test_a_script_that_is_not_in_the_working_tree_is_refused_by_name(tmp_path):
    proc = ab(scratch_repo(tmp_path), "HEAD", "bench/nope.py")
    assert proc.returncode == 2
    assert "script: bench/nope.py is not a file of the working tree" in proc.stderr


def test_an_unknown_ref_is_refused_by_name(tmp_path):
    proc = ab(scratch_repo(tmp_path), "no-such-ref", "bench/fig.py")
    assert proc.returncode == 2
    assert "ref: no-such-ref is not a commit of" in proc.stderr


def test_the_documented_comparisons_name_a_commit_and_a_script_of_this_repository():
    # Running them is a measurement (minutes); what can rot unseen is the ref and the path.
    root = AB.parents[1]
    commands = re.findall(r"^\.venv/bin/python bench/ab\.py (\S+) (\S+)", (root / "docs" / "performance.md").read_text(), re.M)
    assert len(commands) >= 2
    for ref, script in commands:
        git(root, "rev-parse", "--verify", f"{ref}^{{commit}}")
        assert (root / script).is_file(), script


def test_each_tree_imports_its_own_renamed_packages(tmp_path):
    # detectors/ is imported as healthsvc_detectors (setup.py's package_dir); the editable install
    # maps that name to the project's own folder, so a run given only PYTHONPATH=tree would read
    # the project's detectors, not the tree's.
    repo = scratch_repo(tmp_path)
    (repo / "detectors").mkdir()
    (repo / "detectors" / "__init__.py").write_text("VALUE = 5.0\n")
    (repo / "bench" / "fig.py").write_text(BENCH.replace("import figure; print(figure.VALUE)",
                                                         "import healthsvc_detectors as d; print(d.VALUE)"))
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "detectors")
    (repo / "detectors" / "__init__.py").write_text("VALUE = 7.0\n")   # B: uncommitted
    proc = ab(repo, "HEAD", "bench/fig.py", "--pairs", "1")
    assert proc.returncode == 0, proc.stderr
    assert "| case | one | latency ms | 5 | 7 | 1.40 | 1.40–1.40 |" in proc.stdout.splitlines()
    assert [p.name for p in tmp_path.iterdir()] == ["repo"]


def test_a_machine_that_slows_through_the_session_does_not_favour_either_side(tmp_path):
    # The same tree on both sides, on a "machine" whose figure doubles with every run (a counter
    # file the runs share): were A always first in its pair, every pair would read B / A = 2.
    # Counterbalanced, the drift reads 2 in one pair and 0.5 in the next.
    repo = scratch_repo(tmp_path)
    counter = tmp_path / "runs"
    counter.write_text("0")
    # The figure depends on the run's turn only, not on either tree's code: an A/A.
    (repo / "bench" / "fig.py").write_text(
        "import pathlib\n"
        f"p = pathlib.Path({str(counter)!r}); k = int(p.read_text()); p.write_text(str(k + 1))\n"
        "print('| case | latency ms |\\n|---|---:|\\n| one | %g |' % 2 ** k)\n")
    proc = ab(repo, "HEAD", "bench/fig.py", "--pairs", "2")
    assert proc.returncode == 0, proc.stderr
    assert counter.read_text() == "4"
    assert "| case | one | latency ms | 4.5 | 3 | 1.25 | 0.50–2.00 |" in proc.stdout.splitlines()
