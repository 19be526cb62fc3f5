"""examples/deploy/healthsvc.service: systemd accepts it without a warning, its hardening scores
as systemd's own analysis calls safe, and the settings it sets are the service's."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from healthsvc.settings import Settings

UNIT = Path(__file__).resolve().parents[2] / "examples" / "deploy" / "healthsvc.service"
INSTALLED = "/opt/healthsvc/venv/bin/healthsvc"
MAX_EXPOSURE = 2.0   # systemd-analyze security: below 2 is "OK", the best band it has

# systemd-analyze is Debian's systemd package, which ./dev test installs when missing: its absence
# is a failure here, not a skip.


@pytest.fixture
def unit(tmp_path) -> Path:
    """The shipped unit with ExecStart pointing at this machine's entry point (verify checks that
    the program exists), under its own name (verify reads the name)."""
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED} serve" in text
    entry = Path(sys.executable).with_name("healthsvc")
    path = tmp_path / "healthsvc.service"
    path.write_text(text.replace(INSTALLED, str(entry if entry.exists() else sys.executable)))
    return path


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(unit):
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                         timeout=60, check=False)
    # An unknown or misspelt key is only a warning: any output counts as a failure.
    assert (out.returncode, out.stderr.strip(), out.stdout.strip()) == (0, "", "")


def test_the_unit_is_hardened(unit):
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    exposure = float(re.search(r"Overall exposure level for healthsvc.service: ([0-9.]+)",
                               out.stdout).group(1))
    assert exposure <= MAX_EXPOSURE, out.stdout
    settings = dict(re.findall(r"^(\w+)=(.*)$", unit.read_text(), re.MULTILINE))
    assert settings["ProtectSystem"] == "strict" and settings["DynamicUser"] == "yes"
    assert settings["StateDirectory"] == "healthsvc" and settings["EnvironmentFile"].startswith("/etc/")


def test_the_environment_it_sets_names_real_settings():
    names = re.findall(r"^Environment=HEALTHSVC_(\w+)=", UNIT.read_text(), re.MULTILINE)
    assert names and {n.lower() for n in names} <= set(Settings.model_fields), names
    db = re.search(r"^Environment=HEALTHSVC_DB=(.*)$", UNIT.read_text(), re.MULTILINE).group(1)
    assert db == "sqlite:////var/lib/healthsvc/healthsvc.db"      # inside StateDirectory
