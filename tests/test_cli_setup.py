"""`make` set-up: apt only when a system package is missing, waiting out another process's apt lock;
package metadata without setuptools' license deprecation."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.support.paths import ROOT

MAKE = shutil.which("make")


def fake_system(tmp_path: Path, *, libraries: bool, espeak: bool, apt_busy_times: int = 0,
                postgres: bool = True) -> dict[str, str]:
    """A PATH of stand-ins: ldconfig, espeak-ng, id (root), sleep (instant) and an apt-get that logs
    its arguments and reports a held lock the first `apt_busy_times` times; PostgreSQL's server binary
    where the Makefile looks for it (POSTGRES_SERVERS) when `postgres`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "ldconfig": "echo '\tlibopus.so.0 (libc6) => /x'; echo '\tlibportaudio.so.2 (libc6) => /y'" if libraries else "true",
        "id": "echo 0",
        "sleep": "true",
        "apt-get": (f'echo "$*" >> {tmp_path}/apt.log; n=$(wc -l < {tmp_path}/apt.log); '
                    f'if [ "$n" -le {apt_busy_times} ]; then '
                    'echo "E: Could not get lock /var/lib/apt/lists/lock" >&2; exit 100; fi'),
    }
    if espeak:
        scripts["espeak-ng"] = "true"
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    for tool in ("grep", "wc"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    server = tmp_path / "postgresql" / "15" / "bin" / "postgres"
    if postgres:
        server.parent.mkdir(parents=True)
        server.write_text("")
    return {"PATH": str(bin_dir), "HOME": str(tmp_path),
            "POSTGRES_SERVERS": str(tmp_path / "postgresql" / "*" / "bin" / "postgres")}


def make_system_deps(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([MAKE, "-s", "-C", str(ROOT), "system-deps"], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.skipif(MAKE is None, reason="needs make")
def test_apt_is_skipped_entirely_when_the_system_packages_are_present(tmp_path):
    result = make_system_deps(fake_system(tmp_path, libraries=True, espeak=True))
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "apt.log").exists()


@pytest.mark.skipif(MAKE is None, reason="needs make")
def test_a_held_apt_lock_is_waited_out_and_espeak_ng_is_installed(tmp_path):
    result = make_system_deps(fake_system(tmp_path, libraries=True, espeak=False, apt_busy_times=2))
    assert result.returncode == 0, result.stdout + result.stderr
    calls = (tmp_path / "apt.log").read_text().splitlines()
    assert [c.split()[-1] for c in calls] == ["update", "update", "update", "espeak-ng"]
    assert all("DPkg::Lock::Timeout=120" in c for c in calls) and "install -y espeak-ng" in calls[-1]
    assert "retrying" in result.stdout


@pytest.mark.skipif(MAKE is None, reason="needs make")
def test_postgresql_is_installed_when_its_server_is_missing(tmp_path):
    result = make_system_deps(fake_system(tmp_path, libraries=True, espeak=True, postgres=False))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "apt.log").read_text().splitlines()[-1].endswith("install -y postgresql")


def test_the_license_is_an_spdx_string_for_a_setuptools_that_accepts_it():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "MIT"
    assert pyproject["build-system"]["requires"] == ["setuptools>=77"]
