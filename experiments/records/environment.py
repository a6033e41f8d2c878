"""A description of the machine and software an experiment ran on, for its artifacts.

:func:`describe_environment` returns a JSON-serialisable dict; every entry that cannot be
determined (no git checkout, no commit yet, no GPU name) is ``None`` rather than an error.
"""
import os
import platform
import subprocess
from datetime import datetime, timezone

import numba
import numpy as np
import torch

from .lock import describe_install
from .paths import REPO_ROOT


def git_output(arguments, root=REPO_ROOT, timeout=10):
    """The stripped output of ``git <arguments>`` run in ``root``, or ``None`` where git is
    missing, fails or times out (no git, not a checkout)."""
    try:
        result = subprocess.run(["git", *arguments], cwd=root, capture_output=True, text=True,
                                timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def git_commit(root=REPO_ROOT):
    """``git rev-parse HEAD`` in ``root``, or ``None`` (no git, not a checkout, no commit)."""
    return git_output(["rev-parse", "HEAD"], root) or None


def _cpu_model():
    """The CPU model name from ``/proc/cpuinfo`` (Linux), else ``None``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _usable_cpus():
    """CPUs this process may run on (the affinity mask), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _numba_threading_layer():
    """The threading layer numba chose; ``None`` until a parallel function has run."""
    try:
        return numba.threading_layer()
    except ValueError:
        return None


def _load_average():
    """The 1, 5 and 15 minute load averages (other work sharing the CPUs), else ``None``."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _device_name(device):
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_name(device)
    return _cpu_model() or platform.processor() or None


def describe_environment(device="cpu"):
    """Versions, machine, threads, device name, git commit and UTC date, as a dict.

    ``install`` says whether the packages are the locked ones (``requirements.lock``) and, if
    not, which differ (:func:`.lock.describe_install`).

    ``device`` is a string or :class:`torch.device`; the thread counts are the current
    settings of torch and numba, so call this after configuring them.
    """
    device = torch.device(device)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numba": numba.__version__,
        "numpy": np.__version__,
        "cuda_runtime": torch.version.cuda,
        "install": describe_install(),
        "platform": platform.platform(),
        "processor": platform.processor() or None,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_count_usable": _usable_cpus(),
        "load_average": _load_average(),
        "threads": {
            "torch": torch.get_num_threads(),
            "numba": numba.get_num_threads(),
            "numba_threading_layer": _numba_threading_layer(),
        },
        "device": device.type,
        "device_name": _device_name(device),
        "git_commit": git_commit(),
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


__all__ = ["describe_environment", "git_commit", "git_output", "REPO_ROOT"]
