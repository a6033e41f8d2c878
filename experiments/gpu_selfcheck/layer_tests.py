"""The layer tests on CUDA tensors, as part of the self-check.

Runs the ``kernels``-marked tests of ``tests/test_abn.py`` and ``tests/test_abn_dtypes.py`` (the
layers against the composite PyTorch ops end to end through the kernels, float64 and 16-bit:
the tests ``tests/test_cudasim_layers.py`` runs under the CUDA simulator) in a pytest
subprocess with ``LAYERS_TEST_DEVICE=cuda``: ``tests/conftest.py`` then makes CUDA the default
device of tensor factories and of ``torch.Generator``, so those tests build their layers and
tensors on the GPU and run the ``numba.cuda`` kernels on real CUDA tensors. The outcome comes
from pytest's JUnit XML report.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from ..records.paths import REPO_ROOT

#: The test files and the marker expression the self-check runs.
TEST_FILES = ("tests/test_abn.py", "tests/test_abn_dtypes.py")
MARKER = "kernels"
#: The environment variable tests/conftest.py reads.
DEVICE_VARIABLE = "LAYERS_TEST_DEVICE"


def command(junit_path, test_files=TEST_FILES, marker=MARKER):
    """The pytest command line (a list) of the ``marker`` tests of ``test_files``, with a JUnit
    XML report at ``junit_path`` (``None``: none). One process: ``-o addopts=`` leaves out the
    pytest-xdist workers of the project's ``addopts``, so that pytest alone is enough (the
    CUDA-simulator run of ``tests/conftest.py`` uses this command line too)."""
    report = [] if junit_path is None else [f"--junitxml={junit_path}"]
    return [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-m", marker,
            "-p", "no:cacheprovider", *report, *test_files]


def available_files(root=REPO_ROOT, test_files=TEST_FILES):
    """Those of ``test_files`` that exist under ``root``."""
    return tuple(f for f in test_files if (Path(root) / f).is_file())


def unavailable(root=REPO_ROOT, test_files=TEST_FILES):
    """Why the layer tests cannot run here (pytest not installed, no test file), or ``None``."""
    if importlib.util.find_spec("pytest") is None:
        return "pytest is not installed (pip install -e '.[dev]')"
    if not available_files(root, test_files):
        return (f"none of {', '.join(test_files)} exists under {root} (the tests come with a "
                "checkout)")
    return None


def not_run(reason, device="cuda", test_files=TEST_FILES, marker=MARKER):
    """The JSON record of layer tests that could not run (not a failure of the layers)."""
    return {"status": "skipped", "reason": reason, "test_files": list(test_files),
            "marker": marker, "environment": {DEVICE_VARIABLE: device}}


class Run:
    """A pytest run of the layer tests on ``device``, started at once in a subprocess;
    :meth:`result` waits for it (at most ``timeout`` seconds from the start) and summarises it.
    Of ``test_files``, those that exist under ``root`` run."""

    def __init__(self, device="cuda", test_files=TEST_FILES, marker=MARKER, root=REPO_ROOT,
                 timeout=600):
        self.device = device
        self.test_files, self.marker = available_files(root, test_files), marker
        self.timeout = timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="gpu_selfcheck_")
        self._junit = Path(self._tmp.name) / "junit.xml"
        self.command = command(self._junit, self.test_files, marker)
        env = {**os.environ, DEVICE_VARIABLE: device}
        self._log = open(Path(self._tmp.name) / "output.txt", "w+", encoding="utf-8")
        self._start = time.perf_counter()
        self._process = subprocess.Popen(self.command, cwd=root, env=env, text=True,
                                         stdout=self._log, stderr=subprocess.STDOUT)

    def result(self):
        """The summary dict: command, device, return code, counts, failed test ids, seconds,
        and the end of pytest's output where something failed."""
        timed_out = False
        try:
            returncode = self._process.wait(timeout=max(
                1.0, self.timeout - (time.perf_counter() - self._start)))
        except subprocess.TimeoutExpired:
            self._process.kill()
            returncode = self._process.wait()
            timed_out = True
        seconds = time.perf_counter() - self._start
        self._log.seek(0)
        output = self._log.read()
        self._log.close()
        counts = parse_junit(self._junit) if self._junit.is_file() else None
        self._tmp.cleanup()
        return summarise(self.command, self.device, returncode, counts, output, seconds,
                         timed_out, self.test_files, self.marker)


def parse_junit(path):
    """``dict(total, passed, failed, errors, skipped, failures)`` from a JUnit XML report
    (``failures``: the ids of the failed and erroring tests)."""
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    counts = {"total": len(cases), "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
              "failures": []}
    for case in cases:
        outcome = {child.tag for child in case}
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        if "failure" in outcome:
            counts["failed"] += 1
            counts["failures"].append(test_id)
        elif "error" in outcome:
            counts["errors"] += 1
            counts["failures"].append(test_id)
        elif "skipped" in outcome:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def summarise(cmd, device, returncode, counts, output, seconds, timed_out=False,
              test_files=TEST_FILES, marker=MARKER):
    """The JSON record of a layer-test run. ``status`` is ``"pass"`` when pytest exited 0 with
    tests run and none failed, else ``"fail"``."""
    counts = counts or {"total": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
                        "failures": []}
    passed = returncode == 0 and not timed_out and counts["passed"] > 0 \
        and not counts["failed"] and not counts["errors"]
    return {
        "status": "pass" if passed else "fail",
        "command": [str(c) for c in cmd],
        "test_files": list(test_files),
        "marker": marker,
        "environment": {DEVICE_VARIABLE: device},
        "returncode": returncode,
        "timed_out": timed_out,
        **counts,
        "duration_s": seconds,
        "output_tail": None if passed else output[-4000:],
    }


__all__ = ["DEVICE_VARIABLE", "MARKER", "Run", "TEST_FILES", "available_files", "command",
           "not_run", "parse_junit", "summarise", "unavailable"]
