"""What `make` set-up prints: apt's progress only when apt fails, and no setuptools notice that reads like
an error (issue 29 item 20). The system is faked as in `tests/test_cli_setup.py`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from tests.test_cli_setup import MAKE, fake_system, make_system_deps

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
