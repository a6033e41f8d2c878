"""The layers inside CUDA graphs: captured with ``torch.cuda.graph`` (directly, and as the
whole-step benchmark's ``graphs`` mode) and under ``torch.compile(mode="reduce-overhead")``,
their gradients equal eager ones. A graph's replay runs no Python at all, so a layer works
there only if its per-call host path never synchronises, never copies from the host and
launches onto torch's current stream (issue 59).

These need a CUDA GPU and skip without one; the GPU self-check's machine runs them with
``python -m pytest -o addopts= tests/test_cuda_graphs.py``.
"""
import copy

import pytest
import torch
import torch.nn as nn

import layers
from experiments import whole_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

#: float32 on a GPU: cuDNN's convolutions may pick other algorithms in a graph's warm-up than
#: in the eager run, which changes the last bits.
ATOL, RTOL = 1e-5, 1e-4


def _model(norm):
    """conv - norm - conv on CUDA, seeded: the layer's input is a convolution's output, as in a
    network."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), norm(16),
                         nn.Conv2d(16, 8, 1)).cuda()


NORMS = {"inplace_abn_I": lambda c: layers.InPlaceABN(c, variant="I"),
         "inplace_abn_II": lambda c: layers.InPlaceABN(c, variant="II"),
         "abn": layers.ABN}


def _gradients(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def _forward_backward(model, x, grad):
    out = model(x)
    out.backward(grad)
    return out


@pytest.mark.parametrize("norm", list(NORMS))
def test_layer_in_a_cuda_graph_gives_eager_gradients(norm):
    eager = _model(NORMS[norm])
    graphed = copy.deepcopy(eager)
    x = torch.randn(4, 3, 12, 12, device="cuda")
    grad = torch.randn(4, 8, 12, 12, device="cuda")
    expected_out = _forward_backward(eager, x, grad).detach()
    expected = _gradients(eager)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # numba compiles or loads the kernels, cuDNN tunes
        for _ in range(3):
            graphed.zero_grad(set_to_none=True)
            _forward_backward(graphed, x, grad)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    graphed.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        out = _forward_backward(graphed, x, grad)
    graph.replay()
    torch.cuda.synchronize()
    # the same weights, the same batch: in training the output and the gradients do not
    # depend on the running statistics the warm-up steps moved
    torch.testing.assert_close(out, expected_out, atol=ATOL, rtol=RTOL)
    for got, want in zip(_gradients(graphed), expected):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    # a second replay on a new batch, copied into the graph's input, follows the batch
    x.copy_(torch.randn_like(x))
    graph.replay()
    eager.zero_grad(set_to_none=True)
    expected_out = _forward_backward(eager, x, grad).detach()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected_out, atol=ATOL, rtol=RTOL)
    for got, want in zip(_gradients(graphed), _gradients(eager)):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("norm", list(NORMS))
def test_layer_under_reduce_overhead_compile_gives_eager_gradients(norm):
    eager = _model(NORMS[norm])
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, mode="reduce-overhead")
    for step in range(4):  # the first calls compile and record; the later ones replay
        x = torch.randn(4, 3, 12, 12, device="cuda")
        grad = torch.randn(4, 8, 12, 12, device="cuda")
        for model in (eager, compiled_model):
            model.zero_grad(set_to_none=True)
        expected_out = _forward_backward(eager, x, grad).detach()
        out = compiled(x)
        torch.testing.assert_close(out, expected_out, atol=ATOL, rtol=RTOL,
                                   msg=lambda m: f"step {step}: {m}")
        out.backward(grad)
        for got, want in zip(_gradients(compiled_model), _gradients(eager)):
            torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL,
                                       msg=lambda m: f"step {step}: {m}")
        # both updated their running statistics once per step
        torch.testing.assert_close(compiled_model[1].running_mean, eager[1].running_mean,
                                   atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("contender", ["bn", "iabn_II"])
def test_whole_step_graphs_mode_trains_as_the_eager_step(contender):
    """The benchmark's ``graphs`` mode: its first call runs ``WARMUP_STEPS`` eager steps,
    captures and replays one; every later call replays. From the same weights it trains as
    the same number of eager steps does."""
    (chosen,) = [c for c in whole_step.contenders("resnext101") if c.name == contender]
    shape = (4, 3, 32, 32)
    eager = whole_step.TrainingStep.build(chosen, 0.0625, 10, shape, torch.device("cuda"),
                                          torch.float32)
    graphed_step = whole_step.TrainingStep.build(chosen, 0.0625, 10, shape,
                                                 torch.device("cuda"), torch.float32)
    graphed = graphed_step.in_mode("graphs")
    graphed()
    for _ in range(whole_step.GraphedStep.WARMUP_STEPS + 1):
        eager()
    for _ in range(2):
        graphed()
        eager()
    torch.cuda.synchronize()
    for got, want in zip(graphed_step.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)
