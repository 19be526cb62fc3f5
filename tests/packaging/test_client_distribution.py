"""The trainer client installs alone and cannot be shadowed (issue 29, point 6).

``clients/`` is its own distribution, ``healthsvc-client``, imported as ``healthsvc_client``; the
service distribution (``healthsvc``) depends on it and ships ``detectors/`` as
``healthsvc_detectors``. Neither installs a top-level ``clients`` or ``detectors`` (names of other
projects on PyPI, and of folders a training repository may have). Each test here works on the
wheels a ``pip install`` builds (``tests/packaging/dists.py``: built once, installed offline)."""
from __future__ import annotations

import subprocess
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.packaging.dists import CLIENT, ROOT, SERVICE, clean_env, installed, make_venv, pip_install


def wheel_of(wheels: Path, dist: str) -> zipfile.ZipFile:
    [path] = wheels.glob(f"{dist.replace('-', '_')}-*.whl")
    return zipfile.ZipFile(path)


def top_level(wheel: zipfile.ZipFile) -> set[str]:
    return {n.split("/")[0] for n in wheel.namelist() if ".dist-info/" not in n}


def requires(wheel: zipfile.ZipFile) -> list[str]:
    [meta] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return Parser().parsestr(wheel.read(meta).decode()).get_all("Requires-Dist") or []


def test_the_client_wheel_is_the_client_folder_alone_with_no_dependencies(wheels):
    wheel = wheel_of(wheels, CLIENT)
    assert top_level(wheel) == {"healthsvc_client"}
    shipped = {Path(n).name for n in wheel.namelist() if n.startswith("healthsvc_client/")}
    assert shipped == {p.name for p in (ROOT / "clients").glob("*.py")}     # every module, nothing else
    # No dependency outside an extra: the analyst's stack and the frameworks are opt-in.
    assert requires(wheel) and all("extra ==" in r for r in requires(wheel)), requires(wheel)


def test_the_service_wheel_depends_on_the_client_and_ships_no_colliding_name(wheels):
    wheel = wheel_of(wheels, SERVICE)
    assert top_level(wheel) == {"healthsvc", "healthsvc_detectors"}
    names = set(wheel.namelist())
    # every detectors module, under its import name (the subpackages too)
    assert {f"healthsvc_detectors/{p.relative_to(ROOT / 'detectors').as_posix()}"
            for p in (ROOT / "detectors").rglob("*.py")} <= names
    assert not any(n.startswith("healthsvc_client/") for n in names)         # the client is its own
    assert "healthsvc-client==0.1.0" in [r.replace(" ", "") for r in requires(wheel)]


@pytest.fixture(scope="module")
def job(tmp_path_factory, wheels) -> tuple[Path, Path]:
    """A training repository with its own ``clients`` and ``detectors`` packages, and a fresh venv
    with only the client distribution in it (what the README's training-job line installs)."""
    base = tmp_path_factory.mktemp("job")
    repo = base / "my-training-repo"
    for name in ("clients", "detectors"):
        (repo / name).mkdir(parents=True)
        (repo / name / "__init__.py").write_text(f"WHOSE = 'the training repo {name}'\n")
    venv = make_venv(base / "venv")
    pip_install(venv, wheels, CLIENT)
    return repo, venv


def python(venv: Path, code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=clean_env(**env))


def test_the_client_installs_alone(job):
    _, venv = job
    assert set(installed(venv)) == {CLIENT}, installed(venv)


def test_a_repos_own_clients_and_detectors_import_side_by_side_with_the_client(job, tmp_path):
    repo, venv = job
    spool = tmp_path / "rank0.jsonl"
    code = ("import clients, detectors\n"
            "import healthsvc_client as health\n"
            "print(clients.WHOSE); print(detectors.WHOSE)\n"
            "print(health.__file__)\n"
            f"run = health.init(run_id='side-by-side', rank=0, mode='offline', spool_path={str(spool)!r})\n"
            "health.log(loss=1.5, step=0); health.finish()\n"
            "import importlib.util\n"
            "print(importlib.util.find_spec('healthsvc'))")   # the server is not installed
    out = python(venv, code, cwd=repo)
    assert out.returncode == 0, out.stderr
    whose_clients, whose_detectors, client_file, server = out.stdout.splitlines()
    assert (whose_clients, whose_detectors) == ("the training repo clients", "the training repo detectors")
    assert Path(client_file).is_relative_to(venv) and "site-packages" in client_file
    assert server == "None"
    assert '"loss": 1.5' in spool.read_text() or '"loss":1.5' in spool.read_text()


def test_the_clients_command_line_runs_from_the_repo(job):
    repo, venv = job
    relay = subprocess.run([str(venv / "bin" / "python"), "-m", "healthsvc_client.relay", "--help"], cwd=repo,
                           capture_output=True, text=True, timeout=60, env=clean_env())
    assert relay.returncode == 0 and "--socket" in relay.stdout, relay.stderr


def test_read_says_which_extra_brings_pandas(job):
    repo, venv = job
    out = python(venv, "from healthsvc_client import read\nread.runs(url='http://127.0.0.1:9')", cwd=repo)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == ("ModuleNotFoundError: healthsvc_client.read returns pandas DataFrames; pandas is missing, "
                    "the client installs without the analysis stack: pip install 'healthsvc-client[analysis]'"), last


def test_the_service_installs_next_to_the_client_and_its_cli_works_in_the_repo(job, tmp_path, wheels):
    repo, _ = job
    venv = make_venv(tmp_path / "venv")
    pip_install(venv, wheels, SERVICE)                 # its one dependency comes from the wheels
    assert set(installed(venv)) == {CLIENT, SERVICE}   # no third-party package without an extra
    out = subprocess.run([str(venv / "bin" / "healthsvc"), "--help"], cwd=repo, capture_output=True, text=True,
                         timeout=60, env=clean_env())
    assert out.returncode == 0 and "rollback" in out.stdout and "silence" in out.stdout, out.stderr
    code = ("import importlib.util, clients, detectors\n"
            "print(clients.WHOSE); print(detectors.WHOSE)\n"
            "print(importlib.util.find_spec('healthsvc_detectors').origin)")
    out = python(venv, code, cwd=repo)
    assert out.returncode == 0, out.stderr
    whose_clients, whose_detectors, detectors_file = out.stdout.splitlines()
    assert (whose_clients, whose_detectors) == ("the training repo clients", "the training repo detectors")
    assert "site-packages" in detectors_file
