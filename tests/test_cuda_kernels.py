"""Tests of the CUDA kernels (``layers.kernels.cuda``) without a GPU.

* Numerics: ``cudasim_kernel_checks.py`` runs every API function under numba's CUDA simulator
  against naive torch references. The simulator has to be chosen before ``numba.cuda`` is
  imported, so each (layout, dtype) shard runs in its own subprocess; the shards are started
  together, in the background of the PTX tests (the simulator is slow and single-core bound),
  and each test waits for its own.
* Compilation: every kernel and signature of ``KERNELS`` is compiled to PTX, which needs the CUDA
  toolkit's libNVVM but no GPU; the command line reports those results (compiled once).
"""
import functools
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = os.path.join(ROOT, "tests", "cudasim_kernel_checks.py")
SHARDS = [("3d", "float32"), ("3d", "float64"), ("2d", "float32"), ("2d", "float64")]
SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


@functools.lru_cache(maxsize=None)
def _compile_all_or_skip(cc):
    """``compile_all_ptx(cc)`` as a list (compiled once per session); skips if the toolkit
    cannot compile for ``cc`` at all."""
    if SIMULATED:
        pytest.skip("PTX compilation is unavailable under the CUDA simulator")
    from numba.cuda.cudadrv.error import CCSupportError, NvrtcSupportError, NvvmSupportError

    from layers.kernels import cuda as kernels

    try:
        return list(kernels.compile_all_ptx(cc))
    except (NvvmSupportError, NvrtcSupportError) as error:
        pytest.skip(f"libNVVM or NVRTC is not available: {error}")
    except CCSupportError as error:
        pytest.skip(f"the installed NVVM cannot target cc {cc}: {error}")


@pytest.mark.parametrize("cc", [(7, 5), (9, 0)], ids=["cc7.5", "cc9.0"])
def test_every_kernel_compiles_to_ptx(cc):
    from layers.kernels.cuda import KERNELS

    results = _compile_all_or_skip(cc)
    assert [(name, sig) for name, sig, _ in results] == [
        (fn.__name__, sig) for fn, signatures in KERNELS for sig in signatures]
    failed = [f"{name} {sig}: {result!r}" for name, sig, result in results
              if not isinstance(result, int)]
    assert not failed, "\n".join(failed)


def test_ptx_command_line(monkeypatch, capsys):
    """``main`` prints a line per kernel and signature and fails on any kernel that did not
    compile; it is given the results of the test above (compiling all again takes seconds)."""
    from layers.kernels import cuda as kernels

    results = _compile_all_or_skip((7, 5))
    compiled = {(7, 5): results, (9, 0): [(*results[0][:2], RuntimeError("no PTX"))]}
    monkeypatch.setattr(kernels, "compile_all_ptx", lambda cc: iter(compiled[cc]))
    assert kernels.main(["--ptx", "7.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{name} {sig} cc=7.5: {size} bytes" for name, sig, size in results]
    assert kernels.main(["--ptx", "7.5", "9.0"]) == 1
    assert "cc=9.0: FAILED RuntimeError('no PTX')" in capsys.readouterr().out


def test_ptx_command_line_runs_as_a_module():
    run = subprocess.run([sys.executable, "-m", "layers.kernels.cuda"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 2
    assert "--ptx" in run.stderr


@pytest.fixture(scope="module", autouse=True)
def simulator_runs():
    """The check subprocesses of all shards, started at once with the module's first test, so
    that they run while the PTX tests compile."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    runs = {shard: subprocess.Popen([sys.executable, CHECKS, *shard], cwd=ROOT, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for shard in SHARDS}
    yield runs
    for run in runs.values():
        if run.poll() is None:
            run.kill()
            run.wait()


@pytest.mark.parametrize("shard", SHARDS, ids=["-".join(shard) for shard in SHARDS])
def test_kernels_match_reference_under_simulator(simulator_runs, shard):
    output, _ = simulator_runs[shard].communicate(timeout=600)
    assert simulator_runs[shard].returncode == 0, output


def test_simulated_launch_shortens_the_switch_interval_and_restores_it():
    """Under the simulator a launch runs with ``SIMULATOR_SWITCH_INTERVAL_S``; the interval the
    process had comes back after it, also when the kernel raises."""
    from layers.kernels import cuda as kernels

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.003)
        seen = []
        with kernels._simulated_launch():
            seen.append(sys.getswitchinterval())
        assert seen == [pytest.approx(kernels.SIMULATOR_SWITCH_INTERVAL_S)]
        assert sys.getswitchinterval() == pytest.approx(0.003)
        with pytest.raises(ZeroDivisionError), kernels._simulated_launch():
            1 / 0
        assert sys.getswitchinterval() == pytest.approx(0.003)
    finally:
        sys.setswitchinterval(before)
