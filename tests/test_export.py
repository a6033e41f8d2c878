"""Inference export: TorchScript (script, trace), ONNX and ``torch.export`` of eval-mode layers
and models, and ``layers.fuse_abn``.

The reference is always the eager eval model on the numba kernels; the exported graphs hold
standard PyTorch ops only (``ABN.inference_forward``), so a saved TorchScript file runs in a
process that never imports ``layers`` and an ONNX file in onnxruntime.
"""
import io
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn

import layers
from layers.deeplab import deeplabv3
from layers.densenet import densenet_bc
from layers.resnext import resnext101
from layers.wideresnet import wideresnet38

ort = pytest.importorskip("onnxruntime", reason="the export extra (pip install -e '.[export]')")
pytest.importorskip("onnxscript", reason="the export extra (pip install -e '.[export]')")

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning",
                                        "ignore::DeprecationWarning")
TOL = dict(rtol=1e-5, atol=1e-5)
#: Whole networks: float32 rounding of tens of layers, in another order than the kernels'.
MODEL_TOL = dict(rtol=1e-4, atol=1e-4)

LAYER_CLASSES = [layers.ABN, layers.InPlaceABN, layers.ABNSync, layers.InPlaceABNSync]
ACTIVATIONS = [("leaky_relu", 0.2), ("elu", 0.7), ("identity", None)]


def _randomize(norm, generator):
    with torch.no_grad():
        channels = norm.num_features
        signs = torch.where(torch.arange(channels) % 2 == 0, 1.0, -1.0)
        if norm.weight is not None:
            norm.weight.copy_((torch.rand(channels, generator=generator) + 0.5) * signs)
            norm.bias.copy_(torch.randn(channels, generator=generator))
        norm.running_mean.copy_(torch.randn(channels, generator=generator))
        norm.running_var.copy_(torch.rand(channels, generator=generator) + 0.5)


def _layer(cls, activation, param, scale_mode, affine=True):
    layer = cls(6, activation=activation, activation_param=param, scale_mode=scale_mode,
                affine=affine)
    _randomize(layer, torch.Generator().manual_seed(0))
    return layer.eval()


def _onnx_run(model, x, dynamo=True):
    """The model exported with ``torch.onnx.export`` and run by onnxruntime: by the default
    exporter (``torch.export``), or with ``dynamo=False`` the deprecated TorchScript one."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            model_bytes = torch.onnx.export(model, (x,), dynamo=True,
                                            verbose=False).model_proto.SerializeToString()
        else:
            buffer = io.BytesIO()
            torch.onnx.export(model, (x,), buffer, dynamo=False)
            model_bytes = buffer.getvalue()
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])


def _ops(graph):
    return {node.kind() for node in graph.nodes()}


# --------------------------------------------------------------------------- layers
@pytest.mark.parametrize("scale_mode", ["abs", "bn"])
@pytest.mark.parametrize("activation, param", ACTIVATIONS)
@pytest.mark.parametrize("cls", LAYER_CLASSES, ids=lambda c: c.__name__)
def test_layer_scripts_traces_and_exports_to_onnx(cls, activation, param, scale_mode):
    layer = _layer(cls, activation, param, scale_mode)
    x = torch.randn(3, 6, 5, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = layer(x.clone())  # the numba kernels (in place for InPlaceABN)
        scripted = torch.jit.script(layer)
        traced = torch.jit.trace(layer, x.clone())
        for name, exported in (("script", scripted), ("trace", traced)):
            torch.testing.assert_close(exported(x.clone()), expected, **TOL,
                                       msg=lambda m: f"{name}: {m}")
    assert not any(kind.startswith("layers::") for kind in _ops(traced.graph))
    torch.testing.assert_close(_onnx_run(layer, x), expected, **TOL)


@pytest.mark.parametrize("cls", [layers.ABN, layers.InPlaceABN], ids=lambda c: c.__name__)
def test_layer_exports_to_onnx_with_the_torchscript_exporter(cls):
    """The deprecated TorchScript-based ONNX exporter (``dynamo=False``) traces the layer, so
    it records ``inference_forward`` too (``layers.abn.exporting`` asks the tracer, not
    ``torch.onnx.is_in_onnx_export``): the file runs in onnxruntime with the eager result."""
    layer = _layer(cls, "leaky_relu", 0.2, "abs")
    x = torch.randn(3, 6, 5, 4, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = layer(x.clone())
    torch.testing.assert_close(_onnx_run(layer, x, dynamo=False), expected, **TOL)


def test_layer_without_affine_parameters_scripts():
    layer = _layer(layers.InPlaceABN, "leaky_relu", 0.01, "abs", affine=False)
    x = torch.randn(2, 6, 3, 3)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(layer)(x.clone()), layer(x.clone()), **TOL)


def test_exporting_a_training_layer_is_refused():
    layer = layers.InPlaceABN(4).train()
    with pytest.raises(RuntimeError, match=r"need eval mode.*model\.eval\(\)"):
        torch.jit.trace(layer, torch.randn(2, 4, 3, 3))


def test_saved_torchscript_runs_without_the_package(tmp_path):
    """The traced model is standard ops: a fresh process loads and runs it with torch only."""
    model = nn.Sequential(nn.Conv2d(3, 6, 3), _layer(layers.InPlaceABN, "elu", 1.0, "abs"),
                          nn.Conv2d(6, 2, 1)).eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    path, inputs = tmp_path / "model.pt", tmp_path / "x.pt"
    with torch.no_grad():
        torch.jit.save(torch.jit.trace(model, x), path)
        expected = model(x)
    torch.save(x, inputs)
    code = ("import sys, torch; m = torch.jit.load(sys.argv[1]); "
            "y = m(torch.load(sys.argv[2])); assert 'layers' not in sys.modules; "
            "torch.save(y, sys.argv[3])")
    out = tmp_path / "y.pt"
    subprocess.run([sys.executable, "-c", code, str(path), str(inputs), str(out)], check=True,
                   cwd=tmp_path, timeout=300)
    torch.testing.assert_close(torch.load(out), expected, **TOL)


# --------------------------------------------------------------------------- models
MODELS = {
    "densenet_naive": lambda norm: densenet_bc(depth=10, growth_rate=4, impl="naive", norm=norm),
    "densenet_shared": lambda norm: densenet_bc(depth=10, growth_rate=4, impl="shared",
                                                norm=norm),
    "densenet_checkpoint": lambda norm: densenet_bc(depth=10, growth_rate=4,
                                                    impl="checkpoint", norm=norm),
    "densenet_shared_inplace": lambda norm: densenet_bc(depth=10, growth_rate=4,
                                                        impl="shared_inplace", norm=norm),
    "resnext101": lambda norm: resnext101(num_classes=10, width=0.0625, norm=norm),
    "wideresnet38": lambda norm: wideresnet38(num_classes=10, width=0.0625, norm=norm),
    "deeplabv3": lambda norm: deeplabv3("resnext101", num_classes=5, norm=norm, width=0.0625),
}
#: Exported to ONNX too (each export takes seconds): one per model family.
ONNX_MODELS = ("densenet_shared", "resnext101", "wideresnet38", "deeplabv3")


def _trained(name, norm):
    """The model with running statistics from two training forwards, in eval mode."""
    torch.manual_seed(0)
    model = MODELS[name](norm)
    size = 32 if name.startswith("densenet") else 64
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(2, 3, size, size))
    return model.eval(), torch.randn(2, 3, size, size)


@pytest.mark.parametrize("name, norm", [(name, norm) for name in sorted(MODELS)
                                         for norm in ("iabn", "bn")
                                         if (name, norm) != ("densenet_shared_inplace", "bn")])
def test_model_traces_and_exports(name, norm):
    model, x = _trained(name, norm)
    with torch.no_grad():
        expected = model(x)
        traced = torch.jit.trace(model, x)
        torch.testing.assert_close(traced(x), expected, **MODEL_TOL)
        exported = torch.export.export(model, (x,))
        torch.testing.assert_close(exported.module()(x), expected, **MODEL_TOL)
    assert not any(str(node.target).startswith("layers.")
                   for node in exported.graph.nodes if node.op == "call_function")
    if norm == "iabn" and name in ONNX_MODELS:
        torch.testing.assert_close(_onnx_run(model, x), expected, **MODEL_TOL)


# --------------------------------------------------------------------------- fuse_abn
def _post_activation(conv, norm):
    return nn.Sequential(conv, norm, nn.Conv2d(conv.out_channels, 3, 1)).eval()


@pytest.mark.parametrize("scale_mode", ["abs", "bn"])
@pytest.mark.parametrize("activation, param", ACTIVATIONS + [("relu", None)])
def test_fuse_abn_equals_the_unfused_model(activation, param, scale_mode):
    generator = torch.Generator().manual_seed(3)
    for conv in (nn.Conv2d(4, 6, 3, padding=1, bias=False),
                 nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2, bias=True)):
        cls = layers.ABN if activation == "relu" else layers.InPlaceABN
        norm = _layer(cls, activation, param, scale_mode)
        model = _post_activation(conv, norm).double()
        x = torch.randn(2, 4, 7, 7, generator=generator, dtype=torch.float64)
        fused = layers.fuse_abn(model)
        assert fused.fused_pairs == [("0", "1")]
        assert not any(isinstance(m, layers.NORM_TYPES) for m in fused.modules())
        with torch.no_grad():
            torch.testing.assert_close(fused(x), model(x), rtol=1e-12, atol=1e-12)


def test_fuse_abn_folds_torch_and_std_bn_norms_and_keeps_the_model():
    from layers.residual import BatchNormAct2d
    generator = torch.Generator().manual_seed(4)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(),
                          nn.Conv2d(6, 6, 3), BatchNormAct2d(6, activation="elu")).eval()
    for norm in (model[1], model[4]):
        _randomize(norm, generator)
    x = torch.randn(2, 3, 9, 9, generator=generator)
    fused = layers.fuse_abn(model)
    assert fused.fused_pairs == [("0", "1"), ("3", "4")]
    assert isinstance(model[1], nn.BatchNorm2d)  # the argument is left as it was
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), **TOL)


def test_fuse_abn_leaves_pre_activation_and_shared_convolutions():
    """BN before a conv (zero padding makes folding inexact), and a conv whose output two
    modules read, are not folded; the result still equals the model."""
    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.norm = layers.ABN(4)
            self.pre = layers.ABN(4)
            self.after = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return self.after(self.pre(self.norm(y))) + y

    model = Branches().eval()
    generator = torch.Generator().manual_seed(5)
    _randomize(model.norm, generator)
    _randomize(model.pre, generator)
    x = torch.randn(2, 3, 6, 6, generator=generator)
    fused = layers.fuse_abn(model)
    assert fused.fused_pairs == []
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), **TOL)


@pytest.mark.parametrize("name, norm, pairs", [
    ("resnext101", "iabn", 104),  # 33 bottlenecks x 3 + 4 downsamples + the stem
    ("densenet_checkpoint", "iabn", 3),  # each dense layer's conv1x1 -> norm2
    ("deeplabv3", "bn", 110),  # the ResNeXt's 104 + five ASPP branches + its projection
])
def test_fuse_abn_on_the_models(name, norm, pairs):
    model, x = _trained(name, norm)
    convolutions = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    fused = layers.fuse_abn(model)
    assert len(fused.fused_pairs) == pairs <= convolutions
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(fused(x), expected, **MODEL_TOL)
        torch.testing.assert_close(torch.jit.trace(fused, x)(x), expected, **MODEL_TOL)


def test_fuse_abn_names_a_model_fx_cannot_trace():
    class DataDependent(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(ValueError, match="fuse_abn: torch.fx cannot trace DataDependent"):
        layers.fuse_abn(DataDependent())
