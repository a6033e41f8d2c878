"""Operations on the meta device without torch's decompositions (experiments.measure.fast_meta):
every output's shape, strides, dtype and storage size against torch's own meta implementation,
the cases left to torch, and the simulated step memory with and without them."""
import pytest
import torch
import torch.nn.functional as F

from experiments.measure import fast_meta
from experiments.measure.fast_meta import FastMeta
from experiments.measure.step import ModelSpec, architecture, simulated_step_memory

aten = torch.ops.aten
#: (shape, memory format): dense layouts of every rank, with size-1 dimensions among them.
LAYOUTS = [((4, 6, 5, 3), torch.contiguous_format), ((4, 6, 5, 3), torch.channels_last),
           ((1, 6, 5, 3), torch.channels_last), ((4, 6, 1, 1), torch.channels_last),
           ((4, 1, 5, 3), torch.contiguous_format), ((2, 3, 2, 2, 2), torch.channels_last_3d),
           ((3, 6), torch.contiguous_format), ((2, 6, 7), torch.contiguous_format)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def describe(outputs):
    """What a meta output is: shape, strides, dtype and storage bytes (``None`` stays)."""
    return [None if t is None else (tuple(t.shape), t.stride(), t.dtype,
                                    t.untyped_storage().nbytes(), t.storage_offset())
            for t in outputs]


def meta(shape, dtype=torch.float32, memory_format=torch.contiguous_format):
    return torch.empty(shape, dtype=dtype, device="meta", memory_format=memory_format)


def forward_args(shape, memory_format, dtype, affine, stats, training, weight_dtype=None):
    channels = shape[1]
    vector = (lambda d: meta(channels, d))
    weight_dtype = weight_dtype or dtype
    return (meta(shape, dtype, memory_format),
            vector(weight_dtype) if affine else None, vector(weight_dtype) if affine else None,
            vector(weight_dtype) if stats else None, vector(weight_dtype) if stats else None,
            training, 0.1, 1e-5)


@pytest.mark.parametrize("shape, memory_format", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_outputs_are_torchs(shape, memory_format, dtype):
    for training, affine, stats, weight_dtype in [
            (True, True, True, None), (True, False, False, None), (False, True, True, None),
            (False, False, True, None), (True, True, True, torch.float32)]:
        args = forward_args(shape, memory_format, dtype, affine, stats, training, weight_dtype)
        fast = fast_meta._batch_norm(*args)
        assert fast is not None
        assert describe(fast) == describe(aten.native_batch_norm.default(*args)), args[1:]


@pytest.mark.parametrize("shape, memory_format", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_outputs_are_torchs(shape, memory_format, dtype):
    statistics = torch.float64 if dtype == torch.float64 else torch.float32
    layouts = [memory_format, torch.contiguous_format]
    for grad_format, input_format in [(a, b) for a in layouts for b in layouts]:
        for train, weight_dtype, mask in [
                (True, dtype, [True, True, True]), (True, None, [True, False, False]),
                (False, dtype, [True, True, False]), (True, torch.float32, [False, True, True])]:
            weight = None if weight_dtype is None else meta(shape[1], weight_dtype)
            args = (meta(shape, dtype, grad_format), meta(shape, dtype, input_format), weight,
                    meta(shape[1], dtype), meta(shape[1], dtype), meta(shape[1], statistics),
                    meta(shape[1], statistics), train, 1e-5, mask)
            want = describe(aten.native_batch_norm_backward.default(*args))
            fast = fast_meta._batch_norm_backward(*args)
            if args[0].stride() != args[1].stride():  # mixed layouts: left to torch
                assert fast is None
                fast = fast_meta.call(aten.native_batch_norm_backward.default, args, {})
            assert describe(fast) == want, (grad_format, input_format, train, weight_dtype, mask)


def test_other_cases_are_left_to_torch():
    """Empty tensors, one value per channel, strided views and real tensors run torch's own
    implementation: the same outputs, or the same error."""
    empty = forward_args((0, 6, 3, 3), torch.channels_last, torch.float32, True, True, True)
    assert fast_meta._batch_norm(*empty) is None
    assert describe(fast_meta.call(aten.native_batch_norm.default, empty, {})) == \
        describe(aten.native_batch_norm.default(*empty))

    single = forward_args((1, 6, 1, 1), torch.contiguous_format, torch.float32, True, True, True)
    assert fast_meta._batch_norm(*single) is None
    with pytest.raises(ZeroDivisionError):  # torch's meta decomposition divides by n - 1 = 0
        fast_meta.call(aten.native_batch_norm.default, single, {})

    view = meta((4, 12, 5, 3))[:, ::2]
    strided = (view, *forward_args((4, 6, 5, 3), torch.contiguous_format, torch.float32, True,
                                   True, True)[1:])
    assert fast_meta._batch_norm(*strided) is None
    assert describe(fast_meta.call(aten.native_batch_norm.default, strided, {})) == \
        describe(aten.native_batch_norm.default(*strided))

    x = torch.randn(4, 6, 5, 3, generator=torch.Generator().manual_seed(0))
    with FastMeta():
        y = F.batch_norm(x, None, None, training=True)
    torch.testing.assert_close(y, F.batch_norm(x, None, None, training=True))


def test_mode_answers_batch_norm_with_keyword_arguments():
    args = forward_args((4, 6, 5, 3), torch.channels_last, torch.bfloat16, True, True, True)
    names = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum",
             "eps")
    got = fast_meta.call(aten.native_batch_norm.default, (), dict(zip(names, args)))
    assert describe(got) == describe(aten.native_batch_norm.default(*args))


ELEMENT_WISE = {
    "add": lambda a, b: aten.add.Tensor(a, b),
    "add_alpha": lambda a, b: aten.add.Tensor(a, b, alpha=0.5),
    "mul": lambda a, b: aten.mul.Tensor(a, b),
    "threshold_backward": lambda a, b: aten.threshold_backward.default(a, b, 0.0),
    "relu": lambda a, b: aten.relu.default(a),
}


@pytest.mark.parametrize("op", list(ELEMENT_WISE))
@pytest.mark.parametrize("shape, memory_format", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_element_wise_outputs_are_torchs(op, shape, memory_format, dtype):
    a, b = meta(shape, dtype, memory_format), meta(shape, dtype, memory_format)
    with FastMeta():
        got = describe([ELEMENT_WISE[op](a, b)])
    assert got == describe([ELEMENT_WISE[op](a, b)])


def _second_operands(first):
    """Operands for ``add`` and ``mul`` beside ``first``: dense, channel slices of larger
    tensors (contiguous and channels-last), a transposed view, an expanded vector, numbers and
    another dtype."""
    shape, dtype = first.shape, first.dtype
    wider = (shape[0], 2 * shape[1], *shape[2:])
    operands = [meta(shape, dtype), meta(wider, dtype)[:, 1:shape[1] + 1],
                meta(wider, dtype).narrow(1, 2, shape[1]), 2.0, 3,
                meta(shape, torch.float64 if dtype != torch.float64 else torch.float32)]
    if first.dim() == 4:
        operands += [meta(wider, dtype, torch.channels_last)[:, :shape[1]],
                     meta((shape[0], shape[1], shape[3], shape[2]), dtype).transpose(2, 3),
                     meta((1, shape[1], 1, 1), dtype).expand(shape)]
    return operands


@pytest.mark.parametrize("overload", [aten.add.Tensor, aten.mul.Tensor], ids=str)
@pytest.mark.parametrize("first", [
    ((4, 6, 5, 3), torch.float32, torch.contiguous_format),
    ((4, 6, 5, 3), torch.float32, torch.channels_last),
    ((4, 6, 5, 3), torch.bfloat16, torch.contiguous_format),
    ((3, 6), torch.float32, torch.contiguous_format),
    ((2, 3, 2, 2, 2), torch.float32, torch.channels_last_3d),
    ((1, 6, 5, 3), torch.float32, torch.channels_last),  # size 1: left to torch with a view
    ((4, 6, 1, 3), torch.float32, torch.contiguous_format)], ids=str)
def test_add_and_mul_with_a_view_or_a_number_are_torchs(overload, first):
    a = meta(*first)
    taken = 0
    for b in _second_operands(a):
        taken += fast_meta._FAST[overload](a, b) is not None
        assert describe([fast_meta.call(overload, (a, b), {})]) == describe([overload(a, b)]), b
    assert taken >= 2  # the numbers at least


@pytest.mark.parametrize("overload", [aten.add.Tensor, aten.mul.Tensor,
                                      aten.threshold_backward.default], ids=str)
def test_element_wise_cases_left_to_torch(overload):
    """Mixed dtypes, integers, broadcasting (``add``, ``mul``), and for ``threshold_backward``
    mixed layouts and views too: torch's own outputs."""
    x = meta((4, 6, 5, 3))
    cases = [(meta((4, 6, 5, 3), torch.bfloat16), x),
             (meta((4, 6), torch.int64), meta((4, 6), torch.int64))]
    if overload is aten.threshold_backward.default:
        extra = (0.0,)
        cases += [(x, meta((4, 6, 5, 3), memory_format=torch.channels_last)),
                  (x, meta((4, 6, 10, 3))[:, :, ::2])]
    else:
        extra = ()
        cases += [(x, meta((1, 6, 1, 1)))]
    for a, b in cases:
        assert fast_meta._FAST[overload](a, b, *extra) is None
        assert describe([fast_meta.call(overload, (a, b, *extra), {})]) == \
            describe([overload(a, b, *extra)])


def test_normal_on_meta_returns_the_tensor_and_draws_nothing():
    weight = meta((8, 4, 3, 3), memory_format=torch.channels_last)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    assert fast_meta._FAST[aten.normal_.default](weight, 0.0, 1.0) is weight
    with FastMeta():
        assert torch.nn.init.kaiming_normal_(weight) is weight
    assert describe([weight]) == describe([meta((8, 4, 3, 3), memory_format=torch.channels_last)])
    assert torch.equal(torch.get_rng_state(), state)  # as torch's meta normal_
    real = torch.zeros(3)
    with FastMeta():
        real.normal_()
    assert real.abs().sum() > 0  # real tensors are drawn as ever


SIMULATED = {
    "densenet-naive-bn": lambda: ModelSpec("densenet_bc", 22, 12, impl="naive"),
    "densenet-checkpoint-bn": lambda: ModelSpec("densenet_bc", 22, 12, impl="checkpoint"),
    "densenet-shared_inplace-iabn": lambda: ModelSpec("densenet_bc", 22, 12,
                                                      impl="shared_inplace", norm="iabn"),
}


@pytest.mark.parametrize("case", list(SIMULATED))
def test_simulated_step_and_lower_bound_do_not_change(monkeypatch, case):
    """A simulated step's memory by kind and the architecture's lower bound are the same with
    torch's own meta implementations (the fast paths switched off)."""
    spec = SIMULATED[case]()
    shape = (8, 3, 32, 32)
    fast = simulated_step_memory(spec, shape), architecture(spec, shape)
    monkeypatch.setattr(fast_meta, "_FAST", {})
    slow = simulated_step_memory(spec, shape), architecture(spec, shape)
    assert fast[0].record() == slow[0].record()
    assert fast[0].peak_by_kind == slow[0].peak_by_kind
    assert fast[1] == slow[1]
