"""The layers end to end on the CUDA kernels, under numba's CUDA simulator.

Re-runs every ``kernels``-marked test of ``test_abn.py`` (small shapes, float64 against the
composite PyTorch ops) and of ``test_abn_dtypes.py`` (float16 and bfloat16 inputs) with
``LAYERS_KERNELS=cudasim``, in a subprocess because the simulator is chosen when ``layers`` is
imported. The simulator runs the kernels as single-threaded Python (minutes), so
``conftest.py`` runs that subprocess beside the other tests: in one process it starts at
collection and this test, run last, collects its result; with pytest-xdist workers this test
is handed out first and its worker waits on the subprocess while the others run the rest.
"""
import os
import subprocess
import sys

from conftest import simulator_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_layers_on_cuda_kernels_under_simulator(request):
    returncode, output = simulator_run(request.config).result()
    assert returncode == 0, output[-10000:]
    assert " passed" in output and "failed" not in output


def test_simulator_is_actually_used():
    """Guards the test above: under LAYERS_KERNELS=cudasim, CPU tensors reach cuda.py."""
    code = ("import torch, layers; from layers.kernels import backend; "
            "print(backend(torch.zeros(1)).__name__)")
    env = {**os.environ, "LAYERS_KERNELS": "cudasim"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    assert run.stdout.strip() == "layers.kernels.cuda"


def test_unknown_kernel_choice_is_refused():
    env = {**os.environ, "LAYERS_KERNELS": "gpu"}
    run = subprocess.run([sys.executable, "-c", "import layers"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "LAYERS_KERNELS='gpu'" in run.stderr
