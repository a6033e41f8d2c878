"""Snakemake on the repository's Snakefile, in a working directory of a test's own.

The ``workdir`` fixture (``tests/conftest.py``) holds a copy of ``artifacts/paper`` (the papers'
numbers every claims rule reads); :func:`snakemake` runs the workflow there, without Snakemake's
lock, so tests may run side by side.
"""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_workdir(path):
    """``path`` made ready to run the workflow in: the papers' numbers copied in."""
    shutil.copytree(ROOT / "artifacts" / "paper", path / "artifacts" / "paper")
    return path


def snakemake(workdir, *args, timeout=300):
    """``snakemake <args>`` in ``workdir``, its output captured, stopped after ``timeout`` s."""
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir),
         "--nolock", *args], capture_output=True, text=True, timeout=timeout)
