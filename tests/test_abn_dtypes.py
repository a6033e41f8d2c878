"""float16 and bfloat16: the in-register conversions, the layers, and training under autocast.

The conversions (:mod:`layers.kernels.codecs`) are checked bit for bit against torch's own
``.to(dtype)``, compiled and as the Python reference the CUDA simulator runs. The layers are
checked against autograd of the composite PyTorch ops in float64 on the same 16-bit input and
incoming gradient, with tolerances per dtype: the output and the input gradient are rounded to
16 bits, so they are compared relative to their largest value. Tests marked ``kernels`` are
re-run on the CUDA kernels under numba's simulator (``test_cudasim_layers.py``).
"""
import copy
import functools
import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn

import layers  # before numba: under LAYERS_KERNELS=cudasim it selects numba's simulator
import numba
from numba.extending import intrinsic
from abn_reference import reference_step
from layers.densenet import densenet_bc
from layers.kernels import codecs, cpu, pairs
from layers.residual import Bottleneck, NormAct

kernels = pytest.mark.kernels

HALF = [torch.float16, torch.bfloat16]
#: Tolerance relative to the largest value, per dtype: about 4 units in the last place of the
#: output (8 bits of mantissa in bfloat16, 11 in float16) for the values, more for the
#: gradients, which go through the 16-bit output and incoming gradient.
VALUE_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}
GRAD_TOL = {torch.float16: 8e-3, torch.bfloat16: 6e-2}


# --------------------------------------------------------------------------- conversions
@numba.njit
def _load_all(bits, out):
    for i in range(bits.size):
        out[i] = cpu.load(bits[i])


@numba.njit
def _store_all(values, out):
    for i in range(values.size):
        out[i] = cpu.store(values[i], out)


def _every_pattern(dtype):
    """All 65536 values of a 16-bit dtype."""
    return torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)


def _float32_samples(dtype):
    """float32 values that exercise rounding to ``dtype``: every representable value, the
    midpoints between neighbours (ties), values just around them, random values over the
    whole exponent range, and the special values."""
    finite = _every_pattern(dtype).float()
    finite = finite[finite.isfinite()].unique()
    mid = (finite[1:].double() + finite[:-1].double()) / 2
    around = torch.cat([mid, torch.nextafter(mid.float(), torch.tensor(np.inf)).double(),
                        torch.nextafter(mid.float(), torch.tensor(-np.inf)).double()])
    generator = torch.Generator().manual_seed(0)
    random = torch.randint(-2 ** 31, 2 ** 31 - 1, (100_000,), generator=generator,
                           dtype=torch.int64).to(torch.int32).view(torch.float32)
    special = torch.tensor([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-45,
                            65504.0, 65520.0, 70000.0, 1e-8])
    return torch.cat([finite, around.float(), random, special])


def _bits(tensor):
    return tensor.view(torch.int16 if tensor.element_size() == 2 else torch.int32)


def _assert_same_values(actual, expected):
    """Bit for bit, except that any NaN matches any NaN (payloads are not specified)."""
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    assert torch.equal(_bits(actual)[~nan], _bits(expected)[~nan])


@pytest.mark.parametrize("dtype", HALF)
def test_compiled_load_equals_torch_for_every_pattern(dtype):
    patterns = _every_pattern(dtype)
    out = torch.empty(patterns.shape, dtype=torch.float32)
    _load_all(codecs.cpu_array(patterns), out.numpy())
    _assert_same_values(out, patterns.float())


@pytest.mark.parametrize("dtype", HALF)
def test_compiled_store_rounds_as_torch(dtype):
    values = _float32_samples(dtype)
    out = torch.empty(values.shape, dtype=dtype)
    _store_all(values.numpy(), codecs.cpu_array(out))
    _assert_same_values(out, values.to(dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_python_reference_conversions_equal_torch(dtype):
    """The functions the CUDA simulator runs, on each target's array type."""
    generator = torch.Generator().manual_seed(1)
    patterns = _every_pattern(dtype)[torch.randperm(2 ** 16, generator=generator)[:3000]]
    for array in (codecs.cpu_array(patterns), codecs.simulator_array(patterns)):
        loaded = torch.tensor([float(codecs.load(v)) for v in array], dtype=torch.float32)
        _assert_same_values(loaded, patterns.float())
    values = _float32_samples(dtype)[torch.randperm(2 ** 16, generator=generator)[:3000]]
    for out in (codecs.cpu_array(torch.empty(1, dtype=dtype)),
                codecs.simulator_array(torch.empty(1, dtype=dtype))):
        stored = np.array([codecs.store(np.float32(v), out) for v in values.numpy()], out.dtype)
        _assert_same_values(torch.from_numpy(stored).view(dtype), values.to(dtype))


# --------------------------------------------------------------------------- layers
LAYERS = {
    "abn": (layers.ABN, {}),
    "inplace_abn_I": (layers.InPlaceABN, {"variant": "I"}),
    "inplace_abn_II": (layers.InPlaceABN, {"variant": "II"}),
}
ACTIVATIONS = [("leaky_relu", 0.01), ("elu", 1.0), ("identity", None)]
CASES = list(itertools.product(HALF, LAYERS, ACTIVATIONS, (False, True), ("abs", "bn"),
                               (True, False)))


def _on_kernels(case):
    """The cases re-run under the CUDA simulator (slow): per dtype, ABN (the backward from the
    stored input) channels-last and InPlace-ABN II (from the output) contiguous, in training
    with leaky ReLU and the default scale. The rest of the CUDA code is the same as for
    float32 and float64 (the activations in ``common.py``), which ``test_abn.py`` checks."""
    _, name, (activation, _), channels_last, scale_mode, training = case
    chosen = (name, channels_last) in (("abn", True), ("inplace_abn_II", False))
    return chosen and activation == "leaky_relu" and scale_mode == "abs" and training


def _case_id(case):
    dtype, name, (activation, _), channels_last, scale_mode, training = case
    layout = "channels_last" if channels_last else "contiguous"
    return "-".join([str(dtype).replace("torch.", ""), name, activation, layout, scale_mode,
                     "train" if training else "eval"])


def _make_layer(name, channels, activation, param, scale_mode, seed=0):
    """A float32 layer with weights of mixed sign, random biases and running statistics."""
    cls, kwargs = LAYERS[name]
    layer = cls(channels, activation=activation, activation_param=param,
                scale_mode=scale_mode, **kwargs)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        signs = torch.where(torch.arange(channels) % 2 == 0, 1.0, -1.0)
        layer.weight.copy_(torch.empty(channels).uniform_(0.5, 1.5, generator=generator) * signs)
        layer.bias.copy_(torch.randn(channels, generator=generator) * 0.5)
        layer.running_mean.copy_(torch.randn(channels, generator=generator))
        layer.running_var.copy_(torch.rand(channels, generator=generator) + 0.5)
    return layer


def _assert_close_relative(actual, expected, tol, name):
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol * scale,
                               msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("case", [pytest.param(c, marks=kernels) if _on_kernels(c) else c
                                  for c in CASES], ids=_case_id)
def test_16_bit_layer_against_float64_composite(case):
    dtype, name, (activation, param), channels_last, scale_mode, training = case
    shape, channels = (3, 5, 4, 3), 5
    generator = torch.Generator().manual_seed(2)
    x = (torch.randn(shape, generator=generator) * 2 + 0.5).to(dtype)
    grad = torch.randn(shape, generator=generator).to(dtype)
    if channels_last:
        x, grad = (t.contiguous(memory_format=torch.channels_last) for t in (x, grad))
    layer = _make_layer(name, channels, activation, param, scale_mode).train(training)
    running = [layer.running_mean.double(), layer.running_var.double()]
    expected = reference_step(x.double(), layer.weight.double(), layer.bias.double(), *running,
                              grad.double(), training=training, eps=layer.eps,
                              activation=activation, param=param, scale_mode=scale_mode)

    leaf = x.detach().clone().requires_grad_()
    out = layer(leaf * 1)
    dx, dweight, dbias = torch.autograd.grad(out, [leaf, layer.weight, layer.bias], grad)

    assert (out.dtype, dx.dtype) == (dtype, dtype)
    assert (dweight.dtype, dbias.dtype, layer.running_mean.dtype) == (torch.float32,) * 3
    assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
    _assert_close_relative(out, expected[0], VALUE_TOL[dtype], "output")
    for got, want, label in zip((dx, dweight, dbias), expected[1:],
                                ("input grad", "weight grad", "bias grad")):
        _assert_close_relative(got, want, GRAD_TOL[dtype], label)
    # Statistics accumulate in float32 blocks and float64 totals: as exact as float32 holds.
    torch.testing.assert_close(layer.running_mean.double(), running[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(layer.running_var.double(), running[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", HALF)
def test_16_bit_element_wise_kernels_round_every_element_as_torch_for_every_row_length(dtype):
    """The ``(N, C, S)`` element-wise CPU kernels on 16-bit rows run some row lengths as two
    loops on AVX-512 hosts (``cpu._split_at_lanes``; one loop elsewhere). For every row length
    from 1 to 70 (every remainder modulo 32, split or not, twice), each element equals torch's
    float32 operators in the same order, rounded to ``dtype`` by torch: bit for bit, in place
    and out of place."""
    from layers.kernels import common

    act, mode, chunks = common.ACT_LEAKY_RELU, common.MODE_XHAT_FROM_Y, 3
    slope = np.float32(0.01)  # a scalar of the compute dtype, as the layers pass it
    generator = torch.Generator().manual_seed(12)
    n, c = 2, 3
    a, b = torch.rand(c, generator=generator) + 0.5, torch.randn(c, generator=generator)
    coef = torch.randn(3, c, generator=generator)
    a_, b_ = a[:, None], b[:, None]
    for s in range(1, 71):
        x, dz = (torch.randn(n, c, s, generator=generator).to(dtype) for _ in range(2))
        y = x.float() * a_ + b_
        expected = torch.where(y >= 0, y, y * slope).to(dtype)
        out = torch.empty_like(x)
        cpu._forward_ncs[act](codecs.cpu_array(x), codecs.cpu_array(out), a.numpy(), b.numpy(),
                              slope, chunks)
        in_place = x.clone()
        cpu._forward_ncs[act](codecs.cpu_array(in_place), None, a.numpy(), b.numpy(), slope,
                              chunks)
        for got in (out, in_place):
            _assert_same_values(got, expected)

        z = expected.float()
        dy = torch.where(z > 0, dz.float(), dz.float() * slope)
        v = torch.where(z > 0, z, z / slope) * a_ + b_  # the recovered BN output, p = a, q = b
        k0, k1, k2 = (k[:, None] for k in coef)
        grad = dz.clone()
        cpu._backward_input_ncs[act, mode](
            codecs.cpu_array(expected), codecs.cpu_array(grad), codecs.cpu_array(expected),
            a.numpy(), b.numpy(), coef.numpy(), slope, cpu._elu_floor(expected), chunks)
        _assert_same_values(grad, (dy * k0 + v * k1 + k2).to(dtype))


@numba.njit
def _elements_ahead(rows, prefetch):
    """The ``ahead`` of the pairs loops over the rows of the 2-D ``rows``: the distance to the
    next row, as the kernels prefetch the next block's rows (past the last row, where a
    prefetch finds no data and must not fault), or 0 (``prefetch`` False: none)."""
    return rows.shape[1] if prefetch else 0


def _run_pairs_rows(src, dst, a, b, act, slope, prefetch=False):
    """:func:`layers.kernels.pairs.scale_shift_act_row` over the rows of 2-D arrays
    (prefetching the next as it goes, or not: :func:`_elements_ahead`); returns on how many it
    ran."""
    ran = 0
    for j in range(src.shape[0]):
        ran += pairs.scale_shift_act_row(src[j], dst[j], a, b, act, slope,
                                         _elements_ahead(src, prefetch))
    return ran


_pairs_rows = numba.njit(_run_pairs_rows)
#: The same under the CPU kernels' own fast-math flags (reassociation; ``cpu._parallel_reduction``),
#: where LLVM may rewrite what it may not in the plain compile.
_pairs_rows_reassociated = numba.njit(fastmath={"reassoc"})(_run_pairs_rows)


@numba.njit(fastmath={"reassoc"})
def _scalar_rows_reassociated(src, dst, a, b, act, slope):
    """The scalar loop of the CPU kernels (``cpu._forward_span``) over the rows, compiled as
    :func:`_pairs_rows_reassociated`."""
    for j in range(src.shape[0]):
        cpu._forward_span(src[j], dst[j], 0, src.shape[1], a, b, act, slope)


#: ``(a, b)`` of the pairs tests: plain values, outputs below bfloat16's smallest normal
#: (subnormal results), outputs that overflow to infinity, and a negative scale.
_PAIRS_COEFFICIENTS = [(1.0, 0.0), (1.5, 0.25), (1e-30, 0.0), (3e38, -1.0), (-0.75, 1e-3)]


@pytest.mark.parametrize("length", [32, 33, 47, 63, 64, 100, 1000])
@pytest.mark.parametrize("act, slope", [("identity", 0.0), ("leaky_relu", 0.01),
                                        ("leaky_relu", -0.5), ("leaky_relu", 1.5)])
def test_bfloat16_pairs_rows_round_every_pattern_as_torch(length, act, slope):
    """The forward's bfloat16 rows as pairs of elements per word (``layers.kernels.pairs``), on
    all 65536 bit patterns (NaN payloads, subnormals, infinities, both zeros) in rows of
    ``length`` elements: each element equals torch's float32 ``x * a + b`` and activation,
    rounded by torch, bit for bit (NaN as ``0x7FC0``, the conversions' NaN), in place and out of
    place. A row whose length is not a multiple of the 32-element step ends in a step that
    overlaps the one before it: in place, a wrong order would transform its elements twice."""
    from layers.kernels import common

    code = {"identity": common.ACT_IDENTITY, "leaky_relu": common.ACT_LEAKY_RELU}[act]
    patterns = _every_pattern(torch.bfloat16)
    rows = patterns[:patterns.numel() // length * length].view(-1, length)
    slope = np.float32(slope)
    for a, b in _PAIRS_COEFFICIENTS:
        a, b = np.float32(a), np.float32(b)
        y = rows.float() * torch.tensor(a) + torch.tensor(b)
        expected = (torch.where(y >= 0, y, y * torch.tensor(slope)) if act == "leaky_relu"
                    else y).to(torch.bfloat16)
        for prefetch in (False, True):
            out, in_place = torch.empty_like(rows), rows.clone()
            assert _pairs_rows(codecs.cpu_array(rows), codecs.cpu_array(out), a, b, code, slope,
                               prefetch) == rows.shape[0]
            _pairs_rows(codecs.cpu_array(in_place), codecs.cpu_array(in_place), a, b, code,
                        slope, prefetch)
            for got in (out, in_place):
                _assert_same_values(got, expected)
                assert (_bits(got)[got.isnan()] == 0x7FC0).all()


@pytest.mark.parametrize("length", [32, 45, 1000])
def test_bfloat16_pairs_rows_round_as_the_scalar_loop_under_the_kernels_flags(length):
    """Compiled with the kernels' fast-math flags (as the fused training forward is), the pairs
    rows round ``x * a + b`` as the kernels' scalar loop does: the same bits."""
    from layers.kernels import common

    rows = torch.randn(64, length, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    a, b, slope = np.float32(1.0 / 3.0), np.float32(0.1), np.float32(0.01)
    got, expected = torch.empty_like(rows), torch.empty_like(rows)
    _pairs_rows_reassociated(codecs.cpu_array(rows), codecs.cpu_array(got), a, b,
                           common.ACT_LEAKY_RELU, slope)
    _scalar_rows_reassociated(codecs.cpu_array(rows), codecs.cpu_array(expected), a, b,
                            common.ACT_LEAKY_RELU, slope)
    assert torch.equal(_bits(got), _bits(expected))


def _run_pairs_input_rows(z, dz, x, coef, act, slope, mode, out, prefetch=False):
    """:func:`layers.kernels.pairs.input_gradient_row` over the rows of 2-D arrays, with
    ``coef`` the five scalars ``p, q, k0, k1, k2`` (prefetching the next rows as it goes, or
    not: :func:`_elements_ahead`); returns on how many rows it ran."""
    p, q, k0, k1, k2 = coef
    ran = 0
    for j in range(z.shape[0]):
        ran += pairs.input_gradient_row(z[j], dz[j], x[j], p, q, k0, k1, k2, act, slope, mode,
                                        out[j], _elements_ahead(z, prefetch))
    return ran


_pairs_input_rows = numba.njit(_run_pairs_input_rows)
_pairs_input_rows_reassociated = numba.njit(fastmath={"reassoc"})(_run_pairs_input_rows)


@numba.njit(fastmath={"reassoc"})
def _scalar_input_rows_reassociated(z, dz, x, coef, act, slope, mode, out):
    """The kernels' scalar input-gradient loop (``cpu._input_span``) over the rows, compiled as
    :func:`_pairs_input_rows_reassociated`."""
    p, q, k0, k1, k2 = coef
    for j in range(z.shape[0]):
        cpu._input_span(z[j], dz[j], x[j], 0, z.shape[1], p, q, k0, k1, k2, act, slope,
                        np.float32(0), mode, out[j])


#: ``(p, q, k0, k1, k2)`` of the input-gradient pairs tests: plain values, and values whose
#: results are subnormal or overflow.
_PAIRS_INPUT_COEFFICIENTS = [(1.5, -0.25, 0.75, -0.5, 0.125), (1e-20, 0.0, 1e-20, 1e-18, 0.0),
                             (3e20, 1.0, 2e18, 3e18, -1.0)]


@pytest.mark.parametrize("length", [32, 45, 64, 1000])
@pytest.mark.parametrize("act, slope", [("identity", 0.0), ("leaky_relu", 0.01),
                                        ("leaky_relu", -0.5)])
@pytest.mark.parametrize("from_x", [False, True], ids=["from_y", "from_x"])
def test_bfloat16_pairs_input_gradient_rows_round_every_pattern_as_torch(length, act, slope,
                                                                         from_x):
    """The backward's input gradient over bfloat16 rows as pairs per word, on all 65536 bit
    patterns as ``z`` (and, shuffled, as the incoming gradient and the stored input): each
    element equals torch's float32 ``dy * k0 + v * k1 + k2`` in the kernels' order
    (``dy = act_grad(z, dz)``, ``v = u * p + q`` with ``u`` the stored input or
    ``act^-1(z)``), rounded by torch, bit for bit, NaN as ``0x7FC0``; in place over the
    incoming gradient and out of place."""
    from layers.kernels import common

    code = {"identity": common.ACT_IDENTITY, "leaky_relu": common.ACT_LEAKY_RELU}[act]
    mode = common.MODE_XHAT_FROM_X if from_x else common.MODE_XHAT_FROM_Y
    generator = torch.Generator().manual_seed(6)
    patterns = _every_pattern(torch.bfloat16)
    count = patterns.numel() // length * length
    z, dz, x = (patterns[torch.randperm(patterns.numel(), generator=generator)[:count]]
                .view(-1, length) for _ in range(3))
    slope = np.float32(slope)
    for coef in _PAIRS_INPUT_COEFFICIENTS:
        coef = tuple(np.float32(k) for k in coef)
        p, q, k0, k1, k2 = (torch.tensor(k) for k in coef)
        zf, dzf = z.float(), dz.float()
        leaky = act == "leaky_relu"
        dy = torch.where(zf > 0, dzf, dzf * torch.tensor(slope)) if leaky else dzf
        u = x.float() if from_x else (torch.where(zf > 0, zf, zf / torch.tensor(slope))
                                      if leaky else zf)
        expected = (dy * k0 + (u * p + q) * k1 + k2).to(torch.bfloat16)
        arrays = [codecs.cpu_array(t) for t in (z, dz, x)]
        for prefetch in (False, True):
            out, in_place = torch.empty_like(z), dz.clone()
            assert _pairs_input_rows(*arrays, coef, code, slope, mode, codecs.cpu_array(out),
                                     prefetch) == z.shape[0]
            _pairs_input_rows(arrays[0], codecs.cpu_array(in_place), arrays[2], coef, code,
                              slope, mode, codecs.cpu_array(in_place), prefetch)
            for got in (out, in_place):
                _assert_same_values(got, expected)
                assert (_bits(got)[got.isnan()] == 0x7FC0).all()


@pytest.mark.parametrize("from_x", [False, True], ids=["from_y", "from_x"])
def test_bfloat16_pairs_input_gradient_rows_round_as_the_scalar_loop_under_the_kernels_flags(
        from_x):
    """Compiled with the kernels' fast-math flags, the input-gradient pairs rows round their
    multiply-adds as the kernels' scalar loop does: the same bits."""
    from layers.kernels import common

    mode = common.MODE_XHAT_FROM_X if from_x else common.MODE_XHAT_FROM_Y
    generator = torch.Generator().manual_seed(7)
    z, dz, x = (torch.randn(64, 77, generator=generator).to(torch.bfloat16) for _ in range(3))
    coef = tuple(np.float32(k) for k in (1.0 / 3.0, 0.1, 0.7, -1.0 / 7.0, 0.01))
    slope = np.float32(0.01)
    arrays = [codecs.cpu_array(t) for t in (z, dz, x)]
    got, expected = torch.empty_like(z), torch.empty_like(z)
    _pairs_input_rows_reassociated(*arrays, coef, common.ACT_LEAKY_RELU, slope, mode,
                                 codecs.cpu_array(got))
    _scalar_input_rows_reassociated(*arrays, coef, common.ACT_LEAKY_RELU, slope, mode,
                                  codecs.cpu_array(expected))
    assert torch.equal(_bits(got), _bits(expected))


def test_bfloat16_pairs_rows_leave_what_they_have_no_vector_body_for():
    """Rows shorter than one step, ELU, other dtypes, strided rows, and scalars other than
    float32: neither the forward's nor the input gradient's rows run, and nothing is
    written."""
    from layers.kernels import common

    a, b, slope = np.float32(2.0), np.float32(1.0), np.float32(0.01)
    cases = [(torch.bfloat16, 31, common.ACT_LEAKY_RELU), (torch.bfloat16, 64, common.ACT_ELU),
             (torch.float16, 64, common.ACT_LEAKY_RELU), (torch.float32, 64,
                                                          common.ACT_IDENTITY)]
    coef = (a, b, a, b, a)
    for dtype, length, act in cases:
        rows = torch.randn(3, length).to(dtype)
        out = torch.zeros_like(rows)
        assert _pairs_rows(codecs.cpu_array(rows), codecs.cpu_array(out), a, b, act, slope) == 0
        arrays = [codecs.cpu_array(rows)] * 3
        for mode in (common.MODE_XHAT_FROM_Y, common.MODE_XHAT_FROM_X):
            assert _pairs_input_rows(*arrays, coef, act, slope, mode,
                                     codecs.cpu_array(out)) == 0
        assert not out.any()
    # strided rows (every other element): the steps read consecutive elements
    strided = codecs.cpu_array(torch.randn(3, 128).to(torch.bfloat16))[:, ::2]
    out = torch.zeros(3, 128, dtype=torch.bfloat16)
    assert _pairs_rows(strided, codecs.cpu_array(out)[:, ::2], a, b, common.ACT_IDENTITY,
                       slope) == 0
    assert _pairs_input_rows(strided, strided, strided, coef, common.ACT_IDENTITY, slope,
                             common.MODE_XHAT_FROM_Y, codecs.cpu_array(out)[:, ::2]) == 0
    assert not out.any()
    # float64 scalars, with which the scalar loops compute in float64
    rows = torch.randn(3, 64).to(torch.bfloat16)
    out = torch.zeros_like(rows)
    wide = np.float64(2.0)
    assert _pairs_rows(codecs.cpu_array(rows), codecs.cpu_array(out), wide, b,
                       common.ACT_IDENTITY, slope) == 0
    assert _pairs_input_rows(*[codecs.cpu_array(rows)] * 3, (a, b, a, b, wide),
                             common.ACT_IDENTITY, slope, common.MODE_XHAT_FROM_Y,
                             codecs.cpu_array(out)) == 0
    assert not out.any()


def _packing_steps(pack):
    """A compiled ``(values, words)``: per row of 32 float32 ``values``, ``words[i]`` = the
    bfloat16 of ``values[i]`` (low half) and of ``values[16 + i]`` (high half), packed by
    ``pack`` (``pairs._pack``: the pairs loops' packing, or ``pairs._rounded_pack``: its integer
    rounding alone, which hosts with AVX512-BF16 use only for steps with NaN or subnormal
    lanes)."""
    from llvmlite import ir

    @intrinsic
    def packed_words(typingctx, values, words):
        def codegen(context, builder, signature, args):
            source, target = (context.make_array(kind)(context, builder, value)
                              for kind, value in zip(signature.args, args))
            vectors = builder.bitcast(source.data, pairs._FLOATS.as_pointer())
            first, second = (builder.load(builder.gep(vectors, [ir.Constant(ir.IntType(64), k)]),
                                          align=4) for k in (0, 1))
            builder.store(pack(builder, first, second),
                          builder.bitcast(target.data, pairs._WORDS.as_pointer()), align=4)
            return context.get_dummy_value()
        return numba.types.none(values, words), codegen

    @numba.njit
    def steps(values, words):
        for row in range(values.shape[0]):
            packed_words(values[row], words[row])
    return steps


@pytest.mark.parametrize("pack", ["_pack", "_rounded_pack"])
@pytest.mark.parametrize("shuffled", [False, True])
def test_bfloat16_pairs_packing_rounds_every_class_of_float32_as_torch(pack, shuffled):
    """The pairs loops' packing of float32 results (the hardware conversion where the host has
    AVX512-BF16 and no lane of a step is NaN or subnormal, else the integer rounding; and the
    integer rounding alone, on every host) equals torch's float32 -> bfloat16 conversion bit for
    bit (NaN as ``0x7FC0``): every top half (sign, exponent, high mantissa: zeros, subnormals,
    normals, infinities, NaNs) with low halves below, at and above the rounding's tie, ties at
    odd and even bfloat16 values. In order, a step's lanes are of one class; shuffled, most
    steps mix a NaN or subnormal with normal values, which must send the whole step to the
    integer rounding."""
    top = torch.arange(2 ** 16, dtype=torch.int64) << 16
    bits = (top[:, None] | torch.tensor([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF])).ravel()
    if shuffled:
        bits = bits[torch.randperm(bits.numel(), generator=torch.Generator().manual_seed(2))]
    values = bits.to(torch.int32).view(torch.float32).view(-1, 32)
    words = np.empty((values.shape[0], 16), np.uint32)
    _packing_steps(getattr(pairs, pack))(values.numpy(), words)
    got = torch.from_numpy(words.view(np.int32)).view(torch.int16).view(torch.bfloat16)
    halves = values.view(-1, 2, 16).transpose(1, 2).reshape(-1, 32)  # words' element order
    expected = halves.to(torch.bfloat16)
    _assert_same_values(got.reshape(-1, 32), expected)
    assert (_bits(got)[got.isnan()] == 0x7FC0).all()


@pytest.mark.parametrize("dtype", HALF)
def test_16_bit_statistics_keep_a_large_mean_from_cancelling_the_variance(dtype):
    """A mean 100 times the spread: the shifted sums keep the variance in float32."""
    generator = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 6, 32, 32, generator=generator) + 100).to(dtype)
    layer = layers.InPlaceABN(6, momentum=1.0)
    layer(x.clone())
    reference = x.double().transpose(0, 1).reshape(6, -1)
    torch.testing.assert_close(layer.running_mean.double(), reference.mean(1), rtol=1e-6,
                               atol=0)
    torch.testing.assert_close(layer.running_var.double(), reference.var(1), rtol=1e-4, atol=0)


def test_16_bit_parameters_are_refused_only_when_not_floating_point():
    layer = layers.ABN(3).to(torch.bfloat16)  # model.to(dtype): 16-bit parameters work too
    out = layer(torch.randn(2, 3, 4).to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and layer.running_mean.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="weight must be a floating-point tensor"):
        layers.functional.abn(torch.randn(2, 3, 4), weight=torch.ones(3, dtype=torch.int64))


# --------------------------------------------------------------------------- autocast
class _Classifier(nn.Module):
    def __init__(self, body, channels):
        super().__init__()
        self.body = body
        self.fc = nn.Linear(channels, 10)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


def _resnext_blocks():
    norm_act = NormAct("iabn")
    body = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1),
                         Bottleneck(64, 16, 64, groups=4, norm_act=norm_act),
                         Bottleneck(64, 16, 128, stride=2, groups=4, norm_act=norm_act))
    return _Classifier(body, 128)


MODELS = {
    "resnext_blocks_iabn": _resnext_blocks,
    "densenet_shared_iabn": lambda: densenet_bc(depth=10, growth_rate=6, num_classes=10,
                                                impl="shared", norm="iabn"),
    "densenet_shared_inplace_iabn": lambda: densenet_bc(depth=10, growth_rate=6, num_classes=10,
                                                        impl="shared_inplace", norm="iabn"),
}


def _train(model, autocast_dtype, steps=5):
    """Losses of ``steps`` SGD steps on fixed random batches, and the dtypes the ABN-family
    layers received."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    received = set()
    for module in model.modules():
        if isinstance(module, layers.ABN):
            module.register_forward_pre_hook(lambda m, args: received.add(args[0].dtype))
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 3, 16, 16, generator=generator)
        y = torch.randint(0, 10, (8,), generator=generator)
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return torch.tensor(losses), received, model


@functools.lru_cache(maxsize=None)
def _float32_run(name):
    """The model ``name`` (seeded) and its float32 training, the reference of both 16-bit
    dtypes: computed once per model (the same seed gives the same model and losses)."""
    torch.manual_seed(0)
    model = MODELS[name]()
    reference, received, _ = _train(model, None)
    return model, reference, received


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_trains_under_cpu_autocast_and_follows_float32(name, dtype):
    model, reference, received32 = _float32_run(name)
    losses, received, trained = _train(model, dtype)
    assert received32 == {torch.float32} and received == {dtype}
    torch.testing.assert_close(losses, reference, rtol=VALUE_TOL[dtype], atol=0)
    for parameter in trained.parameters():
        assert parameter.dtype == torch.float32 and parameter.isfinite().all()
