"""The one-storage in-place route (``layers.shared_inplace``, DenseNet ``impl="shared_inplace"``).

Checked against independent references: the float64 autograd of the composite PyTorch ops
(``torch.cat`` -> ``F.batch_norm`` with scale ``|w| + eps`` -> activation -> ``F.conv2d`` or
global average pooling), float64 gradcheck, and the ``naive`` DenseNet (which stores every
concatenation) with storage chunks that split feature maps.
"""
import itertools

import pytest
import torch
import torch.nn as nn

from abn_reference import composite
from model_steps import randomize_norms, step
from experiments.measure.step import lower_bound_bytes, saved_tensor_bytes
from layers import ABN, densenet_bc
from layers.abn import batch_norm_arguments
from layers.shared_inplace import chunk_plan, concat_norm_act_conv, concat_norm_act_pool
from layers.shared_storage import SharedStorage

TOL = 1e-10


def naive_plan(channels, chunk_channels):
    """The chunks as every concatenated channel's ``(feature, channel)``, grouped in order."""
    flat = [(i, c) for i, count in enumerate(channels) for c in range(count)]
    return [flat[k:k + chunk_channels] for k in range(0, len(flat), chunk_channels)]


@pytest.mark.parametrize("channels, chunk", [((3, 5, 2), 4), ((8,), 3), ((1, 1, 1), 5),
                                             ((4, 4), 4), ((7, 2), 100)])
def test_chunk_plan_covers_every_channel_once_in_order(channels, chunk):
    plan = chunk_plan(channels, chunk)
    as_channels = [[(i, c) for i, a, b in piece for c in range(a, b)] for piece in plan]
    assert as_channels == naive_plan(channels, chunk)


def test_chunk_plan_refuses_a_bad_size():
    with pytest.raises(ValueError, match="chunk_channels=0"):
        chunk_plan((3,), 0)


# --------------------------------------------------------------------------- the operations
def make_norm(channels, activation, scale_mode="abs", seed=0):
    norm = ABN(channels, activation=activation, scale_mode=scale_mode).double()
    return randomize_norms(norm, seed=seed)


def make_features(widths, shape=(3, 5, 6)):
    generator = torch.Generator().manual_seed(1)
    n, h, w = shape
    return [(torch.randn(n, c, h, w, generator=generator, dtype=torch.float64) * 2 + 0.3)
            .requires_grad_() for c in widths]


def composite_head(features, norm, head):
    """The reference: autograd of PyTorch's own ops on the concatenation (the module's
    bookkeeping, ``num_batches_tracked`` included, as its forward would)."""
    training, running_mean, running_var, momentum = batch_norm_arguments(norm)
    y = composite(torch.cat(features, 1), norm.weight, norm.bias, running_mean, running_var,
                  training, momentum, norm.eps, norm.activation, norm.activation_param,
                  norm.scale_mode)
    return head(y)


CASES = list(itertools.product(("leaky_relu", "elu", "identity"), ("conv1x1", "conv3x3", "pool"),
                               (True, False)))


def heads(kind):
    conv = nn.Conv2d(9, 4, 1 if kind == "conv1x1" else 3, padding=0 if kind == "conv1x1" else 1,
                     bias=False).double()
    if kind == "pool":
        return None, lambda y: y.mean((2, 3))
    return conv, conv


@pytest.mark.parametrize("activation, kind, training", CASES)
def test_equals_the_composite_and_updates_running_statistics_once(activation, kind, training):
    torch.manual_seed(2)
    conv, reference_head = heads(kind)
    widths = (2, 4, 3)  # chunks of 4 channels: features split over chunks
    ours, theirs = make_norm(9, activation).train(training), make_norm(9, activation)
    theirs.train(training)
    features = make_features(widths)
    twins = [f.detach().clone().requires_grad_() for f in features]
    if kind == "pool":
        out = concat_norm_act_pool(features, SharedStorage(), ours, chunk_channels=4)
    else:
        out = concat_norm_act_conv(features, SharedStorage(), ours, conv, chunk_channels=4)
    expected = composite_head(twins, theirs, reference_head)
    grad = torch.randn_like(expected)
    conv_params = list(conv.parameters()) if conv else []  # one conv, read by both
    got = torch.autograd.grad(out, [*features, *ours.parameters(), *conv_params], grad)
    want = torch.autograd.grad(expected, [*twins, *theirs.parameters(), *conv_params], grad)
    torch.testing.assert_close(out, expected, rtol=TOL, atol=TOL)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=TOL, atol=TOL)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=TOL, atol=0)


@pytest.mark.parametrize("kind", ("conv3x3", "pool"))
def test_gradcheck_float64(kind):
    torch.manual_seed(3)
    conv, _ = heads(kind)
    norm = make_norm(9, "elu")
    features = make_features((2, 4, 3), shape=(2, 3, 3))
    storage = SharedStorage()

    def run(*inputs):
        """The operation on ``features``; the parameters after them are read from the
        modules, which gradcheck perturbs in place."""
        if kind == "pool":
            return concat_norm_act_pool(list(inputs[:3]), storage, norm, chunk_channels=4)
        return concat_norm_act_conv(list(inputs[:3]), storage, norm, conv, chunk_channels=4)

    params = [norm.weight, norm.bias, *(conv.parameters() if conv else ())]
    assert torch.autograd.gradcheck(run, (*features, *params))


def test_scale_that_cannot_be_inverted_is_refused_before_anything_is_written():
    norm = make_norm(9, "leaky_relu", scale_mode="bn")
    with torch.no_grad():
        norm.weight[5] = 0.0
    features = make_features((2, 4, 3))
    before = norm.running_mean.clone()
    conv = nn.Conv2d(9, 4, 1, bias=False).double()
    with pytest.raises(ValueError, match=r"\|weight\| < eps in channel\(s\) 5"):
        concat_norm_act_conv(features, SharedStorage(), norm, conv, chunk_channels=4)
    assert torch.equal(norm.running_mean, before)
    with torch.no_grad():  # nothing to invert without a backward pass
        concat_norm_act_conv(features, SharedStorage(), norm, conv, chunk_channels=4)


@pytest.mark.parametrize("norm, match", [
    (nn.BatchNorm2d(9), "norm is an BatchNorm2d: the shared in-place route needs an ABN"),
    (ABN(9, activation="relu"), "activation='relu'.*allowed: leaky_relu, elu, identity"),
])
def test_norms_it_cannot_run_in_place_are_refused(norm, match):
    features = [f.float() for f in make_features((2, 4, 3))]
    with pytest.raises(ValueError, match=match):
        concat_norm_act_conv(features, SharedStorage(), norm, nn.Conv2d(9, 4, 1, bias=False),
                             chunk_channels=4)


# --------------------------------------------------------------------------- the network
@pytest.mark.parametrize("preact", (True, False))
def test_chunks_that_split_feature_maps_give_the_naive_networks_results(preact):
    """bn_size=1: chunks of ``growth_rate`` channels, narrower than the first features."""
    torch.manual_seed(5)
    options = dict(norm="iabn", preact=preact, bn_size=1, activation="elu")
    reference = randomize_norms(densenet_bc(16, 4, impl="naive", **options).double())
    model = densenet_bc(16, 4, impl="shared_inplace", **options).double()
    model.load_state_dict(reference.state_dict())
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    grad = torch.randn(3, 10, dtype=torch.float64)
    for _ in range(2):  # the second step starts from the first one's running statistics
        got, want = step(model, x, grad), step(reference, x, grad)
        assert got.keys() == want.keys()
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=TOL, atol=TOL, msg=key)


def test_the_storage_holds_one_bottleneck_width_of_the_first_block():
    model = densenet_bc(40, 12, impl="shared_inplace", norm="iabn")
    x = torch.randn(4, 3, 16, 16)
    model(x).sum().backward()
    assert model.shared_storage_bytes() == 4 * (4 * 12) * 16 * 16 * 4
    assert list(model.state_dict()) == list(
        densenet_bc(40, 12, impl="naive", norm="iabn").state_dict())


def test_saves_the_lower_bound_but_the_storage_and_per_channel_state():
    """Saved tensors: the feature maps of the lower bound (convolution and pooling outputs,
    the input, the classifier's input) and a (3, C) float64 state per normalization: nothing
    else, unlike the two-storage method (which keeps the last concatenation and its norm)."""
    torch.manual_seed(7)
    shape = (4, 3, 16, 16)
    x = torch.randn(shape)
    saved = {}
    for impl in ("shared", "shared_inplace"):
        model = densenet_bc(40, 12, impl=impl, norm="iabn")
        model(x).sum().backward()
        saved[impl] = saved_tensor_bytes(model, x)[0] + model.shared_storage_bytes()
    model = densenet_bc(40, 12, impl="shared_inplace", norm="iabn")
    bound = lower_bound_bytes(densenet_bc(40, 12, impl="naive"), shape)
    per_channel_bound = sum(2 * 4 * m.num_features for m in model.modules()
                            if isinstance(m, ABN))
    model(x).sum().backward()
    concat_norms = sum(m.num_features for m in model.modules() if type(m) is ABN)
    in_place_norms = sum(m.num_features for m in model.modules() if isinstance(m, ABN)
                         and type(m) is not ABN)
    # InPlaceABN layers keep their full (6, C) state, the shared route (3, C).
    state = 8 * (3 * concat_norms + 6 * in_place_norms)
    expected = bound - per_channel_bound + state + model.shared_storage_bytes()
    assert saved["shared_inplace"] == expected
    assert saved["shared_inplace"] < 0.85 * saved["shared"]
