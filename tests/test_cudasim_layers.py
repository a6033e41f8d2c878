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


def test_a_training_step_is_three_launches_each_way_under_simulator():
    """The CUDA backend's whole steps (``cuda.forward_step``, ``cuda.backward_step``): an
    InPlace-ABN II training forward launches the moments, per-channel state and normalise +
    activate kernels, its backward the reductions, per-channel gradients and input gradient
    kernels, and no kernel runs through the operators of ``layers.ops`` in between. Variant I
    adds the kernel of the backward's ``p, q``."""
    code = """
import torch, layers
from layers import ops
from layers.kernels import cuda
launched = []
launch = cuda._launch
cuda._launch = lambda kernel, *args: (launched.append(kernel.__name__), launch(kernel, *args))
for operator in ops.OPERATORS:
    setattr(ops, operator.__name__, None)  # any call through the operators would fail
for variant in ("II", "I"):
    launched.clear()
    layer = layers.InPlaceABN(3, variant=variant)
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    layer(x * 1.0).backward(torch.ones(2, 3, 4, 4))
    print(variant, " ".join(launched))
"""
    env = {**os.environ, "LAYERS_KERNELS": "cudasim"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-5000:]
    forward = "_moments_3d _channel_state _forward_3d"
    assert run.stdout.splitlines() == [
        f"II {forward} _grad_sums_3d _channel_gradients _grad_input_3d",
        f"I {forward} _channel_values _grad_sums_3d _channel_gradients _grad_input_3d"]
