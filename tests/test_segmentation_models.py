"""The networks of the InPlace-ABN paper's Sec. 4.1-4.2: ResNeXt-101/152, WideResNet-38 and the
DeepLabV3 head, with STD-BN (``norm="bn"``), InPlace-ABN (``norm="iabn"``) or InPlace-ABN sync
(``norm="iabn_sync"``); and every model that trains here (with the DenseNets) in each norm.

Tiny widths and inputs keep the tests fast; the full-size networks are built on the meta device
to count their parameters.
"""
import pytest
import torch
import torch.nn as nn
import torchvision

import layers
from layers import ABN, NORM_TYPES, InPlaceABN
from layers.deeplab import ASPP, atrous_rates, deeplabv3
from layers.residual import BatchNormAct2d, Bottleneck, NormAct, PreActBlock, stage_dilations
from layers.resnext import ResNeXt, resnext101, resnext152
from layers.wideresnet import WideResNet, wideresnet38
from experiments.measure.saved_tensors import saved_storages

#: A WideResNet of the WideResNet-38 kinds of blocks (basic, bottleneck, identity shortcut).
TINY_WRN = ((2, (4, 4)), (1, (8, 8)), (1, (8, 8)), (1, (8, 16)), (1, (8, 16, 32)),
            (1, (16, 32, 64)))


def tiny_resnext(norm="bn", preact=False, **kwargs):
    kwargs.setdefault("num_classes", None)
    return ResNeXt((2, 1, 2, 1), groups=2, width_per_group=2, base_channels=4, norm=norm,
                   preact=preact, **kwargs)


def tiny_wideresnet(norm="bn", **kwargs):
    kwargs.setdefault("num_classes", None)
    return WideResNet(TINY_WRN, stem_channels=4, norm=norm, **kwargs)


#: name -> builder(norm) of every network family and layout, tiny.
NETWORKS = {
    "resnext_postact": lambda norm: tiny_resnext(norm, output_stride=8),
    "resnext_preact": lambda norm: tiny_resnext(norm, preact=True, output_stride=8),
    "wideresnet": lambda norm: tiny_wideresnet(norm, output_stride=8),
    "deeplab_resnext101": lambda norm: deeplabv3("resnext101", width=1 / 32, norm=norm,
                                                 preact=True),
    "deeplab_wideresnet38": lambda norm: deeplabv3("wideresnet38", width=1 / 32, norm=norm),
}


def count_params(model):
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------- shapes and sizes
@pytest.mark.parametrize("output_stride", [8, 16, 32])
@pytest.mark.parametrize("build, options", [(tiny_resnext, {}), (tiny_resnext, {"preact": True}),
                                            (tiny_wideresnet, {})],
                         ids=["postact", "preact", "wideresnet"])
def test_bodies_reach_their_output_stride(build, options, output_stride):
    model = build("iabn", output_stride=output_stride, **options)
    out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, model.num_features, 64 // output_stride, 64 // output_stride)


def test_classifiers_and_segmentation_networks_output_shapes():
    x = torch.randn(2, 3, 40, 48)
    assert resnext101(num_classes=7, width=1 / 32, norm="iabn")(x).shape == (2, 7)
    assert wideresnet38(num_classes=7, width=1 / 32, norm="iabn")(x).shape == (2, 7)
    for body in ("resnext101", "wideresnet38"):
        model = deeplabv3(body, num_classes=5, width=1 / 32, norm="iabn")
        assert model(x).shape == (2, 5, 40, 48), body


def test_full_size_parameter_counts():
    with torch.device("meta"):
        assert count_params(resnext101()) == count_params(
            torchvision.models.resnext101_64x4d()) == 83_455_272
        assert count_params(resnext101(preact=True)) == 83_447_720
        assert count_params(wideresnet38()) == 109_167_912
        assert count_params(wideresnet38(num_classes=None)) == 105_070_912
        resnext_body = resnext101(num_classes=None)
        head = deeplabv3("resnext101")
        # ASPP: 1x1 + three 3x3 + pooling 1x1 from 2048 channels, 1280 -> 256, classifier
        aspp = 2048 * 256 * (1 + 9 * 3 + 1) + 1280 * 256 + 5 * 2 * 256 + 2 * 256
        assert count_params(head) == count_params(resnext_body) + aspp + 256 * 19 + 19


def test_resnext_widths_are_64x4d():
    model = resnext101(norm="bn")
    convs = [model.layer1[0].conv2, model.layer2[0].conv2, model.layer3[0].conv2,
             model.layer4[0].conv2]
    assert [(c.in_channels, c.groups) for c in convs] == [(256, 64), (512, 64), (1024, 64),
                                                         (2048, 64)]
    assert [len(model.get_submodule(f"layer{i}")) for i in (1, 2, 3, 4)] == [3, 4, 23, 3]


def test_wideresnet38_stages_and_dilation_at_output_stride_8():
    model = wideresnet38(num_classes=None, output_stride=8)
    assert [len(model.get_submodule(f"mod{i}")) for i in range(2, 8)] == [3, 3, 6, 3, 1, 1]
    assert model.mod4.block1.convs.conv1.stride == (2, 2)
    assert model.mod5.block1.convs.conv1.stride == (1, 1)
    assert model.mod5.block1.convs.conv1.dilation == (2, 2)
    assert model.mod6.block1.convs.conv2.dilation == (4, 4)
    assert model.mod7.block1.convs.conv2.dilation == (4, 4)
    assert model.num_features == 4096


def test_deeplab_head_follows_the_paper():
    head = deeplabv3("resnext101", norm="bn").aspp
    rates = [branch[0].dilation[0] for branch in head.convs[1:4]]
    assert rates == [12, 24, 36] and atrous_rates(8) == (12, 24, 36)
    assert atrous_rates(16) == (6, 12, 18)
    assert head.convs[0][0].kernel_size == (1, 1)
    assert [b[0].kernel_size for b in head.convs[1:4]] == [(3, 3)] * 3
    assert head.project[0].in_channels == 1280 and head.project[0].out_channels == 256
    assert all(isinstance(b[-1], BatchNormAct2d) for b in head.convs)


def test_stage_dilations_trade_stride_for_dilation():
    assert stage_dilations((1, 2, 2, 2), 32, 4) == [(1, 1), (2, 1), (2, 1), (2, 1)]
    assert stage_dilations((1, 2, 2, 2), 16, 4) == [(1, 1), (2, 1), (2, 1), (1, 2)]
    assert stage_dilations((1, 2, 2, 2), 8, 4) == [(1, 1), (2, 1), (1, 2), (1, 4)]
    assert stage_dilations((2, 2, 2, 1), 8, 4) == [(2, 1), (1, 2), (1, 4), (1, 4)]


# --------------------------------------------------------------------------- torchvision
def test_torchvision_resnext_weights_load_and_compute_the_same():
    torch.manual_seed(0)
    reference = torchvision.models.ResNet(torchvision.models.resnet.Bottleneck, [2, 1, 1, 1],
                                          num_classes=10, groups=2, width_per_group=4).double()
    ours = ResNeXt((2, 1, 1, 1), groups=2, width_per_group=4, num_classes=10, norm="bn",
                   activation="relu").double()
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    for mode in ("train", "eval"):
        getattr(reference, mode)(), getattr(ours, mode)()
        torch.testing.assert_close(ours(x), reference(x), rtol=1e-12, atol=1e-12, msg=mode)


# --------------------------------------------------------------------------- iabn == bn
def randomize_norms(model):
    """Non-trivial BN weights, biases and running statistics (|weight| >= 0.5)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, NORM_TYPES):
                shape = m.weight.shape
                m.weight.copy_(torch.rand(shape, generator=generator) + 0.5)
                m.bias.copy_(torch.randn(shape, generator=generator))
                m.running_mean.copy_(torch.randn(shape, generator=generator))
                m.running_var.copy_(torch.rand(shape, generator=generator) + 0.5)


def twins(name):
    """The ``bn`` network and an ``iabn`` one with the same weights, in float64; the ABN
    layers use ``scale_mode="bn"`` (the scale is the weight, as in BN)."""
    torch.manual_seed(0)
    bn = NETWORKS[name]("bn").double()
    randomize_norms(bn)
    iabn = NETWORKS[name]("iabn").double()
    iabn.load_state_dict(bn.state_dict())
    for m in iabn.modules():
        if isinstance(m, ABN):
            m.scale_mode = "bn"
    return bn, iabn


@pytest.mark.parametrize("name", NETWORKS)
def test_iabn_computes_what_bn_computes(name):
    bn, iabn = twins(name)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=generator)
    results = {}
    for key, model in (("bn", bn), ("iabn", iabn)):
        inp = x.clone().requires_grad_(True)
        out = model(inp)
        out.backward(torch.randn(out.shape, dtype=torch.float64,
                                 generator=torch.Generator().manual_seed(3)))
        results[key] = (out.detach(), inp.grad,
                        {n: p.grad for n, p in model.named_parameters()},
                        {n: b.clone() for n, b in model.named_buffers()})
    (out_bn, dx_bn, grads_bn, bufs_bn), (out_ia, dx_ia, grads_ia, bufs_ia) = (
        results["bn"], results["iabn"])
    close = dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out_ia, out_bn, **close)
    torch.testing.assert_close(dx_ia, dx_bn, **close)
    assert grads_ia.keys() == grads_bn.keys()
    for key in grads_bn:
        torch.testing.assert_close(grads_ia[key], grads_bn[key], msg=key, **close)
    for key in bufs_bn:
        torch.testing.assert_close(bufs_ia[key], bufs_bn[key], msg=key, **close)
    # eval mode (running statistics) agrees too
    bn.eval(), iabn.eval()
    with torch.no_grad():
        torch.testing.assert_close(iabn(x), bn(x), **close)


@pytest.mark.parametrize("name", NETWORKS)
def test_every_norm_is_in_place_with_iabn(name):
    bn, iabn = NETWORKS[name]("bn"), NETWORKS[name]("iabn")
    norms = sum(isinstance(m, BatchNormAct2d) for m in bn.modules())
    assert sum(isinstance(m, InPlaceABN) for m in iabn.modules()) == norms > 0
    assert not any(isinstance(m, (nn.BatchNorm2d, BatchNormAct2d)) for m in iabn.modules())
    assert all(isinstance(m, InPlaceABN) for m in iabn.modules() if isinstance(m, ABN))


@pytest.mark.parametrize("name", NETWORKS)
def test_iabn_keeps_less_for_backward(name):
    # 64x64: at smaller maps InPlace-ABN's per-channel vectors weigh in
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64)
    saved = {norm: sum(saved_storages(NETWORKS[name](norm), x)) for norm in ("bn", "iabn")}
    limit = 0.92 if name == "resnext_postact" else 0.75
    assert saved["iabn"] < limit * saved["bn"], saved


def feature_maps_saved(block, x):
    """Storages of at least one channel's map that ``block(x)`` keeps for backward."""
    map_bytes = x.shape[0] * x.shape[2] * x.shape[3] * x.element_size()
    return sum(1 for b in saved_storages(block, x) if b >= map_bytes)


@pytest.mark.parametrize("norm, maps", [("bn", 6), ("iabn", 3)])
def test_preact_bottleneck_keeps_half_the_maps_with_iabn(norm, maps):
    # identity shortcut: bn1 input, three activations, two convolution outputs (STD-BN);
    # the three in-place outputs (InPlace-ABN), the shortcut copy is not kept
    block = PreActBlock(8, (4, 4, 8), groups=2, norm_act=NormAct(norm))
    x = torch.randn(2, 8, 16, 16, requires_grad=True).clone()
    assert feature_maps_saved(block, x) == maps


@pytest.mark.parametrize("norm, maps", [("bn", 7), ("iabn", 5)])
def test_postact_bottleneck_keeps_the_sum_and_the_last_bn_output(norm, maps):
    # the input, three BN inputs and three activation outputs (the last after the sum) for
    # STD-BN; the input, three in-place outputs and the activated sum for InPlace-ABN
    block = Bottleneck(8, 4, 8, groups=2, norm_act=NormAct(norm))
    x = torch.randn(2, 8, 16, 16, requires_grad=True).clone()
    assert feature_maps_saved(block, x) == maps


def test_identity_shortcut_is_a_copy_and_the_input_is_overwritten():
    block = PreActBlock(4, (4, 4), norm_act=NormAct("iabn")).double()
    reference = PreActBlock(4, (4, 4), norm_act=NormAct("bn")).double()
    reference.load_state_dict(block.state_dict())
    block.bn1.scale_mode = block.convs.bn2.scale_mode = "bn"
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64, requires_grad=True) * 1.0
    before = x.detach().clone()
    out = block(x)
    assert not torch.equal(x.detach(), before)  # bn1 ran in place over the block input
    torch.testing.assert_close(out, reference(before), rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("build, message", [
    (lambda: ResNeXt((3, 4, 23)), r"layers=\(3, 4, 23\) must be four integers"),
    (lambda: ResNeXt((1, 1, 1, 1), groups=0), "groups=0 must be an integer >= 1"),
    (lambda: ResNeXt((1, 1, 1, 1), output_stride=12), "output_stride=12 must be a power of two"),
    (lambda: ResNeXt((1, 1, 1, 1), output_stride=2), "output_stride=2 must be a power of two"),
    (lambda: ResNeXt((1, 1, 1, 1), preact="yes"), "preact='yes' must be True or False"),
    (lambda: ResNeXt((1, 1, 1, 1), norm="gn"),
     "norm='gn' is not supported; allowed: bn, iabn, iabn_sync"),
    (lambda: resnext152(norm="sync"), "norm='sync' is not supported; allowed: bn, iabn, iabn_sync"),
    (lambda: wideresnet38(norm="gn"), "norm='gn' is not supported; allowed: bn, iabn, iabn_sync"),
    (lambda: deeplabv3(norm="gn"), "norm='gn' is not supported; allowed: bn, iabn, iabn_sync"),
    (lambda: ResNeXt((1, 1, 1, 1), norm="iabn_sync", activation="relu"),
     "relu is not invertible"),
    (lambda: ResNeXt((1, 1, 1, 1), norm="iabn", activation="relu"), "relu is not invertible"),
    (lambda: resnext101(width=0), "width=0 must be a number > 0"),
    (lambda: WideResNet(TINY_WRN[:5]), "stages has 5 entries"),
    (lambda: WideResNet(((0, (4, 4)),) + TINY_WRN[1:]), r"stages\[0\] blocks=0"),
    (lambda: PreActBlock(4, (4,)), r"channels=\(4,\) must hold 2"),
    (lambda: PreActBlock(4, (4, 4), groups=2), "groups=2: grouped convolutions need"),
    (lambda: ASPP(8, 4, rates=(0, 2)), r"rates=\(0, 2\) must be integers >= 1"),
    (lambda: deeplabv3("resnet50"), "body='resnet50' is not supported"),
    (lambda: deeplabv3("wideresnet38", num_classes=0, width=1 / 32), "num_classes=0"),
])
def test_bad_arguments_name_the_argument(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# --------------------------------------------------------------------------- every model, norm
NORMS = ("bn", "iabn", "iabn_sync")
#: Every network that trains here, by name: (full-size builder, tiny builder of the same
#: layout, input shape of the tiny one). Tiny: widths scaled down, or small growth rates.
MODELS = {
    "resnext101": (lambda norm: resnext101(norm=norm),
                   lambda norm: resnext101(num_classes=5, width=1 / 32, norm=norm),
                   (2, 3, 32, 32)),
    "resnext152": (lambda norm: resnext152(norm=norm),
                   lambda norm: resnext152(num_classes=5, width=1 / 32, norm=norm),
                   (2, 3, 32, 32)),
    "wideresnet38": (lambda norm: wideresnet38(norm=norm),
                     lambda norm: wideresnet38(num_classes=5, width=1 / 32, norm=norm),
                     (2, 3, 32, 32)),
    "densenet264-k32": (lambda norm: layers.densenet264(norm=norm),
                        lambda norm: layers.densenet264(growth_rate=2, num_classes=5, norm=norm),
                        (2, 3, 32, 32)),
    "densenet264-k48": (lambda norm: layers.densenet264(growth_rate=48, norm=norm),
                        lambda norm: layers.densenet264(growth_rate=3, num_classes=5, norm=norm,
                                                        impl="checkpoint"),
                        (2, 3, 32, 32)),
    "densenet232-k48": (lambda norm: layers.densenet232(norm=norm),
                        lambda norm: layers.densenet232(growth_rate=3, num_classes=5, norm=norm,
                                                        impl="naive"),
                        (2, 3, 32, 32)),
    "densenet-bc-100-k12": (lambda norm: layers.densenet_bc(100, 12, norm=norm),
                            lambda norm: layers.densenet_bc(100, 12, norm=norm),
                            (2, 3, 8, 8)),
    "densenet-bc-100-k12-postact": (
        lambda norm: layers.densenet_bc(100, 12, norm=norm, preact=False),
        lambda norm: layers.densenet_bc(100, 12, norm=norm, preact=False, impl="naive"),
        (2, 3, 8, 8)),
    "deeplabv3-resnext101": (lambda norm: deeplabv3("resnext101", norm=norm),
                             lambda norm: deeplabv3("resnext101", num_classes=3, width=1 / 32,
                                                    norm=norm),
                             (2, 3, 32, 32)),
    "deeplabv3-wideresnet38": (lambda norm: deeplabv3("wideresnet38", norm=norm),
                               lambda norm: deeplabv3("wideresnet38", num_classes=3,
                                                      width=1 / 32, norm=norm),
                               (2, 3, 32, 32)),
}
#: The norm modules each ``norm`` may use (ABN / ABNSync where a layer must be out of place).
NORM_KINDS = {
    "bn": {nn.BatchNorm2d, BatchNormAct2d},
    "iabn": {layers.InPlaceABN, layers.ABN},
    "iabn_sync": {layers.InPlaceABNSync, layers.ABNSync},
}


def norm_kinds(model):
    return {type(m) for m in model.modules() if isinstance(m, NORM_TYPES)}


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name", MODELS)
def test_full_size_models_use_the_norm_everywhere(name, norm):
    with torch.device("meta"):
        model = MODELS[name][0](norm)
    kinds = norm_kinds(model)
    assert kinds and kinds <= NORM_KINDS[norm], kinds
    in_place = {"iabn": layers.InPlaceABN, "iabn_sync": layers.InPlaceABNSync}.get(norm)
    assert in_place is None or in_place in kinds


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name", MODELS)
def test_models_train_with_every_norm(name, norm):
    torch.manual_seed(0)
    model = MODELS[name][1](norm)
    assert norm_kinds(model) <= NORM_KINDS[norm]
    x = torch.randn(MODELS[name][2])
    out = model(x)
    out.square().mean().backward()
    assert torch.isfinite(out).all()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(int(b) == 1 for n, b in model.named_buffers() if n.endswith("num_batches_tracked"))


@pytest.mark.parametrize("name", ["resnext152", "wideresnet38", "densenet264-k32",
                                  "densenet-bc-100-k12-postact", "deeplabv3-resnext101"])
def test_iabn_sync_without_process_group_equals_iabn(name):
    """No process group: InPlaceABNSync / ABNSync compute exactly what InPlaceABN / ABN do."""
    torch.manual_seed(0)
    build = MODELS[name][1]
    iabn = build("iabn").double()
    randomize_norms(iabn)
    sync = build("iabn_sync").double()
    sync.load_state_dict(iabn.state_dict())
    x = torch.randn(MODELS[name][2], dtype=torch.float64)
    results = []
    for model in (iabn, sync):
        inp = x.clone().requires_grad_(True)
        out = model(inp)
        out.backward(torch.ones_like(out))
        results.append([out.detach(), inp.grad] + [p.grad for p in model.parameters()]
                       + [b.clone() for b in model.buffers()])
    assert len(results[0]) == len(results[1])
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_resnext152_is_64x4d_with_blocks_3_8_36_3():
    with torch.device("meta"):
        model, shallower = resnext152(), resnext101()
        # an independent count: torchvision's ResNet class with the same blocks and widths
        theirs = torchvision.models.ResNet(torchvision.models.resnet.Bottleneck, [3, 8, 36, 3],
                                           groups=64, width_per_group=4)
    assert [len(model.get_submodule(f"layer{i}")) for i in (1, 2, 3, 4)] == [3, 8, 36, 3]
    convs = [model.get_submodule(f"layer{i}")[0].conv2 for i in (1, 2, 3, 4)]
    assert [(c.in_channels, c.groups) for c in convs] == [(256, 64), (512, 64), (1024, 64),
                                                         (2048, 64)]
    assert count_params(model) == count_params(theirs) == 114_971_944
    # 101 -> 152 layers: 15 more bottlenecks of 3 convolutions in stages 2 and 3
    assert count_params(model) - count_params(shallower) == (
        4 * count_params(model.layer2[1]) + 13 * count_params(model.layer3[1]))
