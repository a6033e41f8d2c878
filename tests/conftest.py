"""Shared pytest configuration: the device of the layer tests.

``LAYERS_TEST_DEVICE=cuda`` (default ``cpu``: nothing changes) runs the tests on CUDA tensors
without editing them: for the whole session, CUDA becomes torch's default device (tensor
factories and modules without a ``device`` argument allocate there) and ``torch.Generator()``
without a device makes a CUDA generator (the tests draw their data with seeded generators).
It is meant for the ``kernels``-marked tests of ``tests/test_abn.py`` and
``tests/test_abn_dtypes.py``, which build their layers and tensors so;
``python -m experiments.gpu_selfcheck`` runs them this way::

    LAYERS_TEST_DEVICE=cuda python -m pytest -m kernels tests/test_abn.py tests/test_abn_dtypes.py

Other tests may assume CPU tensors (thread counts, CPU kernels) and are not meant for it.

The layer tests under numba's CUDA simulator (``test_cudasim_layers.py``) run in a
subprocess, single-threaded Python that takes minutes, beside the other tests. In a session
of one process (``-n 0``) it starts as soon as the tests are collected, and its test is moved
to the end, where it waits for it. With pytest-xdist workers (the default, ``addopts`` in
``pyproject.toml``) its test is handed out first and starts it: that worker waits while the
others run the rest.
"""
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from experiments.gpu_selfcheck import layer_tests

DEVICE = os.environ.get("LAYERS_TEST_DEVICE", "cpu")
DEVICES = ("cpu", "cuda")


class _DefaultDeviceGenerator(torch.Generator):
    """``torch.Generator`` whose device defaults to torch's default device."""

    def __new__(cls, device=None):
        return super().__new__(cls, torch.get_default_device() if device is None else device)

    def __init__(self, device=None):
        pass


def _share_the_cores():
    """Give each pytest-xdist worker its share of the cores as torch's thread count (which the
    CPU kernels follow): with every worker on every core, the parallel loops of the small
    tensors here wait on threads the other workers hold (two workers on 2 cores: a float64
    gradcheck took 36 s instead of under 4). Tests that need several threads set them
    themselves. Outside xdist, nothing changes."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:
        # As experiments.records.environment counts usable CPUs, which cannot be imported here:
        # it imports numba, before layers could select the CUDA simulator (LAYERS_KERNELS).
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)  # macOS and Windows have no affinity mask
        torch.set_num_threads(max(1, cores // workers))


def pytest_configure(config):
    _share_the_cores()
    if DEVICE not in DEVICES:
        raise pytest.UsageError(f"LAYERS_TEST_DEVICE={DEVICE!r} is not supported; allowed: "
                                f"{', '.join(DEVICES)}")
    if DEVICE == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError("LAYERS_TEST_DEVICE=cuda, but no CUDA GPU is available "
                                    "(torch.cuda.is_available() is False)")
        # Before the test modules are imported: module-level tensors are on CUDA as well.
        torch.set_default_device("cuda")
        torch.Generator = _DefaultDeviceGenerator


#: The test that checks the simulator run, and the tests that run in it.
SIMULATOR_TEST = "test_cudasim_layers.py::test_layers_on_cuda_kernels_under_simulator"
SIMULATED_FILES = ("test_abn.py", "test_abn_dtypes.py")
_SIMULATOR_RUN = pytest.StashKey()


class SimulatorRun:
    """``pytest -m kernels`` of :data:`SIMULATED_FILES` with ``LAYERS_KERNELS=cudasim``, in a
    subprocess that started when this object was made; output to a temporary file (a pipe
    could fill up and stall it)."""

    def __init__(self):
        here = Path(__file__).resolve().parent
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("PYTEST_XDIST")}  # a session of its own, not a worker
        env["LAYERS_KERNELS"] = "cudasim"
        env["OMP_NUM_THREADS"] = "1"  # single-threaded Python: a core, not more
        self._log = tempfile.TemporaryFile(mode="w+")
        # One process (the subprocess is one single-threaded job of its own), no report file.
        self._process = subprocess.Popen(
            layer_tests.command(None, [str(here / name) for name in SIMULATED_FILES], "kernels"),
            cwd=here.parent, env=env, stdout=self._log, stderr=subprocess.STDOUT, text=True)

    def result(self, timeout=1800):
        """``(returncode, output)``, waiting for the subprocess (killed after ``timeout``)."""
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.seek(0)
        return self._process.returncode, self._log.read()

    def stop(self):
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._log.close()


def simulator_run(config):
    """The session's :class:`SimulatorRun`, started now if collection did not start it."""
    if _SIMULATOR_RUN not in config.stash:
        config.stash[_SIMULATOR_RUN] = SimulatorRun()
    return config.stash[_SIMULATOR_RUN]


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only a selected test starts it
def pytest_collection_modifyitems(config, items):
    waiting = [item for item in items if item.nodeid.endswith(SIMULATOR_TEST)]
    if not waiting or len(items) == len(waiting):
        return
    others = [item for item in items if item not in waiting]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # pytest-xdist: every worker collects every test, and only the one that is handed the
        # simulator test may start the subprocess. Handed out first, its worker waits on it
        # while the other workers take the rest (``--dist worksteal`` moves the rest of its
        # queue to them).
        items[:] = waiting + others
    else:
        items[:] = others + waiting
        simulator_run(config)


def pytest_unconfigure(config):
    if _SIMULATOR_RUN in config.stash:
        config.stash[_SIMULATOR_RUN].stop()


def pytest_report_header(config):
    return f"LAYERS_TEST_DEVICE: {DEVICE}" if DEVICE != "cpu" else None


@pytest.fixture
def workdir(tmp_path):
    """A working directory for the workflow (:func:`snakemake_run.make_workdir`; imported
    here, not at the top: tests copy this file alone into a folder of their own)."""
    from snakemake_run import make_workdir

    return make_workdir(tmp_path)
