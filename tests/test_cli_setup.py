"""`make` set-up: apt only when a system package is missing, waiting out another process's apt lock, its
progress shown only when it fails; package metadata without setuptools' license deprecation, and no
setuptools notice that reads like an error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


# -- what set-up prints (issue 29 item 20) ------------------------------------------------------------

DPKG_PROGRESS = "Selecting previously unselected package espeak-ng."


def chatty_apt(tmp_path, *, install_fails: bool) -> dict[str, str]:
    """`fake_system` with an apt-get that prints what dpkg prints whatever -qq says, and (optionally)
    whose install fails."""
    env = fake_system(tmp_path, libraries=True, espeak=False)
    fail = 'case "$*" in *install*) echo "E: Unable to locate package espeak-ng" >&2; exit 100;; esac; ' \
        if install_fails else ""
    (tmp_path / "bin" / "apt-get").write_text(f'#!/bin/sh\necho "{DPKG_PROGRESS}"\n{fail}exit 0\n')
    return env


@pytest.mark.skipif(MAKE is None, reason="needs make")
def test_a_successful_install_says_what_it_installs_and_nothing_of_apts_progress(tmp_path):
    result = make_system_deps(chatty_apt(tmp_path, install_fails=False))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "installing espeak-ng\n" and result.stderr == ""


@pytest.mark.skipif(MAKE is None, reason="needs make")
def test_a_failed_install_shows_what_apt_said(tmp_path):
    result = make_system_deps(chatty_apt(tmp_path, install_fails=True))
    assert result.returncode != 0
    assert "E: Unable to locate package espeak-ng" in result.stderr and DPKG_PROGRESS in result.stderr


@pytest.mark.skipif(MAKE is None, reason="needs make")
def test_pip_runs_with_a_filter_that_hides_setuptools_editable_notice_and_nothing_else():
    dry = subprocess.run([MAKE, "-n", "-B", "-C", str(ROOT), ".venv/.installed"], capture_output=True, text=True,
                         timeout=30, env={**os.environ, "MAKEFLAGS": ""})
    [install] = [line for line in dry.stdout.splitlines() if "pip install" in line and " -e " in line]
    assert install.startswith("PYTHONWARNINGS='ignore:Editable installation' ")
    # setuptools' notice as it words it (setuptools.warnings.SetuptoolsWarning.emit: the summary first)
    script = ("import warnings\n"
              "class InformationOnly(UserWarning): pass\n"
              "warnings.warn('Editable installation.\\n!!\\n\\n  ****\\n  Please be careful ...', InformationOnly)\n"
              "warnings.warn('Installing a package from a folder named like a module', UserWarning)\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                           env={**os.environ, "PYTHONWARNINGS": "ignore:Editable installation"}).stderr
    assert "Editable installation" not in shown and "Installing a package from a folder" in shown
