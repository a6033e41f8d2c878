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
"""
import os

import pytest
import torch

DEVICE = os.environ.get("LAYERS_TEST_DEVICE", "cpu")
DEVICES = ("cpu", "cuda")


class _DefaultDeviceGenerator(torch.Generator):
    """``torch.Generator`` whose device defaults to torch's default device."""

    def __new__(cls, device=None):
        return super().__new__(cls, torch.get_default_device() if device is None else device)

    def __init__(self, device=None):
        pass


def pytest_configure(config):
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


def pytest_report_header(config):
    return f"LAYERS_TEST_DEVICE: {DEVICE}" if DEVICE != "cpu" else None
