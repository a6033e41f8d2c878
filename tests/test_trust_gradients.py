"""The ABN layers give the eager float64 gradients of BN + activation through PyTorch's own
ops under every way PyTorch runs a module: tensor hooks, module full backward hooks,
``retain_grad``, ``torch.autograd.grad`` (with and without ``create_graph``), anomaly mode,
gradient checkpointing and ``torch.compile`` (backends ``eager``, ``aot_eager``, ``inductor``;
the layer's input from outside the graph or inside it, its output returned or used inside,
graph breaks around it, dynamic shapes); likewise every DenseNet implementation.

The reference is the same network with every ABN layer replaced by its composite twin
(``trust_harness.reference_of``), run the same way. Each feature is run with each class at
least once rather than as the full cross-product: the ``inductor`` compiles take tens of
seconds each on a small machine.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import layers
from model_steps import randomize_norms
from test_densenet import IABN_IMPLS, build_like, tiny
from trust_harness import (EAGER_WAYS, LAYOUTS, TOL, anomaly_mode, assert_same, autograd_grad,
                           checkpointed, compiled, full_backward_hook, inputs, layer_net,
                           norm_input_tensor_hook, norm_output_tensor_hook, observe,
                           output_tensor_hook, plain, reference_of)

CLASSES = [layers.ABN, layers.InPlaceABN, layers.InPlaceABNSync]


def check(net, reference, way, reference_way=None, **shape):
    """One step of ``net`` run ``way`` against ``reference`` run ``reference_way`` (default:
    the same way)."""
    x, grad = inputs(**shape)
    expected = observe(reference, x, grad, reference_way or way)
    assert_same(observe(net, x, grad, way), expected)


# --------------------------------------------------------------------------- eager ways
@pytest.mark.parametrize("way", EAGER_WAYS, ids=lambda w: w.__name__)
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_hooks_and_autograd_see_the_reference_gradients(cls, way):
    """A gradient kept by a hook or ``retain_grad`` is never overwritten afterwards, and every
    gradient equals the reference's."""
    check(*layer_net(cls), way)


@pytest.mark.parametrize("variant", ["I", "II"])
@pytest.mark.parametrize("activation,param", [("leaky_relu", 0.2), ("elu", 0.7),
                                              ("identity", None)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_kept_gradients_of_every_configuration(training, layout, activation, param, variant):
    """The Grad-CAM pattern (a hook keeping the norm output's gradient) in every variant,
    activation, mode and layout."""
    check(*layer_net(layers.InPlaceABN, layout=layout, training=training,
                     activation=activation, activation_param=param, variant=variant),
          norm_output_tensor_hook)


# --------------------------------------------------------------------------- torch.compile
def compile_case(cls, backend, placement, dynamic=False, **kwargs):
    return pytest.param(cls, backend, placement, dynamic, kwargs,
                        id=f"{cls.__name__}-{backend}-{placement}"
                           + ("-dynamic" if dynamic else "")
                           + "".join(f"-{k}={v}" for k, v in kwargs.items()))


#: Each class, placement and backend at least once, with the configurations spread over them.
COMPILE_CASES = [
    compile_case(layers.InPlaceABN, "aot_eager", "outside"),
    compile_case(layers.InPlaceABN, "inductor", "outside", variant="I"),
    compile_case(layers.ABN, "eager", "outside", activation="elu", activation_param=0.7),
    compile_case(layers.InPlaceABNSync, "eager", "inside", training=False),
    compile_case(layers.ABN, "aot_eager", "inside", layout="channels_last"),
    compile_case(layers.InPlaceABN, "inductor", "inside", layout="channels_last"),
    compile_case(layers.InPlaceABNSync, "aot_eager", "returned", variant="I"),
    compile_case(layers.ABN, "inductor", "returned"),
    compile_case(layers.InPlaceABN, "aot_eager", "breaks", activation="identity"),
    compile_case(layers.InPlaceABNSync, "eager", "breaks"),
    compile_case(layers.InPlaceABN, "aot_eager", "outside", dynamic=True, training=False),
    compile_case(layers.InPlaceABN, "aot_eager", "inside", scale_mode="bn"),
    compile_case(layers.InPlaceABN, "inductor", "inside", scale_mode="bn", dynamic=True),
]


def net_of(cls, kwargs):
    """:func:`layer_net` with the layout and mode taken out of ``kwargs``."""
    kwargs = dict(kwargs)
    return layer_net(cls, layout=kwargs.pop("layout", "contiguous"),
                     training=kwargs.pop("training", True), **kwargs)


@pytest.mark.parametrize("cls,backend,placement,dynamic,kwargs", COMPILE_CASES)
def test_compiled_layers_give_the_eager_reference_gradients(cls, backend, placement, dynamic,
                                                             kwargs):
    """Compiled with ``fullgraph=True`` (but around the graph breaks): the input gradient that
    reaches the convolution before the layer, whether that runs inside the graph or outside
    it, equals the reference's, as do the outputs, parameter gradients and buffers."""
    net, reference = net_of(cls, kwargs)
    check(net, reference, compiled(backend, placement, dynamic), reference_way=plain)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_bn_scale_mode_refuses_a_zero_weight_before_writing(backend):
    """``scale_mode="bn"`` compiles with ``fullgraph=True``; the compiled step refuses a weight
    it cannot invert, naming it, and writes neither the input nor any buffer (Inductor fuses
    the batch count with the in-graph check: the count adds the check's result, not 1)."""
    net, _ = layer_net(layers.InPlaceABN, scale_mode="bn")
    step = torch.compile(lambda t: net.norm(t), backend=backend, fullgraph=True)
    x, _ = inputs()
    step(net.features(x)).sum().backward()
    with torch.no_grad():
        net.norm.weight[1] = 0.0
    y = net.features(x)
    before = [t.clone() for t in (y, *net.norm.buffers())]
    with pytest.raises(RuntimeError, match="weight"):
        step(y)
    assert all(torch.equal(a, b) for a, b in zip((y, *net.norm.buffers()), before))


# --------------------------------------------------------------------------- fuse_abn
class SharedNorm(torch.nn.Module):
    """One norm applied to a convolution's output and to an input no convolution made."""

    def __init__(self, cls):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)
        self.norm = cls(3)

    def forward(self, x):
        return self.norm(self.conv(x)) + self.norm(x * 2)


@pytest.mark.parametrize("cls", [layers.ABN, layers.InPlaceABN, torch.nn.BatchNorm2d],
                         ids=lambda c: c.__name__)
def test_fuse_keeps_a_norm_that_is_also_applied_elsewhere(cls):
    """Folding the norm into the convolution would turn its other call into the bare
    activation: ``fuse_abn`` leaves that pair unfused and the model computes what it did."""
    torch.manual_seed(0)
    model = SharedNorm(cls).double()
    randomize_norms(model)
    model.eval()
    x, _ = inputs(shape=(2, 3, 5, 6))
    fused = layers.fuse_abn(model)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-12, atol=1e-12)
    assert fused.fused_pairs == []


# --------------------------------------------------------------------------- checkpointing
@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_checkpoint_gives_the_reference_gradients(cls, use_reentrant):
    """The recomputation reads the layer's input again: an in-place layer runs on a copy (the
    reentrant checkpoint's first forward, under ``no_grad`` on the input it keeps, and its
    recomputation, on a detached leaf sharing that input's memory)."""
    check(*layer_net(cls), checkpointed(use_reentrant=use_reentrant))


@pytest.mark.parametrize("variant", ["I", "II"])
def test_reentrant_checkpoint_in_eval_mode_and_either_variant(variant):
    check(*layer_net(layers.InPlaceABN, training=False, variant=variant),
          checkpointed(use_reentrant=True))


def test_a_hook_on_a_sliced_input_sees_its_gradient():
    """A hook on an input that is a view (a slice of a convolution's output) still runs."""
    check(*layer_net(layers.InPlaceABN, channels=1, layout="slice", training=False),
          norm_input_tensor_hook, shape=(1, 3, 1, 1))


# --------------------------------------------------------------------------- DenseNets
DENSE_LAYER = "features.denseblock1.denselayer1"
#: An InPlaceABN layer of the first dense layer (on its bottleneck convolution's output), which
#: every implementation calls as a module.
DENSE_NORM = f"{DENSE_LAYER}.norm2"
#: Modules that the memory-efficient implementations compute without calling them (the first
#: norm and convolution of a dense layer, a transition's norm, the final norm): with hooks on
#: them, the step runs as in the naive implementation, and the hooks see what they see there.
SHARED_ROUTE_WAYS = [full_backward_hook(f"{DENSE_LAYER}.norm1"),
                     output_tensor_hook(f"{DENSE_LAYER}.norm1"),
                     full_backward_hook(f"{DENSE_LAYER}.conv1"),
                     output_tensor_hook("features.transition1.norm"),
                     full_backward_hook("features.norm5")]
DENSE_WAYS = [plain, output_tensor_hook(DENSE_NORM), full_backward_hook(DENSE_NORM),
              full_backward_hook(f"{DENSE_LAYER}.conv2"), *SHARED_ROUTE_WAYS,
              autograd_grad(False), anomaly_mode]


def dense_nets(impl):
    """A tiny float64 ``norm="iabn"`` DenseNet-BC in ``impl`` and its composite reference
    (the naive implementation, every ABN layer replaced by its composite twin)."""
    torch.manual_seed(1)
    model, _ = tiny("naive", norm="iabn")
    model = randomize_norms(model.double())
    return (build_like(model, impl, "cifar", norm="iabn"),
            reference_of(build_like(model, "naive", "cifar", norm="iabn")))


def dense_inputs():
    generator = torch.Generator().manual_seed(2)
    return (torch.randn(3, 3, 8, 8, dtype=torch.float64, generator=generator),
            torch.randn(3, 10, dtype=torch.float64, generator=generator))


@pytest.mark.parametrize("way", DENSE_WAYS, ids=lambda w: w.__name__)
@pytest.mark.parametrize("impl", IABN_IMPLS)
def test_densenets_under_hooks_and_autograd(impl, way):
    net, reference = dense_nets(impl)
    x, grad = dense_inputs()
    assert_same(observe(net, x, grad, way), observe(reference, x, grad, way))


@pytest.mark.parametrize("impl,backend,fullgraph", [
    ("naive", "aot_eager", True), ("shared", "aot_eager", True),
    ("shared_inplace", "aot_eager", True), ("naive", "inductor", True),
    # Dynamo refuses to put the checkpointed bottleneck in one graph (it counts its calls to
    # tell the recomputation); it runs between graphs.
    ("checkpoint", "aot_eager", False)])
def test_compiled_densenets(impl, backend, fullgraph):
    net, reference = dense_nets(impl)
    x, grad = dense_inputs()
    assert_same(observe(net, x, grad, compiled(backend, "inside", fullgraph=fullgraph)),
                observe(reference, x, grad, plain))


# --------------------------------------------------------------------------- DDP
def test_ddp_with_a_kept_gradient(tmp_path):
    """Two gloo ranks of ``DistributedDataParallel`` (its gradient hooks on the parameters) with
    a tensor hook keeping the in-place norm's output gradient: the kept gradient, the input
    gradient and the averaged parameter gradients equal the composite reference's
    (``tests/trust_ddp_worker.py``)."""
    worker = Path(__file__).resolve().parent / "trust_ddp_worker.py"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    init_method = (tmp_path / "rendezvous").as_uri()
    ranks = [subprocess.Popen([sys.executable, str(worker), str(rank), "2", init_method,
                               str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
    for rank, output in zip(ranks, outputs):
        assert rank.returncode == 0, output
    for rank in range(2):
        errors = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert all(error <= TOL for error in errors.values()), (rank, errors)
