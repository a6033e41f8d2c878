"""DenseNet implementations (``layers.densenet``): one function, three memory strategies.

``shared`` and ``checkpoint`` are compared with ``naive`` in float64 (outputs, input and
parameter gradients, running statistics, eval mode); ``naive`` itself with torchvision's
DenseNet and, for ``norm="iabn"``, with a composite BN + leaky-ReLU reference; STD-BN with
another activation than ReLU (``norm="bn", activation=...``) with InPlace-ABN in
``scale_mode="bn"``. Memory claims are checked by counting what autograd saves (saved-tensor
hooks).
"""
import itertools

import pytest
import torch
import torchvision

import layers
import layers.shared_storage
from abn_reference import composite
from model_steps import randomize_norms, step
from experiments.measure.step import saved_tensor_bytes
from layers.abn import ABN, batch_norm_arguments
from layers.densenet import (DenseNet, densenet121, densenet161, densenet169, densenet201,
                             densenet232, densenet264, densenet_bc, load_torchvision_state_dict)

IMPLS = ("naive", "shared", "checkpoint")  # every norm
IABN_IMPLS = (*IMPLS, "shared_inplace")  # the in-place norms
TOL = 1e-10


# --------------------------------------------------------------------------- helpers
def tiny(impl, layout="cifar", **kwargs):
    """A small network and its input shape: CIFAR layout (3x3 stem) or ImageNet layout."""
    if layout == "cifar":
        return densenet_bc(16, 4, impl=impl, **kwargs), (3, 3, 8, 8)
    return DenseNet(4, (2, 1, 2, 1), 8, num_classes=5, impl=impl, **kwargs), (2, 3, 64, 64)


def build_like(reference, impl, layout, **kwargs):
    """A float64 network with ``reference``'s state, in implementation ``impl``."""
    model = tiny(impl, layout, **kwargs)[0].double()
    model.load_state_dict(reference.state_dict())
    return model


def assert_same(actual, expected):
    assert actual.keys() == expected.keys()
    for key, e in expected.items():
        scale = max(1.0, e.abs().max().item())
        error = (actual[key].double() - e.double()).abs().max().item()
        assert error <= TOL * scale, f"{key}: max error {error:.3g}"


def train_eval_nograd(model, x, grad):
    """Results of a training step, an eval-mode step and an eval forward under no_grad."""
    train = step(model.train(), x, grad)
    evaluation = step(model.eval(), x, grad)
    with torch.no_grad():
        nograd = {"output": model(x)}
    return train, evaluation, nograd


CONFIGS = list(itertools.product(("bn", "iabn"), (True, False), ("cifar", "imagenet")))


# --------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize("norm, preact, layout", CONFIGS)
def test_implementations_compute_the_same_function(norm, preact, layout):
    torch.manual_seed(0)
    reference, shape = tiny("naive", layout, norm=norm, preact=preact)
    reference = randomize_norms(reference.double())
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn(shape[0], reference.classifier.out_features, dtype=torch.float64)
    impls = IMPLS if norm == "bn" else IABN_IMPLS
    models = {impl: build_like(reference, impl, layout, norm=norm, preact=preact)
              for impl in impls}
    expected = train_eval_nograd(models["naive"], x, grad)
    counts = [v for k, v in expected[0].items() if k.endswith("num_batches_tracked")]
    assert counts and all(c == 1 for c in counts)  # one training step: counted once
    for impl in impls[1:]:
        for actual, wanted in zip(train_eval_nograd(models[impl], x, grad), expected):
            assert_same(actual, wanted)


class CompositeABN(ABN):
    """``act(F.batch_norm(x, weight=|w| + eps))`` through PyTorch's own ops (abn_reference)."""

    def forward(self, x):
        training, running_mean, running_var, momentum = batch_norm_arguments(self)
        return composite(x, self.weight, self.bias, running_mean, running_var, training,
                         momentum, self.eps, self.activation, self.activation_param,
                         self.scale_mode)


def with_composite_norms(model):
    """``model`` with every ABN / InPlaceABN replaced by a :class:`CompositeABN` twin."""
    for name, module in list(model.named_modules()):
        if isinstance(module, ABN):
            parent_name, _, child = name.rpartition(".")
            twin = CompositeABN(module.num_features, activation=module.activation,
                                activation_param=module.activation_param,
                                scale_mode=module.scale_mode).double()
            twin.load_state_dict(module.state_dict())
            setattr(model.get_submodule(parent_name), child, twin)
    return model


@pytest.mark.parametrize("preact", (True, False))
def test_iabn_networks_match_a_composite_reference(preact):
    """norm="iabn" against the same network with BN (scale |w| + eps) + leaky ReLU modules."""
    torch.manual_seed(1)
    model, shape = tiny("naive", norm="iabn", preact=preact)
    model = randomize_norms(model.double())
    reference = with_composite_norms(build_like(model, "naive", "cifar", norm="iabn",
                                                preact=preact))
    assert not any(type(m) is not CompositeABN and isinstance(m, ABN)
                   for m in reference.modules())
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn(shape[0], 10, dtype=torch.float64)
    expected = train_eval_nograd(reference, x, grad)
    for impl in IABN_IMPLS:
        actual = train_eval_nograd(build_like(model, impl, "cifar", norm="iabn", preact=preact),
                                   x, grad)
        for a, e in zip(actual, expected):
            assert_same(a, e)


def frozen_step(model, x, grad):
    """A training step with the stem and every normalization frozen: gradients of the rest."""
    for name, p in model.named_parameters():
        p.requires_grad_(not (name.startswith("features.conv0") or ".norm" in name))
    model(x).backward(grad)
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_partly_frozen_networks_agree():
    """Inputs and parameters that need no gradient (fine-tuning) take other backward paths."""
    torch.manual_seed(4)
    reference, shape = tiny("naive")
    reference = randomize_norms(reference.double())
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn(shape[0], 10, dtype=torch.float64)
    expected = frozen_step(reference, x, grad)
    assert "features.denseblock1.denselayer1.conv1.weight" in expected
    for impl in ("shared", "checkpoint"):
        assert_same(frozen_step(build_like(reference, impl, "cifar"), x, grad), expected)


def test_dropout_draws_the_same_masks():
    reference, shape = tiny("naive", drop_rate=0.3)
    reference = reference.double()
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn(shape[0], 10, dtype=torch.float64)
    results = []
    for impl in IMPLS:
        torch.manual_seed(5)
        results.append(step(build_like(reference, impl, "cifar", drop_rate=0.3), x, grad))
    for result in results[1:]:
        assert_same(result, results[0])


@pytest.mark.parametrize("impl", IMPLS)
def test_naive_layout_matches_torchvision(impl):
    """The ImageNet layout with norm="bn" is torchvision's DenseNet, state dict included."""
    torch.manual_seed(2)
    ours, shape = tiny(impl, "imagenet")
    theirs = torchvision.models.DenseNet(4, (2, 1, 2, 1), 8, num_classes=5).double()
    randomize_norms(theirs)
    ours = ours.double()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn(shape[0], 5, dtype=torch.float64)
    assert_same(step(ours, x, grad), step(theirs, x, grad))


# --------------------------------------------------------------------------- state and modes
@pytest.mark.parametrize("norm, preact", list(itertools.product(("bn", "iabn"), (True, False))))
def test_state_dicts_are_interchangeable(norm, preact):
    state = {impl: tiny(impl, norm=norm, preact=preact)[0].state_dict() for impl in IMPLS}
    for impl in IMPLS:
        assert list(state[impl]) == list(state["naive"])
        model = tiny(impl, norm=norm, preact=preact)[0]
        model.load_state_dict(state["naive"], strict=True)


def count_recomputations(monkeypatch):
    """A list that grows by one each time the shared implementation recomputes a BN output."""
    calls = []
    original = layers.shared_storage.reapply_into

    def counting(*args):
        calls.append(None)
        return original(*args)

    monkeypatch.setattr(layers.shared_storage, "reapply_into", counting)
    return calls


def test_shared_storages_are_reused_grown_and_not_state(monkeypatch):
    torch.manual_seed(3)
    model, shape = tiny("shared")
    assert model.shared_storage_bytes() == 0
    x = torch.randn(shape)
    model(x).sum().backward()
    storages = model._route.storages

    def pointers():
        return tuple(s.view((1,), x).data_ptr() for s in (storages.concat, storages.normalized))

    allocated = pointers()
    # Sized once, for the widest concatenation: the first block's output (8 + 2 * 4 channels).
    assert model.shared_storage_bytes() == 2 * shape[0] * 16 * 8 * 8 * 4
    model(x).sum().backward()
    assert pointers() == allocated  # reused across iterations
    model(torch.randn(2 * shape[0], *shape[1:])).sum().backward()
    assert model.shared_storage_bytes() == 2 * 2 * shape[0] * 16 * 8 * 8 * 4  # grown
    assert not any("storage" in key for key in model.state_dict())

    recomputed = count_recomputations(monkeypatch)
    model(x).sum().backward()
    # Every normalization of a concatenation or bottleneck: 2 per dense layer, 2 transitions.
    assert len(recomputed) == 2 * 6 + 2


@pytest.mark.parametrize("mode", ("no_grad", "eval_no_grad"))
def test_inference_saves_and_recomputes_nothing(monkeypatch, mode):
    model, shape = tiny("shared")
    if mode == "eval_no_grad":
        model.eval()
    recomputed = count_recomputations(monkeypatch)
    x = torch.randn(shape)
    with torch.no_grad():
        assert saved_tensor_bytes(model, x) == (0, 0)
    assert recomputed == []


# --------------------------------------------------------------------------- memory
def saved_bytes(impl, depth, growth_rate=6, shape=(4, 3, 16, 16)):
    """Bytes saved for backward by one forward, plus the shared storages."""
    torch.manual_seed(0)
    model = densenet_bc(depth, growth_rate, impl=impl)
    x = torch.randn(shape)
    model(x).sum().backward()  # sizes the shared storages
    return saved_tensor_bytes(model, x)[0] + model.shared_storage_bytes()


def second_over_first_differences(impl):
    values = [saved_bytes(impl, depth) for depth in (40, 64, 88, 112)]
    first = [b - a for a, b in zip(values, values[1:])]
    second = [b - a for a, b in zip(first, first[1:])]
    return [s / first[0] for s in second]


def test_shared_memory_is_linear_in_depth_naive_quadratic():
    # Only the per-channel statistics (6 float64 per channel, like the parameters) grow
    # quadratically in shared; the feature maps dominate them at this size.
    assert all(abs(r) < 0.05 for r in second_over_first_differences("shared"))
    assert all(r > 0.25 for r in second_over_first_differences("naive"))


def test_shared_saves_under_half_of_naive_at_depth_100():
    assert saved_bytes("shared", 100) < 0.5 * saved_bytes("naive", 100)


# --------------------------------------------------------------------------- architectures
@pytest.mark.parametrize("ours, theirs", [
    (densenet121, torchvision.models.densenet121), (densenet169, torchvision.models.densenet169),
    (densenet201, torchvision.models.densenet201), (densenet161, torchvision.models.densenet161),
])
def test_imagenet_models_match_torchvision(ours, theirs):
    with torch.device("meta"):
        ours, theirs = ours(impl="naive"), theirs()
    shapes = {k: v.shape for k, v in ours.state_dict().items()}
    assert shapes == {k: v.shape for k, v in theirs.state_dict().items()}


@pytest.mark.parametrize("build, millions", [
    (lambda: densenet_bc(100, 12), 0.8), (lambda: densenet_bc(250, 24), 15.3),
    (lambda: densenet_bc(190, 40), 25.6),  # Huang et al., Table 2
    (densenet232, 55), (densenet264, 33), (lambda: densenet264(growth_rate=48), 73),  # Pleiss
])
def test_parameter_counts_match_the_papers(build, millions):
    with torch.device("meta"):
        count = sum(p.numel() for p in build().parameters())
    # The papers print one decimal (Huang et al.) or whole millions (Pleiss et al.).
    assert count / 1e6 == pytest.approx(millions, abs=0.05 if millions < 30 else 0.6)


@pytest.mark.parametrize("call, match", [
    (lambda: densenet_bc(41, 12), "depth=41"),
    (lambda: densenet_bc(4, 12), "depth=4"),
    (lambda: densenet_bc(40, 0), "growth_rate=0"),
    (lambda: densenet_bc(40, 12, impl="fast"), "impl='fast'.*naive, shared, shared_inplace, checkpoint"),
    (lambda: densenet_bc(40, 12, impl="shared_inplace"),
     "impl='shared_inplace'.*norm='iabn' or 'iabn_sync', not norm='bn'"),
    (lambda: densenet_bc(40, 12, norm="gn"), "norm='gn'.*allowed: bn, iabn, iabn_sync"),
    (lambda: densenet_bc(40, 12, compression=0), "compression=0"),
    (lambda: densenet_bc(40, 12, preact="yes"), "preact='yes'"),
    (lambda: densenet_bc(40, 12, drop_rate=1), "drop_rate=1"),
    (lambda: DenseNet(12, (), 24), "block_config"),
    (lambda: DenseNet(12, (6, 0), 24), "block_config"),
    (lambda: DenseNet(12, (6,), 24, bn_size=0), "bn_size=0"),
    (lambda: densenet_bc(40, 12, activation="gelu"),
     r"activation='gelu'.*allowed: relu, leaky_relu, elu, identity"),
    (lambda: densenet_bc(40, 12, activation=None, norm="bn", activation_param=0.1),
     "activation_param=0.1 for relu"),
    (lambda: densenet_bc(40, 12, activation=1), "activation=1 .*allowed"),
    (lambda: densenet_bc(40, 12, activation="leaky_relu", activation_param=-0.1),
     "activation_param=-0.1 for leaky_relu"),
    (lambda: densenet_bc(40, 12, activation="elu", activation_param=0), "activation_param=0"),
    (lambda: densenet_bc(40, 12, norm="iabn", activation="relu"),
     r"activation='relu'.*norm='iabn'.*invertible.*allowed: leaky_relu, elu, identity"),
    (lambda: densenet121(norm="iabn_sync", activation="relu"),
     r"activation='relu'.*norm='iabn_sync'.*invertible.*allowed: leaky_relu, elu, identity"),
    (lambda: densenet_bc(40, 12, norm="iabn", activation_param=0),
     "activation_param=0.0 for leaky_relu"),
    (lambda: layers.shared_storage.norm_activation(torch.nn.BatchNorm2d(3), "leaky_relu", -1),
     "activation_param=-1 for leaky_relu"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------- features
CONFIGS_ALL_NORMS = [(norm, preact, impl) for norm in ("bn", "iabn", "iabn_sync")
                     for preact in (True, False)
                     for impl in (IMPLS if norm == "bn" else IABN_IMPLS)]


@pytest.mark.parametrize("norm, preact, impl", CONFIGS_ALL_NORMS)
def test_features_run_on_their_own(norm, preact, impl):
    """``model.features(x)`` is the final feature map; the classifier reads it as forward does
    (torchvision's ReLU after the final BN for norm="bn", pre-activation)."""
    torch.manual_seed(6)
    model, shape = tiny(impl, "imagenet", norm=norm, preact=preact)
    model = randomize_norms(model.double()).eval()
    x = torch.randn(shape, dtype=torch.float64)
    with torch.no_grad():
        features = model.features(x)
        assert isinstance(features, torch.Tensor)
        assert features.shape == (shape[0], model.classifier.in_features, 2, 2)
        if norm == "bn" and preact:
            features = torch.relu(features)
        pooled = torch.flatten(torch.nn.functional.adaptive_avg_pool2d(features, 1), 1)
        torch.testing.assert_close(model.classifier(pooled), model(x), rtol=1e-12, atol=1e-12)
        # a slice of the features runs too, and ends with one tensor
        assert isinstance(model.features[:5](x), torch.Tensor)  # up to the first dense block


@pytest.mark.parametrize("norm", ("bn", "iabn"))
def test_features_train_the_same_in_every_implementation(norm):
    """A training step through ``features`` alone: same output, gradients and statistics in
    the three implementations."""
    torch.manual_seed(8)
    reference, shape = tiny("naive", norm=norm)
    reference = randomize_norms(reference.double())
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn(shape[0], reference.classifier.in_features, 2, 2, dtype=torch.float64)

    def features_step(model):
        model.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_()
        out = model.features(leaf)
        out.backward(grad)
        result = {"output": out.detach(), "input grad": leaf.grad}
        result.update({f"grad {n}": p.grad for n, p in model.named_parameters()
                       if p.grad is not None})
        result.update({f"buffer {n}": b.clone() for n, b in model.named_buffers()})
        return result

    expected = features_step(build_like(reference, "naive", "cifar", norm=norm))
    assert expected["grad features.conv0.weight"].abs().sum() > 0
    for impl in ("shared", "checkpoint"):
        assert_same(features_step(build_like(reference, impl, "cifar", norm=norm)), expected)


def test_shared_features_keep_the_memory_behaviour():
    """``features`` of the shared implementation saves what the whole model saves, minus the
    classifier's input: a few per-sample vectors, not feature maps."""
    torch.manual_seed(0)
    model = densenet_bc(40, 6, impl="shared")
    x = torch.randn(4, 3, 16, 16)
    model(x).sum().backward()  # sizes the storages
    whole = saved_tensor_bytes(model, x)[0]

    class Features(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features = model.features

        def forward(self, x):
            return self.features(x)

    alone = saved_tensor_bytes(Features(), x)[0]
    assert 0 <= whole - alone < 0.02 * whole


# --------------------------------------------------------------------------- torchvision weights
def legacy_keys(state_dict):
    """torchvision's released key names: ``denselayerN.norm.1`` for ``denselayerN.norm1``, and
    no ``num_batches_tracked`` (checkpoints saved before PyTorch 0.4.1), no version metadata."""
    import re
    from collections import OrderedDict

    pattern = re.compile(r"^(.*denselayer\d+\.(?:norm|conv))([12])\.(.*)$")
    return OrderedDict((pattern.sub(r"\1.\2.\3", key), value) for key, value in state_dict.items()
                       if not key.endswith("num_batches_tracked"))


@pytest.mark.parametrize("impl", IMPLS)
def test_torchvision_legacy_checkpoint_loads_and_computes_the_same(impl):
    torch.manual_seed(9)
    theirs = randomize_norms(torchvision.models.densenet121()).double().eval()
    legacy = legacy_keys(theirs.state_dict())
    assert "features.denseblock1.denselayer1.norm.1.weight" in legacy
    assert "features.denseblock4.denselayer16.conv.2.weight" in legacy
    before = dict(legacy)
    ours = densenet121(impl=impl).double().eval()
    with torch.no_grad():
        for buffer in ours.buffers():
            if buffer.dtype == torch.long:
                buffer.fill_(3)
    result = load_torchvision_state_dict(ours, legacy)
    assert not result.missing_keys and not result.unexpected_keys
    assert list(legacy) == list(before)  # the caller's dict is not renamed in place
    # no num_batches_tracked in the checkpoint: kept as it is, as nn.BatchNorm2d does
    assert all(int(b) == 3 for b in ours.buffers() if b.dtype == torch.long)
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(ours.features(x), theirs.features(x), rtol=1e-10,
                                   atol=1e-12)


def test_current_torchvision_keys_load_too_and_bad_model_is_refused():
    theirs = torchvision.models.DenseNet(4, (2, 1, 2, 1), 8, num_classes=5)
    ours = DenseNet(4, (2, 1, 2, 1), 8, num_classes=5, impl="naive")
    result = load_torchvision_state_dict(ours, theirs.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    with pytest.raises(TypeError, match="DenseNet"):
        load_torchvision_state_dict(theirs, theirs.state_dict())


# --------------------------------------------------------------------------- norms
@pytest.mark.parametrize("impl", IABN_IMPLS)
@pytest.mark.parametrize("preact", (True, False))
def test_iabn_sync_without_process_group_equals_iabn(impl, preact):
    torch.manual_seed(10)
    reference = randomize_norms(tiny(impl, norm="iabn", preact=preact)[0].double())
    model = tiny(impl, norm="iabn_sync", preact=preact)[0].double()
    model.load_state_dict(reference.state_dict())
    kinds = {type(m) for m in model.modules() if isinstance(m, layers.NORM_TYPES)}
    assert kinds == ({layers.ABNSync, layers.InPlaceABNSync} if preact
                     else {layers.InPlaceABNSync})
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    grad = torch.randn(3, 10, dtype=torch.float64)
    for got, want in zip(train_eval_nograd(model, x, grad),
                         train_eval_nograd(reference, x, grad)):
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("activation", ("relu", "elu"))
def test_torch_sync_batchnorm_in_the_memory_efficient_paths(impl, activation):
    """After torch's converter, norm="bn" networks hold SyncBatchNorm: the shared and
    checkpointed paths recompute through them without counting a batch twice (one process,
    so nothing is synchronised) and compute what the plain network computes, with the
    network's activation after them."""
    torch.manual_seed(12)
    reference = randomize_norms(tiny("naive", activation=activation)[0].double())
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(
        build_like(reference, impl, "cifar", activation=activation))
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    grad = torch.randn(3, 10, dtype=torch.float64)
    assert_same(step(model.train(), x, grad), step(reference.train(), x, grad))


# --------------------------------------------------------------------------- activations
def as_scale_mode_bn(model):
    """``model`` with every ABN layer in ``scale_mode="bn"`` (scale ``weight``, as BN)."""
    for module in model.modules():
        if isinstance(module, layers.ABN):
            module.scale_mode = "bn"
    return model


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("preact", (True, False))
@pytest.mark.parametrize("activation, layout", [
    ("leaky_relu", "cifar"), ("elu", "cifar"), ("identity", "cifar"), ("leaky_relu", "imagenet"),
])
def test_std_bn_with_an_activation_equals_inplace_abn_in_bn_scale_mode(impl, preact, activation,
                                                                       layout):
    """InPlace-ABN "trains on par with STD-BN" in its exact form (experiments/train/parity.py):
    norm="bn" (PyTorch's BN, then the activation) and norm="iabn" with scale_mode="bn", same
    state: same outputs, input and parameter gradients and running statistics after a training
    step. The composite PyTorch ops of naive STD-BN are a reference independent of the kernels."""
    torch.manual_seed(13)
    if layout == "cifar":
        def build(**kw):
            return densenet_bc(10, 4, impl=impl, preact=preact, activation=activation, **kw)
        shape = (4, 3, 8, 8)
    else:
        def build(**kw):
            return DenseNet(4, (1, 1), 8, num_classes=10, impl=impl, preact=preact,
                            activation=activation, **kw)
        shape = (2, 3, 32, 32)
    standard = randomize_norms(build(norm="bn").double())
    assert {type(m) for m in standard.modules() if isinstance(m, layers.NORM_TYPES)} \
        == {torch.nn.BatchNorm2d}
    inplace = as_scale_mode_bn(build(norm="iabn").double())
    assert any(isinstance(m, layers.InPlaceABN) for m in inplace.modules())
    assert list(inplace.state_dict()) == list(standard.state_dict())
    inplace.load_state_dict(standard.state_dict())
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn(shape[0], 10, dtype=torch.float64)
    expected = step(standard.train(), x, grad)
    assert expected["grad features.conv0.weight"].abs().sum() > 0
    assert_same(step(inplace.train(), x, grad), expected)


@pytest.mark.parametrize("preact", (True, False))
@pytest.mark.parametrize("activation", ("leaky_relu", "elu", "identity"))
def test_std_bn_activations_compute_the_same_function_in_every_implementation(preact,
                                                                              activation):
    """norm="bn" with another activation: the recomputing paths (the shared storages, the
    checkpoint's second BN pass) apply it too, in training, eval and no_grad."""
    torch.manual_seed(14)
    reference, shape = tiny("naive", "imagenet", activation=activation, preact=preact)
    reference = randomize_norms(reference.double())
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn(shape[0], 5, dtype=torch.float64)
    expected = train_eval_nograd(build_like(reference, "naive", "imagenet", preact=preact,
                                            activation=activation), x, grad)
    for impl in ("shared", "checkpoint"):
        model = build_like(reference, impl, "imagenet", preact=preact, activation=activation)
        for actual, wanted in zip(train_eval_nograd(model, x, grad), expected):
            assert_same(actual, wanted)


def test_std_bn_activation_is_applied_everywhere_relu_was():
    """A leaky ReLU of slope 0 is ReLU: torchvision's function with other stem module names;
    ``features`` ends before the final activation, which ``forward`` applies."""
    torch.manual_seed(15)
    relu, shape = tiny("naive", "imagenet")
    relu = randomize_norms(relu.double())
    leaky = build_like(relu, "naive", "imagenet", activation="leaky_relu", activation_param=0)
    assert isinstance(leaky.features.act0, torch.nn.LeakyReLU) and "relu0" not in \
        dict(leaky.features.named_children())
    assert isinstance(relu.features.relu0, torch.nn.ReLU)
    assert list(leaky.state_dict()) == list(relu.state_dict())
    x = torch.randn(shape, dtype=torch.float64)
    grad = torch.randn(shape[0], 5, dtype=torch.float64)
    assert_same(step(leaky, x, grad), step(relu, x, grad))
    elu = build_like(relu, "naive", "imagenet", activation="elu", activation_param=0.5).eval()
    assert elu.activation == "elu" and elu.activation_param == 0.5
    assert "activation=elu, activation_param=0.5" in repr(elu)
    with torch.no_grad():
        pooled = torch.nn.functional.elu(elu.features(x), 0.5).mean((2, 3))
        torch.testing.assert_close(elu.classifier(pooled), elu(x), rtol=1e-12, atol=1e-12)
        assert not torch.allclose(elu(x), relu.eval()(x))


def test_default_activations():
    assert (densenet_bc(10, 4).activation, densenet_bc(10, 4, norm="iabn").activation) \
        == ("relu", "leaky_relu")
    model = densenet_bc(10, 4, norm="iabn_sync", activation="elu", activation_param=2.0)
    norms = [m for m in model.modules() if isinstance(m, layers.NORM_TYPES)]
    assert norms and all((m.activation, m.activation_param) == ("elu", 2.0) for m in norms)
