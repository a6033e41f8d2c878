"""The kernels as custom operators: fake tensors, the meta device, opcheck and torch.compile.

The references are independent of the operators' fake implementations: eager runs on real
tensors (shapes, dtypes, strides and what autograd saves) and eager results (values,
gradients, running statistics) for ``torch.compile``.
"""
import contextlib
import copy
import functools

import pytest
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

from layers import ABN, InPlaceABN, densenet, functional, ops
from layers.kernels import common
from layers.residual import NormAct, PreActBlock

ACTIVATIONS = [("leaky_relu", 0.01), ("elu", 1.0), ("identity", None)]
LAYOUTS = ("contiguous", "channels_last", "strided")
SHAPE = (2, 3, 4, 5)


def laid_out(x, layout):
    """``x`` (same values) in ``layout``: contiguous, channels-last, or neither (a transpose)."""
    if layout == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "strided":
        return x.transpose(2, 3).contiguous().transpose(2, 3)
    return x.contiguous()


def signature(t):
    """What a fake run must reproduce of a tensor: shape, dtype, strides."""
    return None if t is None else (tuple(t.shape), t.dtype, t.stride())


def layer_step(cls, kwargs, layout, training):
    """One forward + backward of a fresh layer: signatures of the output, of every tensor
    autograd saved (in save order) and of every gradient."""
    layer = cls(SHAPE[1], dtype=torch.float64, **kwargs).train(training)
    base = torch.randn(SHAPE, dtype=torch.float64, requires_grad=True)
    x = laid_out(base * 1.0, layout)  # a non-leaf: in-place layers may overwrite it
    saved = []

    def pack(t):
        saved.append(signature(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    grad = laid_out(torch.randn(SHAPE, dtype=torch.float64), layout)
    out.backward(grad)
    grads = [signature(t.grad) for t in (base, layer.weight, layer.bias)]
    return signature(out), saved, grads


def layer_cases():
    for activation, param in ACTIVATIONS + [("relu", None)]:
        for scale_mode in ("abs", "bn"):
            yield ABN, dict(activation=activation, activation_param=param,
                            scale_mode=scale_mode)
    for activation, param in ACTIVATIONS:
        for variant in ("I", "II"):
            for scale_mode in ("abs", "bn"):
                yield InPlaceABN, dict(activation=activation, activation_param=param,
                                       variant=variant, scale_mode=scale_mode)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cls,kwargs", list(layer_cases()),
                         ids=lambda v: v.__name__ if isinstance(v, type) else "-".join(
                             str(x) for x in v.values()))
def test_fake_mode_matches_eager_shapes_and_saved_tensors(cls, kwargs, layout):
    eager = layer_step(cls, kwargs, layout, training=True)
    with FakeTensorMode():
        fake = layer_step(cls, kwargs, layout, training=True)
    assert fake == eager


@pytest.mark.parametrize("cls", [ABN, InPlaceABN])
def test_fake_mode_in_eval(cls):
    eager = layer_step(cls, {}, "contiguous", training=False)
    with FakeTensorMode():
        assert layer_step(cls, {}, "contiguous", training=False) == eager


def test_fake_mode_keeps_real_running_statistics_untouched():
    """A fake step updates the module's (fake) running statistics, never real tensors."""
    with FakeTensorMode():
        layer = InPlaceABN(3)
        out = layer(torch.randn(SHAPE) * 1.0)
        assert type(layer.running_mean).__name__ == "FakeTensor"
        assert type(out).__name__ == "FakeTensor"


@pytest.mark.parametrize("impl, norm", [(impl, norm) for impl in densenet.IMPLS
                                         for norm in ("bn", "iabn")
                                         if not (impl in densenet.INPLACE_IMPLS and norm == "bn")])
def test_densenet_runs_on_meta_and_fake_tensors(impl, norm):
    for device in ("meta", "fake"):
        model = densenet.densenet_bc(16, 4, impl=impl, norm=norm)
        x = torch.randn(2, 3, 16, 16)
        if device == "meta":
            model, x = model.to("meta"), x.to("meta")
            out = model(x)
            out.sum().backward()
        else:
            with FakeTensorMode(allow_non_fake_inputs=True):
                out = model(x)
                out.sum().backward()
        assert tuple(out.shape) == (2, 10)
        assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())


# --------------------------------------------------------------------------- opcheck
def op_samples():
    """``(operator, args)`` covering both canonical views, both float dtypes and each mode.
    ``args`` is a tuple, or a function that returns it at test time (:func:`step_samples`)."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, dtype=torch.float64):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    for view_shape, dtype in (((2, 3, 5), torch.float64), ((10, 3), torch.float32)):
        c = 3
        x = rand(*view_shape, dtype=dtype)
        gamma, beta = rand(c).abs() + 0.5, rand(c)
        a, b = rand(c, dtype=dtype).abs() + 0.5, rand(c, dtype=dtype)
        act, slope = common.ACT_LEAKY_RELU, 0.1
        yield ops.moments, (x,)
        yield ops.moments_normalize_act_, (x.clone(), gamma, beta, 1e-5, act, slope)
        yield ops.moments_normalize_act_out, (x, torch.empty_like(x), gamma, beta, 1e-5, act,
                                              slope)
        yield ops.scale_shift_act_, (x.clone(), a, b, common.ACT_ELU, 1.0)
        yield ops.scale_shift_act_out, (x, torch.empty_like(x), a, b, act, slope)
        z, dz = torch.nn.functional.leaky_relu(x, slope), rand(*view_shape, dtype=dtype)
        p, q = rand(c, dtype=dtype).abs() + 0.5, rand(c, dtype=dtype)
        coef = rand(3, c, dtype=dtype)
        for mode, source in ((common.MODE_Y, None), (common.MODE_XHAT_FROM_Y, None),
                             (common.MODE_XHAT_FROM_X, x)):
            yield ops.backward_reduce, (z, dz, source, p, q, act, slope, mode)
            yield ops.backward_input, (z, dz, source, p, q, coef, act, slope, mode)
            yield ops.backward_input_, (z, dz.clone(), source, p, q, coef, act, slope, mode)
        yield from step_samples(x, rand, act, slope)


def step_samples(x, rand, act, slope):
    """``(operator, args)`` of the whole-step operators on the canonical view ``x``: training
    and eval, with and without affine parameters and running statistics. The backward ones
    take the state of a forward step, which runs when their test does (``args`` a function),
    not when the tests are collected: each pytest-xdist worker collects them all."""
    c = x.shape[1]
    weight, bias = rand(c, dtype=torch.float32).abs() + 0.5, rand(c, dtype=torch.float32)
    running = (rand(c, dtype=torch.float32), rand(c, dtype=torch.float32).abs() + 0.5)
    for training, vectors in ((True, (weight, bias) + running), (True, (None,) * 4),
                              (False, (None, None) + running)):
        step = (training, 0.1, 1e-5, act, slope, True)
        yield ops.forward_step_, (x.clone(), *(clone(v) for v in vectors), *step)
        yield ops.forward_step_out, (x, torch.empty_like(x), *(clone(v) for v in vectors),
                                     *step)
        dz = rand(*x.shape, dtype=x.dtype)
        has = (vectors[0] is not None, vectors[1] is not None)
        for mode in (common.MODE_Y, common.MODE_XHAT_FROM_Y):
            backward = (act, slope, mode, training, torch.float32, *has)
            for op, grad in ((ops.backward_step_, (dz.clone(),)),
                             (ops.backward_step_out, (dz, torch.empty_like(dz))),
                             (ops.parameter_gradients_step, (dz,))):
                yield op, functools.partial(after_forward_step, x, vectors, step, grad, backward)


def after_forward_step(x, vectors, step, grads, backward):
    """The arguments of a backward step operator: ``z`` and the state of a forward step of
    ``x`` (``x`` untouched), the incoming gradient (and the output: ``grads``) and the rest
    (``backward``)."""
    z = x.clone()
    state = ops.forward_step_(z, *(clone(v) for v in vectors), *step)
    return (z, *grads, None, state, *backward)


def clone(t):
    return None if t is None else t.clone()


@pytest.mark.parametrize("op,args", list(op_samples()),
                         ids=lambda v: getattr(v, "__name__", None) or "")
def test_opcheck(op, args):
    torch.library.opcheck(op.operator, args() if callable(args) else args)


def test_every_operator_is_checked():
    assert {op for op, _ in op_samples()} == set(ops.OPERATORS + ops.STEP_OPERATORS)


# --------------------------------------------------------------------------- torch.compile
def training_step(model, x):
    """Output, parameter gradients and buffers (running statistics) of one step."""
    out = model(x)
    (out * out).sum().backward()
    module = getattr(model, "_orig_mod", model)
    grads = {name: p.grad for name, p in module.named_parameters()}
    buffers = {name: b.clone() for name, b in module.named_buffers()}
    return out.detach(), grads, buffers


def assert_compiled_matches_eager(model, x):
    torch._dynamo.reset()
    eager = training_step(copy.deepcopy(model), x.clone())
    compiled = training_step(torch.compile(copy.deepcopy(model), fullgraph=True), x.clone())
    torch.testing.assert_close(compiled[0], eager[0])
    for expected, actual in zip(eager[1:], compiled[1:]):
        assert expected.keys() == actual.keys()
        for name in expected:
            torch.testing.assert_close(actual[name], expected[name], msg=name)


def test_compiled_shared_storage_densenet_with_inplace_abn_matches_eager():
    """The shared-storage function (concatenation, ABN and convolution, recomputed in
    backward) and the transition layers' InPlace-ABN, in one graph."""
    torch.manual_seed(0)
    model = densenet.densenet_bc(10, 4, impl="shared", norm="iabn").double()
    assert_compiled_matches_eager(model, torch.randn(2, 3, 8, 8, dtype=torch.float64))


def test_compiled_resnext_block_with_inplace_abn_matches_eager():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1),
                          PreActBlock(8, (8, 8, 16), groups=4, norm_act=NormAct("iabn")),
                          PreActBlock(16, (8, 8, 16), groups=4, norm_act=NormAct("iabn")))
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    assert_compiled_matches_eager(block.double(), x)


# --------------------------------------------------------------------------- eager calls
class _PassThrough(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode that changes nothing: under it the operators run through the
    dispatcher, as under fake tensors, ``meta`` and ``torch.compile``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_eager_call_bumps_the_version_of_what_it_mutates_as_the_operator_does():
    """A direct eager call mutates and versions its tensors as the registered operator does."""
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    a, b = torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    direct, dispatched = x.clone(), x.clone()
    ops.scale_shift_act_(direct, a, b, common.ACT_LEAKY_RELU, 0.1)
    ops.scale_shift_act_.operator(dispatched, a, b, common.ACT_LEAKY_RELU, 0.1)
    assert direct._version == dispatched._version > 0
    torch.testing.assert_close(direct, torch.nn.functional.leaky_relu(x, 0.1), rtol=0, atol=0)
    before = x._version
    ops.moments(x)  # mutates nothing
    assert x._version == before


def test_element_wise_operators_on_strided_bfloat16_views_compute_every_element():
    """The element-wise operators on a bfloat16 ``(N, C, S)`` view whose rows skip every other
    element: each element of the view equals torch's float32 ``act(x * a + b)`` rounded to
    bfloat16, and the skipped elements are left as they were (the CPU kernels' vectorised
    loops read consecutive elements, so such rows must take the element-by-element loops)."""
    generator = torch.Generator().manual_seed(4)
    base = torch.randn(3, 4, 2 * 100, generator=generator).to(torch.bfloat16)
    a, b = torch.rand(4, generator=generator) + 0.5, torch.randn(4, generator=generator)
    x = base.clone()
    view = x[:, :, ::2]
    ops.scale_shift_act_(view, a, b, common.ACT_LEAKY_RELU, 0.1)
    y = base[:, :, ::2].float() * a[:, None] + b[:, None]
    expected = torch.where(y >= 0, y, y * torch.tensor(0.1)).to(torch.bfloat16)
    assert torch.equal(view.view(torch.int16), expected.view(torch.int16))
    assert torch.equal(x[:, :, 1::2].view(torch.int16), base[:, :, 1::2].view(torch.int16))


def test_overwriting_a_tensor_saved_by_another_operation_is_caught_by_autograd():
    """The version bump of the eager call is what lets autograd refuse a backward through an
    operation whose saved output an in-place layer overwrote."""
    base = torch.randn(2, 3, 4, 4, requires_grad=True)
    saved = torch.sigmoid(base)  # saves its output for backward
    out = InPlaceABN(3)(saved)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def _run_step(layer, x, grad, path, monkeypatch):
    """Output, gradients and running statistics of one step of a copy of ``layer`` taken by
    ``path``: ``"direct"`` (the whole-step operators called without the dispatcher),
    ``"dispatched"`` (the same operators through the dispatcher, under a pass-through
    dispatch mode) or ``"per-kernel"`` (the per-kernel operators with the per-channel steps as
    torch operators, the path of synchronised layers)."""
    layer = copy.deepcopy(layer)
    base = x.clone().requires_grad_(True)
    with monkeypatch.context() as patch:
        if path == "per-kernel":
            patch.setattr(functional, "whole_steps", lambda group=None, vectors=(): False)
        with _PassThrough() if path == "dispatched" else contextlib.nullcontext():
            out = layer(base.clone())
            out.backward(grad)
    return [out.detach(), base.grad, layer.weight.grad, layer.bias.grad, layer.running_mean,
            layer.running_var]


@pytest.mark.parametrize("cls,variant", [(InPlaceABN, "I"), (InPlaceABN, "II"), (ABN, None)])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("channels, small", [(SHAPE[1], True), (SHAPE[1], False), (40, True)],
                         ids=["few-channels", "few-channels-large", "many-channels"])
def test_whole_steps_equal_the_per_kernel_operators_and_torch_per_channel_steps(
        cls, variant, training, layout, channels, small, monkeypatch):
    """The whole steps (``cpu.forward_step`` and ``backward_step``: the kernels and the
    per-channel arithmetic as compiled loops, in one call each where the view allows), called
    directly and through the dispatcher, against the per-kernel operators with the same
    formulas as torch operators: output, gradients and running statistics, in float64 and
    float32 (a float32 layer's parameters, statistics and gradients), scale modes ``abs`` and
    ``bn``. The in-place training forward fuses statistics and output per channel from 32
    channels on and on small tensors; with few channels on a large tensor (``small`` false:
    the size limit set to 0 here) it makes two passes."""
    if not small:
        from layers.kernels import cpu

        monkeypatch.setattr(cpu, "_FUSED_MAX_ANY_CHANNELS", 0)
    shape = (SHAPE[0], channels) + SHAPE[2:]
    for dtype, scale_mode in ((torch.float64, "abs"), (torch.float32, "bn")):
        generator = torch.Generator().manual_seed(5)
        x = laid_out(torch.randn(shape, generator=generator, dtype=dtype) * 2 + 1, layout)
        grad = torch.randn(shape, generator=generator, dtype=dtype)
        kwargs = dict(activation="leaky_relu", activation_param=0.1, scale_mode=scale_mode,
                      dtype=dtype)
        if variant is not None:
            kwargs["variant"] = variant
        layer = cls(channels, **kwargs).train(training)
        with torch.no_grad():
            layer.weight.uniform_(0.5, 1.5, generator=generator)
            layer.bias.uniform_(-1, 1, generator=generator)
            layer.running_var.uniform_(0.5, 2, generator=generator)
        reference = _run_step(layer, x, grad, "per-kernel", monkeypatch)
        for path in ("direct", "dispatched"):
            for got, expected in zip(_run_step(layer, x, grad, path, monkeypatch), reference):
                torch.testing.assert_close(got, expected)


def test_whole_steps_take_per_channel_tensors_of_one_float32_or_float64_dtype():
    """The backends' whole steps read the weight, bias and running statistics as one dtype
    (the CUDA kernels are compiled per parameter dtype); anything else runs through the
    per-kernel operators."""
    f32, f64 = torch.zeros(3), torch.zeros(3, dtype=torch.float64)
    assert functional.whole_steps(None, (f32, f32, None, None))
    assert functional.whole_steps(None, (None, None, f64, f64))
    assert not functional.whole_steps(None, (f64, f64, f32, f32))
    assert not functional.whole_steps(None, (f32.half(), None, None, None))


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-affine"])
def test_a_step_on_meta_or_under_a_dispatch_mode_is_one_operator_each_way(affine):
    """A training step of an in-place layer seen by the dispatcher (fake tensors, ``meta``,
    the memory tracker, ``torch.compile``): the layer's forward and backward are one whole-step
    operator each, and no per-channel torch operator runs around them."""
    seen = []

    class Recorder(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    layer = InPlaceABN(3, affine=affine).to("meta")
    x = torch.empty(2, 3, 4, 4, device="meta", requires_grad=True)
    with Recorder():
        out = layer(x * 1.0)
        out.backward(torch.empty_like(out))
    layer_ops = [name for name in seen if name.startswith("layers.")]
    assert layer_ops == ["layers.forward_step_", "layers.backward_step_out"]
    assert not {"aten.stack", "aten.abs", "aten.rsqrt", "aten.where"} & set(seen)
    if affine:
        assert layer.weight.grad.shape == layer.bias.grad.shape == (3,)


def test_mixed_parameter_dtypes_give_the_same_step_as_one_dtype():
    """A layer whose running statistics are float32 and weight float64 (operators path) gives
    what the same layer in float64 throughout gives (whole-step path)."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, 5, 5, generator=generator, dtype=torch.float64)
    grad = torch.randn(4, 3, 5, 5, generator=generator, dtype=torch.float64)
    results = []
    for running_dtype in (torch.float64, torch.float32):
        layer = InPlaceABN(3, dtype=torch.float64)
        layer.running_mean = layer.running_mean.to(running_dtype)
        layer.running_var = layer.running_var.to(running_dtype)
        base = x.clone().requires_grad_(True)
        layer(base * 1.0).backward(grad)
        results.append([base.grad, layer.weight.grad, layer.bias.grad,
                        layer.running_mean.double(), layer.running_var.double()])
    for mixed, uniform in zip(results[1], results[0]):
        torch.testing.assert_close(mixed, uniform, rtol=1e-6, atol=1e-7)
