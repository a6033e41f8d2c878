"""``layers.convert_sync_batchnorm`` in one process: what it converts, what it keeps, and that
the converted model computes what the original did (no process group: no synchronisation).

Across processes (DistributedDataParallel over 2 gloo ranks) it is tested in ``test_sync.py``.
"""
import copy

import pytest
import torch
import torch.nn as nn

import layers
from layers.residual import BatchNormAct2d
from model_steps import randomize_norms, step


def mixed_model():
    """Every kind of layer the converter meets, in float64."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        layers.InPlaceABN(4, activation="elu", activation_param=0.7, variant="I",
                          scale_mode="bn", eps=1e-3, momentum=None),  # 1
        nn.Conv2d(4, 5, 1),
        nn.BatchNorm2d(5, momentum=0.3),  # 3: fused with the LeakyReLU
        nn.LeakyReLU(0.2),  # 4
        nn.Conv2d(5, 5, 1),
        layers.ABN(5, activation="relu", affine=False),  # 6
        nn.Conv2d(5, 6, 1),
        nn.BatchNorm2d(6),  # 8: followed by ReLU, left alone
        nn.ReLU(),
        nn.Sequential(nn.BatchNorm2d(6), nn.ELU()),  # 10: first of its sequence, left alone
        nn.Conv2d(6, 6, 1),
        nn.BatchNorm2d(6, track_running_stats=False),  # 12: fused with the Identity
        nn.Identity(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3))
    return randomize_norms(model, negative=0.3, bias_scale=1.0).double()


def assert_same_results(converted, original, shape, classes, steps=2):
    generator = torch.Generator().manual_seed(1)
    for mode in ["train"] * steps + ["eval"]:
        x = torch.randn(shape, dtype=torch.float64, generator=generator)
        grad = torch.randn(shape[0], *classes, dtype=torch.float64, generator=generator)
        got = step(getattr(converted, mode)(), x, grad)
        want = step(getattr(original, mode)(), x, grad)
        assert got.keys() == want.keys()
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-10, atol=1e-10,
                                       msg=lambda m: f"{mode} {key}: {m}")


def test_what_is_converted_and_what_is_kept():
    model = mixed_model()
    keys = list(model.state_dict())
    tensors = {n: t for n, t in model.state_dict(keep_vars=True).items()}
    model[1].eval()  # the training flag is carried over
    group = object()  # any process group object: only stored
    converted = layers.convert_sync_batchnorm(model, group=group, convert_batchnorm=True)
    assert converted is model
    assert list(converted.state_dict()) == keys
    for name, tensor in converted.state_dict(keep_vars=True).items():
        assert tensor is tensors[name], name  # the very parameters and buffers
    assert not any(t.is_meta for t in converted.state_dict().values())

    first = converted[1]
    assert type(first) is layers.InPlaceABNSync and first.group is group and not first.training
    assert (first.activation, first.activation_param, first.variant, first.scale_mode,
            first.eps, first.momentum) == ("elu", 0.7, "I", "bn", 1e-3, None)
    fused = converted[3]
    assert type(fused) is layers.InPlaceABNSync and type(converted[4]) is nn.Identity
    assert (fused.activation, fused.activation_param, fused.scale_mode, fused.momentum) == (
        "leaky_relu", 0.2, "bn", 0.3)
    relu = converted[6]
    assert type(relu) is layers.ABNSync and relu.activation == "relu" and not relu.affine
    assert type(converted[8]) is nn.BatchNorm2d and type(converted[9]) is nn.ReLU
    assert type(converted[10][0]) is nn.BatchNorm2d and type(converted[10][1]) is nn.ELU
    last = converted[12]
    assert type(last) is layers.InPlaceABNSync and last.activation == "identity"
    assert not last.track_running_stats and last.running_mean is None
    assert all(t.dtype == torch.float64 for n, t in converted.state_dict().items()
               if not n.endswith("num_batches_tracked"))
    assert first._group() is None  # no process group: no synchronisation


def test_converted_model_computes_what_the_original_did():
    original = mixed_model()
    converted = layers.convert_sync_batchnorm(copy.deepcopy(original), convert_batchnorm=True)
    assert_same_results(converted, original, (4, 3, 5, 5), (3,))


def test_without_convert_batchnorm_only_abn_layers_change():
    converted = layers.convert_sync_batchnorm(mixed_model())
    assert type(converted[3]) is nn.BatchNorm2d and type(converted[4]) is nn.LeakyReLU
    assert type(converted[1]) is layers.InPlaceABNSync and type(converted[6]) is layers.ABNSync


def test_a_layer_itself_is_returned_converted():
    layer = layers.InPlaceABN(3)
    converted = layers.convert_sync_batchnorm(layer)
    assert type(converted) is layers.InPlaceABNSync and converted.weight is layer.weight
    again = layers.convert_sync_batchnorm(converted, group="g")
    assert type(again) is layers.InPlaceABNSync and again.group == "g"
    assert type(layers.convert_sync_batchnorm(layers.ABNSync(3))) is layers.ABNSync


@pytest.mark.parametrize("build", [
    lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.0)),
    lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, bias=False), nn.ELU()),
    lambda: nn.Sequential(nn.ReLU(), nn.BatchNorm2d(4), nn.ELU()),
    lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Sigmoid()),
], ids=["relu-slope", "no-bias", "after-relu", "sigmoid"])
def test_batchnorms_that_cannot_run_in_place_are_left_alone(build):
    model = build()
    types = [type(m) for m in model]
    assert [type(m) for m in layers.convert_sync_batchnorm(model, convert_batchnorm=True)] == types


def test_a_batchnorm_with_a_tiny_weight_is_left_alone():
    """scale_mode="bn" in place refuses |weight| < eps: such a BN stays a BN."""
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU())
    with torch.no_grad():
        model[1].weight[2] = 0.0
    assert type(layers.convert_sync_batchnorm(model, convert_batchnorm=True)[1]) is nn.BatchNorm2d


def test_a_subclass_of_abn_is_refused():
    class MyABN(layers.ABN):
        pass

    with pytest.raises(TypeError, match=r"1: cannot convert .*MyABN"):
        layers.convert_sync_batchnorm(nn.Sequential(nn.Conv2d(3, 3, 1), MyABN(3)))


@pytest.mark.parametrize("impl", ["naive", "shared", "checkpoint"])
def test_densenet_converted_keeps_its_function(impl):
    torch.manual_seed(2)
    original = randomize_norms(layers.densenet_bc(16, 4, norm="iabn", impl=impl),
                               negative=0.3, bias_scale=1.0).double()
    converted = layers.convert_sync_batchnorm(copy.deepcopy(original))
    kinds = {type(m) for m in converted.modules() if isinstance(m, layers.NORM_TYPES)}
    assert kinds == {layers.ABNSync, layers.InPlaceABNSync}
    assert_same_results(converted, original, (3, 3, 8, 8), (10,))


def test_batchnorm_act_of_residual_networks_is_left_alone_by_both_converters():
    """``norm="bn"`` residual networks use BatchNormAct2d (STD-BN + activation): torch's
    converter no longer replaces it by a SyncBatchNorm without its activation, and ours
    leaves it too (the residual sum writes into its output)."""
    model = layers.ResNeXt((1, 1, 1, 1), groups=2, width_per_group=2, base_channels=4,
                           num_classes=5, norm="bn")
    kinds = {type(m) for m in model.modules() if isinstance(m, layers.NORM_TYPES)}
    assert kinds == {BatchNormAct2d}
    for convert in (nn.SyncBatchNorm.convert_sync_batchnorm,
                    lambda m: layers.convert_sync_batchnorm(m, convert_batchnorm=True)):
        converted = convert(copy.deepcopy(model))
        assert {type(m) for m in converted.modules()
                if isinstance(m, layers.NORM_TYPES)} == kinds


def test_sequences_with_their_own_forward_are_not_fused():
    class Reordered(nn.Sequential):
        def forward(self, x):  # the norm does not read the convolution's output first
            return self[2](self[1](x + 0)) + self[0](x)

    model = Reordered(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU())
    converted = layers.convert_sync_batchnorm(model, convert_batchnorm=True)
    assert type(converted[1]) is nn.BatchNorm2d
    plain = nn.Sequential(*(copy.deepcopy(m) for m in model))
    fused = layers.convert_sync_batchnorm(plain, convert_batchnorm=True)
    assert type(fused[1]) is layers.InPlaceABNSync
