"""``torch.channels_last`` end to end: the layers and the models never convert layouts.

Every copy the ATen dispatcher sees (``clone``, ``copy_``, ``_to_copy``) is recorded with the
strides of its source and destination; a *layout copy* is one whose destination is laid out
differently from its source. The kernels read channels-last tensors through their ``(M, C)``
view, so the layers make no copy at all when input and incoming gradient are channels-last,
and the models' forward passes make no layout copy. In backward, the only layout copies allowed
are those of gradients that torch's own operators hand back in another layout (global average
pooling returns a contiguous gradient, and the backward of ``torch.cat`` channel slices of a
channels-last gradient), which a layer copies once into its output's layout; nothing
channels-last is ever converted to another layout.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import layers
from layers.deeplab import deeplabv3
from layers.densenet import densenet_bc
from layers.resnext import resnext101
from layers.wideresnet import wideresnet38

CHANNELS_LAST = torch.channels_last
_COPIES = {torch.ops.aten.clone.default, torch.ops.aten._to_copy.default,
           torch.ops.aten.copy_.default}


class _CopyRecorder(TorchDispatchMode):
    """Records ``(source, destination)`` of every copy of a tensor with 4 dimensions."""

    def __init__(self):
        super().__init__()
        self.copies = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _COPIES:
            source, destination = (args[1], args[0]) if func is torch.ops.aten.copy_.default \
                else (args[0], out)
            if source.dim() == 4:
                self.copies.append((_describe(source), _describe(destination)))
        return out


def _describe(t):
    return {"shape": tuple(t.shape), "stride": t.stride(),
            "channels_last": t.is_contiguous(memory_format=CHANNELS_LAST)
            and not t.is_contiguous()}


def _layout_copies(copies):
    return [(s, d) for s, d in copies if s["stride"] != d["stride"]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("build", [
    lambda: layers.ABN(8), lambda: layers.InPlaceABN(8, variant="I"),
    lambda: layers.InPlaceABN(8, variant="II"), lambda: layers.InPlaceABNSync(8),
], ids=["ABN", "InPlaceABN-I", "InPlaceABN-II", "InPlaceABNSync"])
def test_layer_makes_no_copy_on_channels_last(build, dtype):
    layer = build()
    x = torch.randn(2, 8, 6, 5).to(dtype).contiguous(memory_format=CHANNELS_LAST)
    grad = torch.randn(2, 8, 6, 5).to(dtype).contiguous(memory_format=CHANNELS_LAST)
    leaf = x.requires_grad_()
    inner = leaf * 1  # a non-leaf input (for the in-place layers), made before recording
    with _CopyRecorder() as recorder:
        out = layer(inner)
        out.backward(grad)
    assert recorder.copies == []
    assert out.is_contiguous(memory_format=CHANNELS_LAST)
    assert leaf.grad.is_contiguous(memory_format=CHANNELS_LAST)


def test_recorder_sees_the_copy_of_a_gradient_in_another_layout():
    """The guard of the test above: the recorder does see copies, e.g. of a transposed
    incoming gradient, which the kernels cannot read in place."""
    layer = layers.InPlaceABN(8)
    inner = torch.randn(2, 8, 6, 5, requires_grad=True) * 1
    with _CopyRecorder() as recorder:
        out = layer(inner)
        out.backward(torch.randn(2, 8, 5, 6).transpose(2, 3))
    assert len(_layout_copies(recorder.copies)) == 1
    assert recorder.copies[0][0]["stride"] == (240, 30, 1, 6)


MODELS = {
    "densenet_naive": lambda: densenet_bc(depth=16, growth_rate=8, impl="naive", norm="iabn"),
    "densenet_shared": lambda: densenet_bc(depth=16, growth_rate=8, impl="shared", norm="iabn"),
    "densenet_checkpoint": lambda: densenet_bc(depth=16, growth_rate=8, impl="checkpoint",
                                               norm="iabn"),
    "densenet_shared_inplace": lambda: densenet_bc(depth=16, growth_rate=8,
                                                   impl="shared_inplace", norm="iabn"),
    "resnext101": lambda: resnext101(num_classes=10, width=0.125, norm="iabn"),
    "wideresnet38": lambda: wideresnet38(num_classes=10, width=0.125, norm="iabn"),
    "deeplabv3_resnext101": lambda: deeplabv3("resnext101", num_classes=5, norm="iabn",
                                              width=0.125),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_runs_channels_last_without_converting_it(name):
    torch.manual_seed(0)
    model = MODELS[name]().to(memory_format=CHANNELS_LAST)
    size = 32 if name.startswith("densenet") else 64
    x = torch.randn(2, 3, size, size).contiguous(memory_format=CHANNELS_LAST)
    with _CopyRecorder() as forward:
        out = model(x)
    grad = torch.randn_like(out)
    with _CopyRecorder() as backward:
        out.backward(grad)
    assert _layout_copies(forward.copies) == []
    converted = [(s, d) for s, d in _layout_copies(backward.copies) if s["channels_last"]]
    assert converted == []
