"""The systemd units: what a GPU host needs from them, and `systemd-analyze verify` on both."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "systemd"
INSTALLED_GPUD = "/usr/local/bin/gpud"


def settings(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read(UNITS / name)
    return parser


@pytest.mark.parametrize("name", ["gpud-controller.service", "gpud-node.service"])
def test_both_units_notify_restart_and_wait_for_the_network(name: str) -> None:
    unit = settings(name)
    assert unit["Service"]["Type"] == "notify"
    assert unit["Service"]["Restart"] == "on-failure"
    assert "network-online.target" in unit["Unit"]["After"]
    assert "network-online.target" in unit["Unit"]["Wants"]
    assert unit["Service"]["ExecStart"].startswith(f"{INSTALLED_GPUD} ")
    assert "--config /etc/gpud/" in unit["Service"]["ExecStart"]
    assert unit["Service"]["StateDirectory"].startswith("gpud/")
    assert "StandardOutput" not in unit["Service"]  # the journal, the default


def test_node_unit_keeps_jobs_alive_and_runs_as_root() -> None:
    service = settings("gpud-node.service")["Service"]
    assert service["KillMode"] == "process"
    assert service["Delegate"] == "yes"
    assert "User" not in service
    for breaks_jobs in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
                        "DeviceAllow", "ProtectClock", "RestrictNamespaces", "RestrictSUIDSGID"):
        assert breaks_jobs not in service


def test_controller_unit_is_unprivileged_and_confined() -> None:
    service = settings("gpud-controller.service")["Service"]
    assert service["User"] == "gpud"
    assert service["ProtectSystem"] == "strict"
    assert service["NoNewPrivileges"] == "yes"
    assert service["StateDirectory"] == "gpud/controller"


def test_the_sysusers_file_creates_the_controller_user() -> None:
    line = [ln for ln in (UNITS / "gpud.sysusers").read_text().splitlines() if ln and not ln.startswith("#")]
    assert line[0].split()[:2] == ["u", "gpud"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_passes_on_both_units(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point the units at this environment's gpud.
    gpud = Path(sys.executable).parent / "gpud"
    if not gpud.exists():
        pytest.skip(f"no gpud script beside {sys.executable}")
    paths = []
    for unit in ("gpud-controller.service", "gpud-node.service"):
        target = tmp_path / unit
        target.write_text((UNITS / unit).read_text().replace(INSTALLED_GPUD, str(gpud)))
        paths.append(str(target))
    result = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.strip() == "", result.stderr
