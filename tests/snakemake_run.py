"""Snakemake on the repository's Snakefile, in a working directory of a test's own.

The ``workdir`` fixture (``tests/conftest.py``) holds a copy of ``artifacts/paper`` (the papers'
numbers every claims rule reads); :func:`snakemake` runs the workflow there, without Snakemake's
lock, so tests may run side by side.
"""
import re
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


def copy_checkout(root):
    """``root`` made a copy of what the workflow runs (the Snakefile, experiments/ with its
    rules and profiles, layers/, the notebooks) and of artifacts/paper: a checkout a test may
    edit and build in."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("experiments", "layers"):
        shutil.copytree(ROOT / name, root / name, ignore=ignore)
    shutil.copy2(ROOT / "Snakefile", root / "Snakefile")
    (root / "figures").mkdir()
    for notebook in (ROOT / "figures").glob("*.ipynb"):
        shutil.copy2(notebook, root / "figures")
    return make_workdir(root)


def snakemake_in(checkout, *args, timeout=300):
    """``snakemake <args>`` on the Snakefile of ``checkout``, in it."""
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(checkout / "Snakefile"), "-d",
         str(checkout), "--nolock", *args], capture_output=True, text=True, timeout=timeout)


def touch_outputs(checkout, *args):
    """Every output that ``snakemake <args>`` would write, created as an empty file and marked
    up to date (``--touch``, which also records their inputs' checksums); return the paths,
    relative to ``checkout``."""
    plan = snakemake_in(checkout, "-n", *args)
    assert plan.returncode == 0, plan.stderr
    # A flagged output is listed with its flag: "artifacts/<id>.<run>.csv (update)".
    outputs = [f.removesuffix(" (update)")
               for line in re.findall(r"^\s+output: (.+)$", plan.stdout, re.M)
               for f in line.split(", ")]
    assert outputs
    for output in outputs:
        (checkout / output).parent.mkdir(parents=True, exist_ok=True)
        (checkout / output).touch()
    touched = snakemake_in(checkout, "--cores", "1", "--touch", "--forceall", *args)
    assert touched.returncode == 0, touched.stderr
    return outputs
