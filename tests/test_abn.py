"""ABN / InPlaceABN against autograd of the composite PyTorch ops, in float64.

Tests marked ``kernels`` run the numba kernels end to end on small shapes; ``test_cudasim``
re-runs them with ``LAYERS_KERNELS=cudasim`` (the CUDA kernels under numba's simulator).
"""
import math

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

import layers
from abn_reference import INVERTIBLE, composite, reference_step
from in_place_gradient import spy_in_place_backward

kernels = pytest.mark.kernels

SHAPES = [(5, 3), (4, 3, 7), (3, 3, 4, 5), (2, 3, 2, 3, 4)]


def make_layer(cls, channels=3, dtype=torch.float64, seed=0, **kwargs):
    """A layer with random weights of mixed sign and random biases and running stats."""
    layer = cls(channels, **kwargs).to(dtype)
    generator = torch.Generator().manual_seed(seed)
    signs = torch.tensor([1.0, -1.0, 1.0] * channels, dtype=torch.float64)[:channels]
    values = {  # drawn in float64 whatever the dtype, so layers of both dtypes agree
        "weight": torch.empty(channels, dtype=torch.float64).uniform_(0.5, 2, generator=generator)
        * signs,
        "bias": torch.randn(channels, dtype=torch.float64, generator=generator),
        "running_mean": torch.randn(channels, dtype=torch.float64, generator=generator),
        "running_var": torch.rand(channels, dtype=torch.float64, generator=generator) + 0.5,
    }
    with torch.no_grad():
        for name, value in values.items():
            if getattr(layer, name) is not None:
                getattr(layer, name).copy_(value)
    return layer


def run_layer(layer, x, grad):
    """Output and gradients of ``layer`` on a non-leaf copy of ``x``."""
    leaf = x.detach().clone().requires_grad_()
    out = layer(leaf * 1)
    params = [p for p in (layer.weight, layer.bias) if p is not None]
    grads = torch.autograd.grad(out, [leaf] + params, grad)
    dweight, dbias = (grads[1], grads[2]) if params else (None, None)
    return out.detach(), grads[0], dweight, dbias


def check_against_reference(layer, x, grad, scale_mode="abs", atol=1e-10):
    running = [None if t is None else t.clone() for t in (layer.running_mean, layer.running_var)]
    training = layer.training or running[0] is None
    momentum = 0.1 if layer.momentum is None else layer.momentum
    expected = reference_step(x, layer.weight, layer.bias, *running, grad, training=training,
                              momentum=momentum, eps=layer.eps, activation=layer.activation,
                              param=layer.activation_param, scale_mode=scale_mode)
    actual = run_layer(layer, x, grad)
    for name, a, e in zip(("output", "input grad", "weight grad", "bias grad"), actual, expected):
        if e is None:
            assert a is None, name
            continue
        torch.testing.assert_close(a, e, atol=atol, rtol=1e-8, msg=lambda m: f"{name}: {m}")
    if running[0] is not None:
        torch.testing.assert_close(layer.running_mean, running[0], atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(layer.running_var, running[1], atol=1e-12, rtol=1e-12)


def random_input(shape, seed=1, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, dtype=dtype, generator=generator) * 2 + 0.5
    grad = torch.randn(shape, dtype=dtype, generator=generator)
    return x, grad


# --------------------------------------------------------------------------- values
@kernels
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("variant", ["I", "II"])
@pytest.mark.parametrize("activation,param", INVERTIBLE)
def test_inplace_abn_matches_composite(activation, param, variant, training):
    layer = make_layer(layers.InPlaceABN, activation=activation, activation_param=param,
                       variant=variant).train(training)
    check_against_reference(layer, *random_input((3, 3, 4, 5)))


@kernels
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("activation,param", INVERTIBLE + [("relu", None)])
def test_abn_matches_composite(activation, param, training):
    layer = make_layer(layers.ABN, activation=activation, activation_param=param).train(training)
    check_against_reference(layer, *random_input((3, 3, 4, 5)))


@pytest.mark.parametrize("small", [True, False], ids=["copy-then-in-place", "two-passes"])
def test_abn_training_forward_leaves_its_input_untouched(small, monkeypatch):
    """On small tensors the CPU kernels' out-of-place training forward copies the input into
    the output and runs the fused forward in place there (``cpu._copies_into_output``), on
    larger ones it makes two passes (``small`` false: the size limit set to 0, as a large
    tensor sees it). Either way the input keeps its values, and the output, the gradients and
    the running statistics match the float64 reference. Not marked ``kernels``: it is about
    ``cpu.py``."""
    from layers.kernels import cpu

    if not small:
        monkeypatch.setattr(cpu, "_FUSED_MAX_ANY_CHANNELS", 0)
    x, grad = random_input((3, 3, 4, 5))
    layer = make_layer(layers.ABN)
    given = x.clone()
    out = layer(given)
    assert torch.equal(given, x) and out.data_ptr() != given.data_ptr()
    check_against_reference(make_layer(layers.ABN), x, grad)


@kernels
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
@pytest.mark.parametrize("cls", [layers.ABN, layers.InPlaceABN])
def test_any_rank(cls, shape):
    check_against_reference(make_layer(cls), *random_input(shape))


@kernels
@pytest.mark.parametrize("variant", ["I", "II"])
def test_channels_last_input(variant):
    x, grad = random_input((2, 3, 4, 5))
    layer = make_layer(layers.InPlaceABN, variant=variant)
    leaf = x.clone().requires_grad_()
    source = (leaf * 1).contiguous(memory_format=torch.channels_last)
    out = layer(source)
    assert out.data_ptr() == source.data_ptr()
    assert out.is_contiguous(memory_format=torch.channels_last)
    dx, = torch.autograd.grad(out, leaf, grad)
    reference = make_layer(layers.InPlaceABN, variant=variant)
    expected = reference_step(x, reference.weight, reference.bias, reference.running_mean.clone(),
                              reference.running_var.clone(), grad)
    torch.testing.assert_close(out.detach(), expected[0], atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(dx, expected[1], atol=1e-10, rtol=1e-8)


@kernels
def test_non_contiguous_input_is_written_in_place():
    x, grad = random_input((2, 6, 4, 5))
    leaf = x.clone().requires_grad_()
    source = (leaf * 1)[:, ::2]  # every other channel: neither contiguous nor channels-last
    layer = make_layer(layers.InPlaceABN)
    out = layer(source)
    assert out.data_ptr() == source.data_ptr()
    dx, = torch.autograd.grad(out, leaf, grad[:, ::2])
    reference = make_layer(layers.InPlaceABN)
    expected = reference_step(x[:, ::2], reference.weight, reference.bias,
                              reference.running_mean.clone(), reference.running_var.clone(),
                              grad[:, ::2])
    torch.testing.assert_close(out.detach(), expected[0], atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(dx[:, ::2], expected[1], atol=1e-10, rtol=1e-8)
    assert dx[:, 1::2].abs().max() == 0


@kernels
@pytest.mark.parametrize("cls", [layers.ABN, layers.InPlaceABN])
def test_no_affine_no_running_stats(cls):
    layer = make_layer(cls, affine=False, track_running_stats=False)
    check_against_reference(layer, *random_input((3, 3, 4)))
    check_against_reference(layer.eval(), *random_input((3, 3, 4)))  # still batch statistics


@kernels
def test_bn_compatible_scale():
    layer = make_layer(layers.InPlaceABN, scale_mode="bn")
    check_against_reference(layer, *random_input((3, 3, 4)), scale_mode="bn")


# --------------------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("variant", ["I", "II", "abn"])
def test_gradcheck(variant, training):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.tensor([1.3, -0.7], dtype=torch.float64, requires_grad=True)
    bias = torch.tensor([0.2, -0.4], dtype=torch.float64, requires_grad=True)
    mean = torch.tensor([0.1, -0.2], dtype=torch.float64)
    var = torch.tensor([1.5, 0.7], dtype=torch.float64)

    def function(x, weight, bias):
        args = dict(weight=weight, bias=bias, running_mean=mean.clone(), running_var=var.clone(),
                    training=training, activation="elu", activation_param=0.8)
        if variant == "abn":
            return layers.functional.abn(x, **args)
        return layers.functional.inplace_abn(x.clone(), **args, variant=variant)

    assert torch.autograd.gradcheck(function, (x, weight, bias))


# --------------------------------------------------------------------------- BN conventions
@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
def test_running_statistics_follow_batchnorm(momentum):
    layer = layers.InPlaceABN(3, momentum=momentum, activation="identity").double()
    bn = nn.BatchNorm2d(3, momentum=momentum).double()
    for seed in range(3):
        x, _ = random_input((4, 3, 2, 3), seed=seed)
        layer(x.clone())
        bn(x)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(layer, name), getattr(bn, name), atol=1e-12, rtol=0)


def test_state_dict_keys_and_bn_checkpoint():
    bn = nn.BatchNorm2d(3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.5, -1.5, 2.0]))
        bn.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
        bn.running_mean.copy_(torch.tensor([0.3, -0.1, 0.2]))
        bn.running_var.copy_(torch.tensor([1.2, 0.8, 2.0]))
    for cls in (layers.ABN, layers.InPlaceABN, layers.InPlaceABNSync):
        layer = cls(3, scale_mode="bn").double()
        assert list(layer.state_dict()) == list(bn.state_dict())
        layer.load_state_dict(bn.state_dict())
        x, _ = random_input((2, 3, 4, 4))
        expected = nn.functional.leaky_relu(bn.eval()(x), 0.01)
        with torch.no_grad():
            torch.testing.assert_close(layer.eval()(x.clone()), expected)


def test_eval_under_no_grad_needs_no_clone():
    layer = make_layer(layers.InPlaceABN).eval()
    x, _ = random_input((2, 3, 4))
    leaf = x.clone().requires_grad_()
    with torch.no_grad():
        out = layer(leaf)
    expected = composite(x, layer.weight, layer.bias, layer.running_mean, layer.running_var,
                         False, 0.1, 1e-5, "leaky_relu", 0.01)
    torch.testing.assert_close(out, expected.detach())


# --------------------------------------------------------------------------- memory
def saved_tensors(function):
    """Tensors autograd saves while ``function`` runs, as (shape, storage pointer) pairs."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.untyped_storage().data_ptr()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = function()
    return out, saved


@pytest.mark.parametrize("cls,expected", [(layers.InPlaceABN, 1), (layers.ABN, 2)])
def test_activation_sized_tensors_saved(cls, expected):
    shape = (2, 3, 8, 8)
    x = torch.randn(shape, requires_grad=True)
    source = x * 1
    out, saved = saved_tensors(lambda: cls(3)(source))
    big = {pointer for s, pointer in saved if s == shape}
    assert len(big) == expected
    assert all(torch.Size(s).numel() <= 6 * 3 for s, _ in saved if s != shape)
    if cls is layers.InPlaceABN:
        assert out.data_ptr() == source.data_ptr() and big == {source.untyped_storage().data_ptr()}


# --------------------------------------------------------------------------- incoming grads
def expanded_grad(shape):
    return torch.ones(()).double().expand(shape)


@kernels
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "expanded"])
@pytest.mark.parametrize("variant", ["I", "II"])
def test_incoming_gradient_layouts(variant, layout):
    x, grad = random_input((2, 3, 4, 5))
    if layout == "channels_last":
        grad = grad.contiguous(memory_format=torch.channels_last)
    elif layout == "expanded":
        grad = expanded_grad(x.shape)
    untouched = grad.clone()
    layer = make_layer(layers.InPlaceABN, variant=variant)
    check_against_reference(layer, x, grad)
    assert torch.equal(grad, untouched), "backward wrote into the incoming gradient"


@kernels
def test_sum_backward():
    x, _ = random_input((2, 3, 4, 5))
    leaf = x.clone().requires_grad_()
    layer = make_layer(layers.InPlaceABN)
    layer(leaf * 1).sum().backward()
    reference = make_layer(layers.InPlaceABN)
    expected = reference_step(x, reference.weight, reference.bias, reference.running_mean.clone(),
                              reference.running_var.clone(), expanded_grad(x.shape))
    torch.testing.assert_close(leaf.grad, expected[1], atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(layer.weight.grad, expected[2], atol=1e-10, rtol=1e-8)


# --------------------------------------------------------------------------- reused gradient
def conv_norm_graph(norm_kind, generator):
    """``conv`` -> the norm (an ABN layer, or its composite twin) as float64 modules."""
    conv = nn.Conv2d(3, 4, 3, padding=1).double()
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator))
    if norm_kind == "composite":
        layer = make_layer(layers.ABN, channels=4)
        return conv, lambda t: composite(t, layer.weight, layer.bias, None, None, True, 0.1,
                                         layer.eps, "leaky_relu", 0.01)
    return conv, make_layer(getattr(layers, norm_kind), channels=4)


@kernels
@pytest.mark.parametrize("norm_kind", ["InPlaceABN", "ABN"])
def test_incoming_gradient_is_never_overwritten(monkeypatch, norm_kind):
    """conv -> norm -> conv: even a gradient that the next convolution's backward hands over
    and no use count shows anyone else holding is left alone (a hook may keep it through a
    reference no use count sees), and the gradients equal the composite's."""
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    results = {}
    for kind in (norm_kind, "composite"):
        torch.manual_seed(5)  # the convolutions' biases
        conv, norm = conv_norm_graph(kind, torch.Generator().manual_seed(5))
        head = nn.Conv2d(4, 2, 1).double()
        calls = spy_in_place_backward(monkeypatch)
        head(norm(conv(x))).pow(2).sum().backward()
        results[kind] = (conv.weight.grad, head.weight.grad, len(calls))
    assert results[norm_kind][2] == 0 and results["composite"][2] == 0
    for got, want in zip(results[norm_kind][:2], results["composite"][:2]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_outgoing_gradient_path_passes_gradcheck():  # CPU kernels (too slow simulated)
    generator = torch.Generator().manual_seed(6)
    conv, norm = conv_norm_graph("InPlaceABN", generator)
    head = nn.Conv2d(4, 2, 1).double()
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: head(norm(conv(t))), (x,))


@pytest.mark.parametrize("case", ["other_branch_pending", "caller_holds_it"])
def test_incoming_gradient_still_needed_elsewhere_is_not_overwritten(monkeypatch, case):
    """A gradient that an addition hands to the norm and to a branch whose backward has not run
    yet (built before the norm, so it runs after it), or one the caller passes and keeps, is
    read by someone else later: the norm must leave it alone."""
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    results = {}
    for kind in ("InPlaceABN", "composite"):
        generator = torch.Generator().manual_seed(8)
        torch.manual_seed(8)  # the convolutions' biases
        other = nn.Conv2d(3, 4, 3, padding=1).double()
        with torch.no_grad():
            other.weight.copy_(torch.randn(other.weight.shape, generator=generator))
        conv, norm = conv_norm_graph(kind, generator)
        calls = spy_in_place_backward(monkeypatch)
        branch = other(x)  # built first: its backward runs after the norm's
        out = norm(conv(x))
        if case == "other_branch_pending":
            (out + branch).pow(2).sum().backward()
            kept = None
        else:
            grad = torch.randn(out.shape, dtype=torch.float64, generator=generator)
            kept = grad.clone()
            out.backward(grad)
            assert torch.equal(grad, kept), "backward wrote into the caller's gradient"
        results[kind] = (conv.weight.grad, other.weight.grad, len(calls))
    assert results["InPlaceABN"][2] == 0, "the in-place gradient path was taken"
    for got, want in zip(results["InPlaceABN"][:2], results["composite"][:2]):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- numerics
@kernels
@pytest.mark.parametrize("variant", ["I", "II"])
def test_elu_near_saturation(variant):
    x, grad = random_input((4, 3, 5))
    x[:, :, 0] = -12.0  # y near -20 after scaling: z within 1e-9 of -alpha
    layer = make_layer(layers.InPlaceABN, activation="elu", variant=variant)
    check_against_reference(layer, x, grad, atol=1e-6)


@kernels
@pytest.mark.parametrize("variant", ["I", "II"])
def test_elu_saturated_outputs_give_no_nan(variant):
    x, grad = random_input((4, 3, 5))
    x[0, :, 0] = -1e3  # z == -alpha exactly in float64: y cannot be recovered
    layer = make_layer(layers.InPlaceABN, activation="elu", variant=variant)
    expected = reference_step(x, layer.weight, layer.bias, layer.running_mean.clone(),
                              layer.running_var.clone(), grad, activation="elu")
    assert all(torch.isfinite(t).all() for t in expected)
    actual = run_layer(layer, x, grad)
    assert all(torch.isfinite(t).all() for t in actual)
    torch.testing.assert_close(actual[3], expected[3])  # the bias gradient needs no inversion


@kernels
@pytest.mark.parametrize("magnitude", [1e-3, 1e3])
@pytest.mark.parametrize("variant", ["I", "II"])
def test_large_and_tiny_scales(variant, magnitude):
    layer = make_layer(layers.InPlaceABN, variant=variant)
    with torch.no_grad():
        layer.weight.mul_(magnitude)
    check_against_reference(layer, *random_input((3, 3, 6)), atol=1e-9 * max(1, magnitude))


@kernels
def test_float32_large_mean_keeps_variance():
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(8, 3, 64, generator=generator, dtype=torch.float64) + 1e4
    layer = layers.InPlaceABN(3, momentum=1.0, activation="identity")
    out = layer(x.float())
    expected_var = x.var(dim=(0, 2))
    torch.testing.assert_close(layer.running_var.double(), expected_var, rtol=1e-4, atol=0)
    expected = (x - x.mean(dim=(0, 2), keepdim=True)) / (x.var(dim=(0, 2), unbiased=False,
                                                              keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(out.double(), expected, atol=2e-3, rtol=0)


@kernels
@pytest.mark.parametrize("variant", ["I", "II"])
def test_float32_against_float64_reference(variant):
    x, grad = random_input((4, 3, 6, 6))
    layer = make_layer(layers.InPlaceABN, dtype=torch.float32, variant=variant)
    reference = make_layer(layers.InPlaceABN, variant=variant)
    expected = reference_step(x, reference.weight, reference.bias, reference.running_mean.clone(),
                              reference.running_var.clone(), grad)
    actual = run_layer(layer, x.float(), grad.float())
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.double(), e, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncs", "channels_last"])
@pytest.mark.parametrize("cls,variant", [(layers.ABN, None), (layers.InPlaceABN, "I"),
                                         (layers.InPlaceABN, "II")])
def test_float32_long_rows_many_channels(cls, variant, channels_last):
    """float32 sums over several summation blocks plus a tail, in both CPU layouts.

    The CPU kernels sum blocks of 512 elements per channel in the data's precision; each
    channel here holds several blocks and a remainder, on a mean of 50, against the float64
    composite. With enough channels, InPlaceABN in the (N, C, S) layout runs the fused
    statistics + output pass; channels-last, the rows are split into chunks of 2048, and
    the batch is large enough for each chunk to hold more than one block of rows.
    Not marked ``kernels`` (too slow under the CUDA simulator).
    """
    threads = max(1, torch.get_num_threads())
    channels = 4 * 8 * threads
    kwargs = {} if variant is None else {"variant": variant}
    layer = make_layer(cls, channels=channels, dtype=torch.float32, **kwargs)
    reference = make_layer(cls, channels=channels, **kwargs)
    x, grad = random_input((2 * threads + 1, channels, 2 * 512 + 37))
    x = away_from_the_kink(x + 50, reference)
    if channels_last:  # the (M, C) kernels, with rows of channels
        x, grad = (t.movedim(1, -1).contiguous().movedim(-1, 1) for t in (x, grad))
    expected = reference_step(x, reference.weight, reference.bias, reference.running_mean.clone(),
                              reference.running_var.clone(), grad)
    actual = run_layer(layer, x.float(), grad.float())
    for name, a, e in zip(("output", "input grad", "weight grad", "bias grad"), actual, expected):
        torch.testing.assert_close(a.double(), e, atol=1e-3, rtol=1e-4,
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("batch", [4, 9], ids=["one-group", "groups-and-remainder"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_forward_reads_rows_four_at_a_time_exactly(dtype, batch):
    """The CPU kernels' fused training forward sums each channel's rows four at a time (and
    the remainder one by one), over several blocks and a tail, on a large mean: its moments
    and output against float64 arithmetic on the same (rounded) input.
    Not marked ``kernels``: it is about ``cpu.py``."""
    from layers import ops
    from layers.kernels import common

    generator = torch.Generator().manual_seed(3)
    channels = 40  # from 32 channels on, the in-place training forward is the fused one
    x = (torch.randn(batch, channels, 2 * 512 + 37, generator=generator) * 2 + 50).to(dtype)
    exact = x.double()
    mean = exact.mean(dim=(0, 2))
    m2 = ((exact - mean[:, None]) ** 2).sum(dim=(0, 2))
    gamma = torch.rand(channels, dtype=torch.float64, generator=generator) + 0.5
    beta = torch.randn(channels, dtype=torch.float64, generator=generator)
    eps, slope = 1e-5, 0.01
    y = (exact - mean[:, None]) / torch.sqrt(m2 / (batch * x.shape[2]) + eps)[:, None]
    expected = torch.nn.functional.leaky_relu(y * gamma[:, None] + beta[:, None], slope)

    out = x.clone()
    moments = ops.moments_normalize_act_(out, gamma, beta, eps, common.ACT_LEAKY_RELU, slope)
    torch.testing.assert_close(moments[0], mean, rtol=1e-6, atol=0)
    torch.testing.assert_close(moments[1], m2, rtol=1e-5, atol=0)
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(out.double(), expected.to(dtype).double(), rtol=tolerance,
                               atol=tolerance)


@pytest.mark.parametrize("mode", ["y", "x"], ids=["from-y", "from-x"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("size", [49, 100])
def test_whole_steps_do_not_depend_on_the_channel_block(dtype, mode, size, monkeypatch):
    """The CPU whole steps run per block of channels (``cpu._channel_block``, which follows
    the cache size and the thread count); each channel's sums run in the same order whatever
    the block, so the output, the statistics and every gradient are bitwise the same with
    blocks of one channel, of three (and a remainder) and of all of them, the backward
    reading ``y`` or the stored ``x``, and with and without prefetching the next block
    (``cpu._prefetch_ahead``, forced on here, at every block size; both through
    ``cpu._blocks``), on rows of 49 elements and of 100 (where the bfloat16 pairs loops of
    AVX-512 hosts run steps that prefetch). Not marked ``kernels``: it is about ``cpu.py``."""
    from layers.kernels import common, cpu

    generator = torch.Generator().manual_seed(5)
    batch, channels = 6, 40
    x_in = (torch.randn(batch, channels, size, generator=generator) * 2 + 3).to(dtype)
    grad = torch.randn(batch, channels, size, generator=generator).to(dtype)
    weight = torch.rand(channels, generator=generator) + 0.5
    bias = torch.randn(channels, generator=generator)
    backward_mode = {"y": common.MODE_Y, "x": common.MODE_XHAT_FROM_X}[mode]
    results = []
    settings = [(block, prefetch) for prefetch in (False, True) for block in (1, 3, channels)]
    for block, prefetch in settings:
        monkeypatch.setattr(cpu, "_blocks", lambda shape, size, tensors, threads, b=block,
                            on=prefetch: (b, b if on else 0))
        y, dz = x_in.clone(), grad.clone()
        running_mean, running_var = torch.zeros(channels), torch.ones(channels)
        state = cpu.forward_step(y, y, weight, bias, running_mean, running_var, True, 0.1, 1e-5,
                                 common.ACT_LEAKY_RELU, 0.01, True)
        stored = x_in if mode == "x" else None
        dweight, dbias = cpu.backward_step(y, dz, stored, state, common.ACT_LEAKY_RELU, 0.01,
                                           backward_mode, True, True, torch.float32, True,
                                           True)
        results.append([y, dz, running_mean, running_var, state, dweight, dbias])
    names = ("output", "input grad", "running mean", "running var", "state", "weight grad",
             "bias grad")
    for (block, prefetch), other in zip(settings[1:], results[1:]):
        for name, one, blocked in zip(names, results[0], other):
            assert torch.equal(one, blocked), \
                f"{name} with blocks of {block} channels, prefetching: {prefetch}"


@pytest.mark.parametrize("cls", [layers.ABN, layers.InPlaceABN], ids=lambda c: c.__name__)
def test_backward_is_differentiable_once(cls):
    """The layers' backward (``functional.once_differentiable``, which skips torch's
    ``no_grad`` context where grad mode is already off) gives the same gradients with and
    without ``create_graph=True``, and differentiating those gradients again (with respect to
    an incoming gradient that requires grad) is refused, as torch's ``once_differentiable``
    refuses it."""
    layer = make_layer(cls)
    x, grad = random_input((4, 3, 5))
    plain = run_layer(layer, x, grad)[1:]
    leaf = x.clone().requires_grad_()
    graph = torch.autograd.grad(layer(leaf * 1), [leaf, layer.weight, layer.bias],
                                grad.clone().requires_grad_(), create_graph=True)
    for name, one, other in zip(("input", "weight", "bias"), plain, graph):
        assert torch.equal(one, other.detach()), f"{name} grad"
    with pytest.raises(RuntimeError, match="differentiate twice"):
        graph[0].sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_whole_steps_take_strided_tensors_as_contiguous_ones(dtype):
    """The CPU whole-step kernels read contiguous tensors at their addresses
    (``cpu._address``), with per-channel vectors of one dtype, and anything else through numpy
    views (``cpu._addressable``, ``cpu._vector_element``): strided per-channel vectors (every
    other element of a buffer), and vectors of mixed dtypes (float64 weight and bias, float32
    running statistics, the same values), give the output, state, running statistics and
    gradients of contiguous float32 ones, bitwise, with the running statistics updated in the
    given tensors themselves; a strided data view (which the layers never pass: their
    canonical views are contiguous) runs the kernels one by one, whose sums may round
    differently in the last bits."""
    from layers.kernels import common, cpu

    generator = torch.Generator().manual_seed(11)
    batch, channels, size = 4, 40, 30
    x_in = torch.randn(batch, channels, size, generator=generator).to(dtype)
    grad = torch.randn(batch, channels, size, generator=generator).to(dtype)
    vectors = [torch.rand(channels, generator=generator) + 0.5,
               torch.randn(channels, generator=generator), torch.zeros(channels),
               torch.ones(channels)]

    def step(given_vectors, strided_data):
        if given_vectors == "strided":
            buffers = [torch.stack([v, torch.full_like(v, 7.0)], 1) for v in vectors]
            weight, bias, mean, var = (b[:, 0] for b in buffers)  # strides (2,)
        elif given_vectors == "mixed dtypes":
            weight, bias = (v.double() for v in vectors[:2])
            mean, var = (v.clone() for v in vectors[2:])
        else:
            weight, bias, mean, var = (v.clone() for v in vectors)
        if strided_data:  # (N, C, S) views with a stride of 2 along S
            y = torch.stack([x_in, x_in], 3).flatten(2)[:, :, ::2]
            dz = torch.stack([grad, grad], 3).flatten(2)[:, :, ::2]
        else:
            y, dz = x_in.clone(), grad.clone()
        by_address = given_vectors == "contiguous" and not strided_data
        assert (cpu._addressable(y, weight, bias, mean, var)
                and cpu._vector_element(weight, bias, mean, var) is not None) == by_address
        state = cpu.forward_step(y, y, weight, bias, mean, var, True, 0.1, 1e-5,
                                 common.ACT_LEAKY_RELU, 0.01, True)
        dweight, dbias = cpu.backward_step(y, dz, None, state, common.ACT_LEAKY_RELU, 0.01,
                                           common.MODE_Y, True, True, torch.float32, True, True)
        return [y, dz, mean, var, state, dweight, dbias]

    names = ("output", "input grad", "running mean", "running var", "state", "weight grad",
             "bias grad")
    contiguous = step("contiguous", False)
    assert not torch.equal(contiguous[2], vectors[2])  # the running mean moved
    for given in ("strided", "mixed dtypes"):
        for name, one, other in zip(names, contiguous, step(given, False)):
            assert torch.equal(one, other), f"{name}, {given} vectors"
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # a float32 rounding, a bfloat16 one
    for name, one, other in zip(names, contiguous, step("contiguous", True)):
        torch.testing.assert_close(other.double(), one.double(), rtol=tolerance,
                                   atol=tolerance, msg=f"{name}, strided data")


def _cache_directory(root, caches):
    """A directory laid out as Linux's ``/sys/devices/system/cpu/cpu0/cache``: one
    ``index<i>`` per ``(level, type, size)`` of ``caches``."""
    root.mkdir()
    for index, (level, kind, size) in enumerate(caches):
        entry = root / f"index{index}"
        entry.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (entry / name).write_text(f"{text}\n")
    return str(root)


def test_l2_cache_size_is_read_from_the_cache_listing(tmp_path):
    from layers.kernels import cpu

    zen5 = [("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "1024K"),
            ("3", "Unified", "32768K")]
    assert cpu._l2_cache_bytes(_cache_directory(tmp_path / "a", zen5)) == 2 ** 20
    listed_in_mib = [("2", "Instruction", "1M"), ("2", "Data", "2M")]
    assert cpu._l2_cache_bytes(_cache_directory(tmp_path / "b", listed_in_mib)) == 2 * 2 ** 20
    no_l2 = [("1", "Data", "32K"), ("3", "Unified", "8M")]
    assert cpu._l2_cache_bytes(_cache_directory(tmp_path / "c", no_l2)) == 0
    assert cpu._l2_cache_bytes(str(tmp_path / "missing")) == 0


@pytest.mark.parametrize("shape, dtype, tensors, l2, expected", [
    ((32, 256, 3136), torch.bfloat16, 1, 2 ** 20, "block"),  # 2 x 196 KiB in half of 1 MiB
    ((32, 512, 784), torch.bfloat16, 2, 2 ** 20, "block"),  # 2 x 196 KiB (2 channels)
    ((32, 256, 3136), torch.bfloat16, 2, 2 * 2 ** 20, "block"),  # 2 x 392 KiB, half of 2 MiB
    ((32, 256, 3136), torch.bfloat16, 2, 2 ** 20, 0),  # not in half of 1 MiB
    ((32, 256, 3136), torch.bfloat16, 1, 512 * 2 ** 10, 0),  # not in half of 512 KiB
    ((32, 256, 3136), torch.bfloat16, 1, 0, 0),  # L2 size unknown
    ((32, 256, 3136), torch.float32, 1, 4 * 2 ** 20, 0),  # float32: bound by memory
    ((128, 2048, 49), torch.bfloat16, 1, 2 ** 20, 0),  # rows of 98 bytes, in 24.5 MiB
    ((32, 1024, 196), torch.bfloat16, 1, 2 ** 20, "block"),  # rows of 392 bytes, 12 MiB
    ((256, 1024, 196), torch.bfloat16, 1, 2 ** 20, "block"),  # the same rows in 98 MiB
    ((16, 1024, 196), torch.bfloat16, 1, 2 ** 20, 0),  # 6 MiB: held by the caches
    ((16, 1024, 196), torch.bfloat16, 2, 2 ** 20, "block"),  # 6 MiB, read twice
    ((8, 64, 3136), torch.bfloat16, 1, 2 ** 20, 0),  # 3 MiB: held by the caches
    ((32, 64, 3136), torch.float16, 2, 2 * 2 ** 20, "block"),  # 12 MiB, read twice
], ids=str)
def test_whole_steps_prefetch_long_16_bit_rows_of_large_tensors_twice_in_half_the_l2(
        shape, dtype, tensors, l2, expected, monkeypatch):
    from layers.kernels import cpu

    monkeypatch.setattr(cpu, "_l2_cache_bytes", lambda: l2)
    size = torch.empty((), dtype=dtype).element_size()
    block = cpu._channel_block(shape, size, tensors, 2)
    assert cpu._prefetch_ahead(shape, size, tensors, block) == (block if expected == "block"
                                                                else 0)


def away_from_the_kink(x, layer, margin=1e-4):
    """``x`` with the few elements whose normalized value ``y`` lies within ``margin`` of the
    activation's kink at 0 moved off it.

    With a mean of 50, float32 rounds ``x - mean`` by about 3e-6: an element that close to the
    kink may take the other branch of the activation in float32 than in the float64
    reference, a legitimate difference of ``(1 - slope) * dz`` in its gradient.
    """
    x = x.clone()
    for _ in range(3):
        y = composite(x, layer.weight, layer.bias, None, None, True, 0.1, layer.eps, "identity",
                      None)
        near = y.abs() < margin
        if not near.any():
            return x
        x[near] += 100 * margin
    raise AssertionError("could not move the inputs away from the kink")


# --------------------------------------------------------------------------- bad input
def non_leaf(shape=(2, 3, 4), dtype=torch.float32):
    return torch.randn(shape, dtype=dtype, requires_grad=True) * 1


@pytest.mark.parametrize("build,call,match", [
    (lambda: layers.InPlaceABN(3), lambda m: m(torch.ones(2, 3, 4, dtype=torch.int64)),
     "one of float64, float32, float16, bfloat16"),
    (lambda: layers.InPlaceABN(3), lambda m: m(non_leaf((2, 4, 4))), "weight has shape"),
    (lambda: layers.InPlaceABN(3), lambda m: m(non_leaf((3,))), r"\(N, C, \*\)"),
    (lambda: layers.InPlaceABN(3, activation="relu"), None, "relu is not invertible"),
    (lambda: layers.InPlaceABN(3, activation="leaky_relu", activation_param=0.0), None,
     "slope must be > 0"),
    (lambda: layers.ABN(3, activation="leaky_relu", activation_param=-0.5), None,
     "slope must be >= 0"),
    (lambda: layers.InPlaceABN(3, activation="tanh"), None, "activation='tanh'"),
    (lambda: layers.InPlaceABN(3, variant="III"), None, "variant='III'"),
    (lambda: layers.ABN(3, scale_mode="weird"), None, "scale_mode='weird'"),
    (lambda: layers.InPlaceABN(3), lambda m: m(non_leaf((1, 3, 1))), "more than 1 value"),
    (lambda: layers.InPlaceABN(3), lambda m: m(torch.randn(2, 3, 4, requires_grad=True)),
     "leaf tensor that requires grad"),
    (lambda: nn.Sequential(layers.InPlaceABN(3), layers.InPlaceABN(3)),
     lambda m: m(non_leaf()), "output of another in-place ABN"),
])
def test_bad_input_is_refused(build, call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        module = build()
        call(module)


def test_chained_inplace_layers_work_with_a_clone():
    first, second = layers.InPlaceABN(3), layers.InPlaceABN(3)
    x = non_leaf()
    second(first(x).clone()).sum().backward()
    assert first.weight.grad is not None and torch.isfinite(first.weight.grad).all()


def test_numba_loops_follow_torch_threads():
    import numba

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        layers.InPlaceABN(3)(non_leaf())
        assert numba.get_num_threads() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("activation,param", [("leaky_relu", 0.01), ("elu", 1.0)])
def test_many_channels_match_composite(activation, param):
    """Enough channels per thread for the CPU kernels' fused statistics + output pass.

    Not marked ``kernels``: it is about ``cpu.py``, and under the CUDA simulator 64 channels
    (64 blocks of 256 simulated threads) would take minutes.
    """
    channels = 4 * 8 * max(1, torch.get_num_threads())
    generator = torch.Generator().manual_seed(7)
    layer = layers.InPlaceABN(channels, activation=activation, activation_param=param).double()
    with torch.no_grad():
        layer.weight.uniform_(-2, 2, generator=generator)
        layer.bias.normal_(generator=generator)
    x = torch.randn(3, channels, 5, dtype=torch.float64, generator=generator) * 3 + 100
    check_against_reference(layer, x, torch.randn(x.shape, dtype=torch.float64,
                                                  generator=generator))


# --------------------------------------------------------------------------- module conventions
ABN_CLASSES = [layers.ABN, layers.InPlaceABN, layers.ABNSync, layers.InPlaceABNSync]


def test_abn_layers_are_not_batchnorms_but_norm_types():
    """PyTorch's BN walkers select ``_BatchNorm``: the ABN layers are not, NORM_TYPES has them."""
    for cls in ABN_CLASSES:
        layer = cls(3)
        assert not isinstance(layer, nn.modules.batchnorm._BatchNorm)
        assert isinstance(layer, layers.NORM_TYPES)
    assert isinstance(nn.BatchNorm2d(3), layers.NORM_TYPES)
    assert isinstance(nn.SyncBatchNorm(3), layers.NORM_TYPES)
    assert not isinstance(nn.GroupNorm(1, 3), layers.NORM_TYPES)


def test_torch_sync_batchnorm_converter_leaves_abn_layers_alone():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), layers.InPlaceABN(4, activation="elu"),
                          nn.Conv2d(4, 4, 1), layers.ABN(4, activation="relu"))
    layer, abn = model[1], model[3]
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert converted[1] is layer and converted[3] is abn
    assert converted[1].activation == "elu" and converted[3].activation == "relu"
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in converted.modules())


def test_torch_func_batchnorm_replacement_leaves_abn_layers_alone():
    from torch.func import replace_all_batch_norm_modules_

    model = nn.Sequential(nn.Conv2d(3, 4, 1), layers.InPlaceABN(4))
    replace_all_batch_norm_modules_(model)
    assert model[1].running_mean is not None and model[1].track_running_stats


@pytest.mark.parametrize("cls", [layers.ABN, layers.InPlaceABN])
def test_a_parametrized_weight_is_read_as_an_attribute(cls):
    """The layers read their parameters and buffers from the module's registries, where they
    are registered there: a parametrization moves ``weight`` out of them (a property computed
    from its original), and the layer must then use that property, not run as if affine were
    off. The result is compared with the composite on the parametrized weight."""
    from torch.nn.utils import parametrize

    class Doubled(nn.Module):
        def forward(self, weight):
            return 2 * weight

    layer = make_layer(cls)
    parametrize.register_parametrization(layer, "weight", Doubled())
    assert "weight" not in layer._parameters
    x, grad = random_input((4, 3, 5))
    running_mean, running_var = layer.running_mean.clone(), layer.running_var.clone()
    z, _, _, _ = reference_step(x, layer.weight.detach(), layer.bias.detach(), running_mean,
                                running_var, grad, activation=layer.activation,
                                param=layer.activation_param)
    out = layer(x.clone())
    torch.testing.assert_close(out, z)
    torch.testing.assert_close(layer.running_mean, running_mean)
    out.backward(grad)
    assert layer.parametrizations.weight.original.grad is not None


@pytest.mark.parametrize("cls", ABN_CLASSES)
def test_parameters_buffers_and_defaults_follow_batchnorm(cls):
    layer, bn = cls(5), nn.BatchNorm2d(5)
    assert [n for n, _ in layer.named_parameters()] == [n for n, _ in bn.named_parameters()]
    assert [n for n, _ in layer.named_buffers()] == [n for n, _ in bn.named_buffers()]
    for name, value in bn.state_dict().items():
        assert torch.equal(layer.state_dict()[name], value), name
        assert layer.state_dict()[name].dtype == value.dtype, name
    assert layer.double().num_batches_tracked.dtype == torch.long
    assert layer.weight.dtype == torch.float64
    off = cls(5, affine=False, track_running_stats=False)
    assert off.weight is off.bias is off.running_mean is off.num_batches_tracked is None
    assert list(off.state_dict()) == list(nn.BatchNorm2d(5, affine=False,
                                                         track_running_stats=False).state_dict())
    assert repr(layer).startswith(f"{cls.__name__}(5, eps=1e-05, momentum=0.1, affine=True, "
                                  "track_running_stats=True, activation=leaky_relu")


def test_reset_parameters_and_running_stats():
    layer = make_layer(layers.InPlaceABN)
    layer.num_batches_tracked.fill_(7)
    layer.reset_running_stats()
    assert torch.equal(layer.running_mean, torch.zeros(3, dtype=torch.float64))
    assert torch.equal(layer.running_var, torch.ones(3, dtype=torch.float64))
    assert int(layer.num_batches_tracked) == 0
    assert not torch.equal(layer.weight, torch.ones(3, dtype=torch.float64))
    layer.reset_parameters()
    assert torch.equal(layer.weight, torch.ones(3, dtype=torch.float64))
    assert torch.equal(layer.bias, torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("cls", [layers.ABN, layers.InPlaceABN])
def test_legacy_checkpoint_without_num_batches_tracked_loads_as_batchnorm(cls):
    """BN's rule: a state dict of version < 2 (or none) may lack num_batches_tracked."""
    from collections import OrderedDict

    state = nn.BatchNorm2d(3).state_dict()
    del state["num_batches_tracked"]
    legacy = OrderedDict(state)  # no _metadata: a pre-0.4.1 checkpoint
    for module in (cls(3), nn.BatchNorm2d(3)):
        module.num_batches_tracked.fill_(4)
        assert module.load_state_dict(legacy) is not None
        assert int(module.num_batches_tracked) == 4  # kept, as BN does
        with pytest.raises(RuntimeError, match="num_batches_tracked"):
            module.load_state_dict(state)  # version 2 metadata: the key is required
        with torch.device("meta"):
            fresh = type(module)(3)
        fresh.load_state_dict(legacy, assign=True)
        assert int(fresh.num_batches_tracked) == 0


def test_eval_uses_running_statistics_and_counts_no_batch():
    layer = make_layer(layers.InPlaceABN).eval()
    x, grad = random_input((2, 3, 4))
    check_against_reference(layer, x, grad)
    assert int(layer.num_batches_tracked) == 0
    layer.train()
    layer(x.clone())
    assert int(layer.num_batches_tracked) == 1


# --------------------------------------------------------------------------- |weight| check
#: Whether the kernels in use check ``scale_mode="bn"`` weights on the device (the CUDA kernels,
#: here under LAYERS_KERNELS=cudasim) rather than on the host before the forward (CPU kernels).
DEVICE_CHECKED = getattr(layers.kernels.backend(torch.zeros(1)), "DEVICE_GUARD", False)
device_checked = pytest.mark.skipif(not DEVICE_CHECKED,
                                    reason="the CPU kernels check on the host, at once")
REFUSAL = r"scale_mode='bn' needs \|weight\| >= eps=1e-05 .* channel\(s\) 1 of weight " \
          r"\(shape \(2,\)\): min \|weight\| = 0;"


def refused_layer(**kwargs):
    """A 2-channel ``scale_mode="bn"`` layer whose weight 1 is 0 (< eps), and its state."""
    layer = make_layer(layers.InPlaceABN, channels=2, scale_mode="bn", **kwargs)
    with torch.no_grad():
        layer.weight[1] = 0.0
    return layer, [t.clone() for t in (layer.running_mean, layer.running_var)]


def small_input(seed=3):
    x, _ = random_input((2, 2, 3), seed=seed)
    return x.requires_grad_() * 1  # non-leaf


@kernels
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_bn_scale_refusal_writes_nothing_and_raises_by_backward(training):
    layer, running = refused_layer()
    layer.train(training)
    x = small_input()
    before = x.detach().clone()
    count = layer.num_batches_tracked.clone()
    with pytest.raises(ValueError, match=REFUSAL):
        out = layer(x)
        # On the device the forward is refused there, without a host read: it returns, having
        # written nothing; the error comes at the latest in backward.
        assert DEVICE_CHECKED and out is x
        assert torch.equal(x.detach(), before)
        out.sum().backward()
    assert torch.equal(x.detach(), before)
    assert torch.equal(layer.running_mean, running[0])
    assert torch.equal(layer.running_var, running[1])
    assert torch.equal(layer.num_batches_tracked, count)  # the count adds the device's verdict


@kernels
@device_checked
def test_bn_scale_refusal_raised_at_next_forward_and_by_check_pending():
    layer, running = refused_layer()
    layer(small_input())  # no backward follows
    with pytest.raises(ValueError, match=REFUSAL):
        layer(small_input())  # this layer's next forward reads the earlier result
    layers.functional.check_pending()  # raised once: nothing pending now
    x = small_input()
    before = x.detach().clone()
    layer(x)
    assert torch.equal(x.detach(), before)
    with pytest.raises(ValueError, match=REFUSAL):
        layers.functional.check_pending()
    assert torch.equal(layer.running_mean, running[0])


@kernels
@device_checked
def test_bn_scale_refusal_when_the_device_is_behind(monkeypatch):
    """The host reaches backward before the device has read the weight: the backward runs with
    NaN gradients (never garbage from the unwritten output) without waiting for the device;
    the refusal stays pending until the host can read it (here: check_pending, which waits)."""
    waits = []
    ready = [False]
    monkeypatch.setattr(layers.functional, "_ready", lambda check: ready[0])
    monkeypatch.setattr(layers.functional, "_wait", lambda check: waits.append(check))
    layer, running = refused_layer()
    leaf = small_input().detach().requires_grad_()
    x = leaf * 1
    before = x.detach().clone()
    out = layer(x)
    assert torch.equal(out.detach(), before) and torch.equal(layer.running_mean, running[0])
    out.sum().backward()  # the device has not reported: nothing raised, nothing waited for
    assert waits == []
    assert torch.isnan(leaf.grad).all()
    assert torch.isnan(layer.weight.grad).all() and torch.isnan(layer.bias.grad).all()
    layer(small_input())  # still not reported: the next forward does not wait either
    assert waits == []
    with pytest.raises(ValueError, match=REFUSAL):
        layers.functional.check_pending()  # waits for the device, then raises
    assert len(waits) == 1
    ready[0] = True
    with pytest.raises(ValueError, match=REFUSAL):
        layer(small_input())  # the second forward's refusal, read once reported
    layers.functional.check_pending()  # nothing left


@kernels
@device_checked
def test_bn_scale_passing_check_when_the_device_is_behind(monkeypatch):
    """Gradients are unchanged when the check's result is read only after the backward."""
    layer = make_layer(layers.InPlaceABN, channels=2, scale_mode="bn")
    x, grad = random_input((2, 2, 3))
    expected = run_layer(layer, x, grad)
    monkeypatch.setattr(layers.functional, "_ready", lambda check: False)
    monkeypatch.setattr(layers.functional, "_wait", lambda check: None)
    for got, want in zip(run_layer(layer, x, grad), expected):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    layers.functional.check_pending()


def count_host_reads(monkeypatch):
    """A list that grows by one at each host read of a tensor or device synchronisation."""
    calls = []

    def counting(name, original):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)
        return wrapper

    for name in ("item", "tolist", "cpu", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", counting("synchronize", torch.cuda.synchronize))
    monkeypatch.setattr(torch.cuda.Event, "synchronize",
                        counting("Event.synchronize", torch.cuda.Event.synchronize))
    monkeypatch.setattr(layers.functional, "_wait",
                        counting("_wait", layers.functional._wait))
    return calls


@kernels
@device_checked
def test_training_steps_check_weights_without_host_synchronisation(monkeypatch):
    layer = make_layer(layers.InPlaceABN, channels=2, scale_mode="bn")
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    checks = []
    original = layers.functional._DeviceCheck

    def device_check(weight, eps):
        checks.append(weight._version)
        return original(weight, eps)

    monkeypatch.setattr(layers.functional, "_DeviceCheck", device_check)
    reads = count_host_reads(monkeypatch)
    for step in range(2):
        layer(small_input(seed=step)).sum().backward()
        optimizer.step()
    assert reads == []
    assert len(checks) == 2 and checks[0] != checks[1]  # each new weight checked on the device


def test_weight_check_on_cpu_kernels_is_immediate(monkeypatch):
    """The CPU kernels check on the host (no synchronisation to save), at every forward."""
    if DEVICE_CHECKED:
        pytest.skip("the CUDA kernels check on the device")
    checks = []
    original = layers.functional.check_invertible_scale
    monkeypatch.setattr(layers.functional, "check_invertible_scale",
                        lambda weight, eps: checks.append(None) or original(weight, eps))
    layer, running = refused_layer()
    with torch.no_grad():
        layer.weight[1] = 1.0
    for _ in range(2):
        layer(small_input())
    assert len(checks) == 2
    with torch.no_grad():
        layer.weight[1] = 0.0
    x = small_input()
    before = x.detach().clone()
    running = [t.clone() for t in (layer.running_mean, layer.running_var)]
    with pytest.raises(ValueError, match=REFUSAL):
        layer(x)  # in the forward itself, before the kernels run
    assert torch.equal(x.detach(), before)
    assert torch.equal(layer.running_mean, running[0])
    assert not layers.functional._pending


@kernels
def test_weight_check_refuses_nan_weights():
    layer, _ = refused_layer()
    with torch.no_grad():
        layer.weight[1] = float("nan")
    with pytest.raises(ValueError, match=r"channel\(s\) 1 of weight .* min \|weight\| = nan"):
        layer(small_input()).sum().backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_weight_check_does_not_synchronise_a_gpu():
    layer = layers.InPlaceABN(8, scale_mode="bn").cuda()
    conv = nn.Conv2d(3, 8, 1).cuda()
    optimizer = torch.optim.SGD([*layer.parameters(), *conv.parameters()], lr=0.1)
    x = torch.randn(4, 3, 16, 16, device="cuda")
    layer(conv(x)).sum().backward()  # compiles the kernels
    optimizer.step()
    torch.cuda.synchronize()
    for _ in range(2):
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = layer(conv(x))  # a new weight version each time: checked on the device
            out.sum().backward()  # reads the check's result only if it has arrived
        finally:
            torch.cuda.set_sync_debug_mode("default")
        optimizer.step()
    with torch.no_grad():
        layer.weight[3] = 0.0
    y = conv(x)
    before = y.detach().clone()
    with pytest.raises(ValueError, match=r"channel\(s\) 3 of weight"):
        out = layer(y)
        torch.cuda.synchronize()
        assert torch.equal(y.detach(), before)
        out.sum().backward()
    assert torch.equal(y.detach(), before)


# --------------------------------------------------------------------------- empty inputs
@pytest.mark.parametrize("shape", [(0, 3, 4, 5), (2, 3, 0, 5), (0, 3)], ids=str)
def test_cpu_kernels_accept_empty_views(shape):
    from layers.kernels import common, cpu

    x = torch.empty(shape, dtype=torch.float32)
    n, c = x.shape[:2]
    spatial = math.prod(shape[2:])
    views = {"ncs": x.reshape(n, c, spatial), "mc": x.movedim(1, -1).reshape(n * spatial, c)}
    vec = torch.ones(c, dtype=torch.float32)
    vec64 = torch.ones(c, dtype=torch.float64)
    for name, view in views.items():
        assert torch.isnan(cpu.moments(view)).all() and cpu.moments(view).shape == (2, c)
        moments = cpu.moments_forward(view, view, vec64, vec64, 1e-5, common.ACT_LEAKY_RELU, 0.1)
        assert moments.shape == (2, c) and torch.isnan(moments).all(), name
        cpu.forward(view, torch.empty_like(view), vec, vec, common.ACT_ELU, 1.0)
        sums = cpu.backward_reduce(view, view, view, vec, vec, common.ACT_LEAKY_RELU, 0.1,
                                   common.MODE_Y)
        assert torch.equal(sums, torch.zeros(2, c, dtype=torch.float64)), name
        coef = torch.ones(3, c, dtype=torch.float32)
        cpu.backward_input(view, view, view, vec, vec, coef, common.ACT_LEAKY_RELU, 0.1,
                           common.MODE_XHAT_FROM_X, torch.empty_like(view))


@kernels
@pytest.mark.parametrize("shape", [(0, 3, 4, 5), (2, 3, 0, 5)], ids=str)
@pytest.mark.parametrize("cls", [layers.ABN, layers.InPlaceABN])
def test_empty_batches_in_eval_and_refused_in_training(cls, shape):
    layer = make_layer(cls).eval()
    x = torch.empty(shape, dtype=torch.float64)
    leaf = x.clone().requires_grad_()
    out = layer(leaf * 1)
    assert out.shape == shape
    out.sum().backward()
    assert leaf.grad.shape == shape
    assert torch.equal(layer.weight.grad, torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="more than 1 value"):
        layer.train()(x.clone())


# --------------------------------------------------------------------------- threads
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncs", "channels_last"])
@pytest.mark.parametrize("channels, small", [(6, True), (6, False), (40, True)],
                         ids=["few-channels", "few-channels-large", "many-channels"])
@pytest.mark.parametrize("cls", [layers.ABN, layers.InPlaceABN])
def test_results_do_not_depend_on_the_thread_count(cls, channels, small, channels_last,
                                                   monkeypatch):
    """Bitwise equal with 1 and 2 threads: the sums' order follows the shape only (the
    channels-last chunks, the fused training forward from 32 channels on and on small
    tensors; ``small`` false: the size limit set to 0, as a large tensor with few channels
    sees it)."""
    import numba

    from layers.kernels import cpu

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has a single thread")
    if not small:
        monkeypatch.setattr(cpu, "_FUSED_MAX_ANY_CHANNELS", 0)
    x, grad = random_input((5, channels, 2 * 512 + 37), dtype=torch.float32)
    x = x + 20
    if channels_last:  # 5285 rows: three chunks of rows, each of several blocks
        x, grad = (t.movedim(1, -1).contiguous().movedim(-1, 1) for t in (x, grad))
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            layer = make_layer(cls, channels=channels, dtype=torch.float32)
            results.append(run_layer(layer, x, grad) + (layer.running_var.clone(),))
    finally:
        torch.set_num_threads(before)
    for name, one, two in zip(("output", "input grad", "weight grad", "bias grad",
                               "running var"), *results):
        assert torch.equal(one, two), name


def test_ncs_kernels_walk_every_row_for_any_chunking():
    """The ``(N, C, S)`` CPU kernels split the ``N * C`` rows into chunks and step from row to
    row without dividing; with every chunk count from 1 to ``N * C`` (chunks that start
    mid-item and cross into the next batch item included) each kernel matches a float64
    reference computed with torch operators."""
    from layers.kernels import common, cpu

    n, c, s, slope = 3, 4, 5, 0.01
    generator = torch.Generator().manual_seed(11)
    x, dz = (torch.randn(n, c, s, dtype=torch.float64, generator=generator) for _ in range(2))
    a, b, p, q = (torch.rand(c, dtype=torch.float64, generator=generator) + 0.5
                  for _ in range(4))
    coef = torch.rand(3, c, dtype=torch.float64, generator=generator)
    z = torch.where(x > 0, x, x * slope)  # a leaky ReLU output, which the backward inverts
    dy = torch.where(z > 0, dz, dz * slope)
    # MODE_XHAT_FROM_Y: the recovered BN output, scaled and shifted (MODE_Y runs this kernel)
    v = torch.where(z > 0, z, z / slope) * p[:, None] + q[:, None]
    act, mode = common.ACT_LEAKY_RELU, common.MODE_XHAT_FROM_Y
    floor = cpu._elu_floor(z)
    for chunks in range(1, n * c + 1):
        mean, m2 = torch.from_numpy(cpu._moments_ncs(x.numpy(), chunks))
        torch.testing.assert_close(mean, x.mean((0, 2)))
        torch.testing.assert_close(m2, ((x - x.mean((0, 2))[:, None]) ** 2).sum((0, 2)))
        out = torch.empty_like(x)
        cpu._forward_ncs[act](x.numpy(), out.numpy(), a.numpy(), b.numpy(), slope, chunks)
        y = x * a[:, None] + b[:, None]
        torch.testing.assert_close(out, torch.where(y >= 0, y, y * slope))
        sums = torch.from_numpy(cpu._backward_reduce_ncs[act, mode](
            z.numpy(), dz.numpy(), z.numpy(), p.numpy(), q.numpy(), slope, floor, chunks))
        torch.testing.assert_close(sums, torch.stack([dy.sum((0, 2)), (dy * v).sum((0, 2))]))
        grad = dz.clone()
        cpu._backward_input_ncs[act, mode](z.numpy(), grad.numpy(), z.numpy(), p.numpy(),
                                           q.numpy(), coef.numpy(), slope, floor, chunks)
        k0, k1, k2 = (k[:, None] for k in coef)
        torch.testing.assert_close(grad, dy * k0 + v * k1 + k2)


# --------------------------------------------------------------------------- host path per call
class _DispatchedOps(TorchDispatchMode):
    """The ATen operators dispatched while entered (names, with repeats)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


#: What a backend's whole step may dispatch besides its kernels: allocations, views of its
#: arguments and (``aten.lift_fresh``) tensors over the arrays the CPU kernels wrote. Anything
#: else is per-channel arithmetic outside the kernels or, where it reads a value back
#: (``aten._local_scalar_dense``, a copy to the CPU), a synchronisation on a GPU.
_STEP_OPERATORS = {"aten.empty", "aten.empty_like", "aten.empty_strided", "aten.zeros",
                   "aten.zero_", "aten.fill_", "aten.detach", "aten.view", "aten.select",
                   "aten.alias", "aten.lift_fresh"}
#: Kernel launches of one training call's whole steps (InPlace-ABN II with weight and bias), per
#: backend: on the CPU one compiled call each way; on CUDA the forward's statistics, per-channel
#: state and output, the backward's sums, per-channel gradients and input gradient (variant II
#: reads no ``p``, ``q``).
_LAUNCHES = {"layers.kernels.cpu": {"forward_step": 1, "backward_step": 1},
             "layers.kernels.cuda": {"forward_step": 3, "backward_step": 3}}


@kernels
def test_a_layer_call_is_one_whole_step_each_way_of_kernels_and_allocations(monkeypatch):
    """Per training call, InPlace-ABN hands its backend one whole step each way, which runs its
    kernel launches with nothing but allocations and views between them: the per-channel
    arithmetic stays in the kernels and no operator reads a value back to the host (issue 59,
    a GPU path whose cost is its kernels). Run on the CPU kernels and, under
    ``LAYERS_KERNELS=cudasim``, on the CUDA ones."""
    x, grad = random_input((4, 3, 5, 5))
    leaf = x.detach().clone().requires_grad_()
    backend = layers.kernels.backend(x)
    launch = backend._launch  # each backend's one launch function
    launched, dispatched = [], {}

    def trace(name, step):
        def traced(*args, **kwargs):
            launched.append(name)
            with _DispatchedOps() as ops:
                result = step(*args, **kwargs)
            dispatched.setdefault(name, []).append(set(ops.names))
            return result
        return traced

    for name in ("forward_step", "backward_step"):
        monkeypatch.setattr(backend, name, trace(name, getattr(backend, name)))
    monkeypatch.setattr(backend, "_launch",
                        lambda *args: launched.append("launch") or launch(*args))
    layer = make_layer(layers.InPlaceABN, variant="II")
    layer(leaf * 1).backward(grad)
    expected = _LAUNCHES[backend.__name__]
    # each step once, its launches inside it
    assert launched == [step for step, count in expected.items()
                        for step in [step] + ["launch"] * count], launched
    for name, (ops,) in dispatched.items():
        assert ops <= _STEP_OPERATORS, f"{name} dispatched {sorted(ops)}"
