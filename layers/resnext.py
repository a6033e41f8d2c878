"""ResNeXt (Xie et al. 2017) for ImageNet classification and as a segmentation body, with
STD-BN or InPlace-ABN (Rota Bulò et al. 2018, Sec. 4.1-4.2).

The layout is torchvision's ``models/resnet.py`` (``resnext101_64x4d``): a ``conv7x7/2 -
BN-act - maxpool3x3/2`` stem, four stages of bottleneck blocks (``layers``), global average
pooling and a linear classifier. Stage ``i`` (0-3) has bottleneck width
``groups * width_per_group * 2**i`` and ``4 * base_channels * 2**i`` output channels; its first
block has stride 2 (stage 0: 1) in the grouped 3x3 convolution and a 1x1 projection shortcut.
``resnext101()`` is 64x4d: widths 256/512/1024/2048, outputs 256/512/1024/2048, 83.46M
parameters with 1000 classes, exactly torchvision's. ``resnext152()`` is the InPlace-ABN
paper's ResNeXt-152, 64x4d with blocks 3-8-36-3 (114.97M parameters with 1000 classes, the
count of torchvision's ``ResNet`` with these blocks, ``groups=64``, ``width_per_group=4``).

Two block layouts (``preact``):

* ``False`` (default): torchvision's post-activation :class:`~layers.residual.Bottleneck`;
  with ``norm="bn"`` and ``activation="relu"`` a torchvision ``resnext101_64x4d`` state dict
  loads and computes the same function. In-place ABN saves two of the six feature maps a
  block keeps for backward (the residual sum and the last BN's output are both kept).
* ``True``: pre-activation bottlenecks (:class:`~layers.residual.PreActBlock`, He et al.'s
  identity mappings), the layout of the InPlace-ABN authors' released ResNeXt-101, with the
  same widths, a final BN-act ``bn_out`` after the last stage. Every BN + activation then
  precedes a convolution, and InPlace-ABN keeps three of the six feature maps (the paper's
  50%).

``output_stride`` 32 (classification), 16 or 8 (segmentation, DeepLab): the last stages then
keep stride 1 and dilate their 3x3 convolutions instead. ``num_classes=None`` drops the pooling
and the classifier: the network returns the last feature map (the body of
:mod:`layers.deeplab`).
"""
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn as nn

from .residual import (Bottleneck, NormAct, PreActBlock, check_positive_int, init_weights,
                       scaled, stage_dilations)

#: Stride of the stem (``conv7x7/2`` and ``maxpool/2``) and of the four stages.
STEM_STRIDE = 4
STAGE_STRIDES = (1, 2, 2, 2)


class ResNeXt(nn.Module):
    """ResNeXt with ``norm="bn"`` (STD-BN), ``"iabn"`` (InPlace-ABN) or ``"iabn_sync"``
    (InPlace-ABN synchronised over the default process group).

    Args:
        layers: bottleneck blocks per stage (four integers; ResNeXt-101: 3, 4, 23, 3).
        groups: cardinality (groups of the 3x3 convolutions).
        width_per_group: channels per group in the first stage (``d`` of "64x4d").
        base_channels: stem output channels; stage ``i`` outputs ``4 * base_channels * 2**i``.
        num_classes: classifier outputs, or ``None`` for the body alone (features).
        output_stride: 32, 16 or 8 (input size / feature size, via dilation).
        preact: pre-activation blocks (the InPlace-ABN release) instead of torchvision's.
        norm: ``"bn"``, ``"iabn"`` or ``"iabn_sync"``.
        activation, activation_param: of every BN + activation (default leaky ReLU 0.01).
    """

    def __init__(self, layers, groups=64, width_per_group=4, base_channels=64,
                 num_classes=1000, output_stride=32, preact=False, norm="bn",
                 activation="leaky_relu", activation_param=None):
        super().__init__()
        if (not isinstance(layers, Sequence) or len(layers) != 4
                or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in layers)):
            raise ValueError(f"layers={layers!r} must be four integers >= 1 (blocks per stage)")
        for name, value in (("groups", groups), ("width_per_group", width_per_group),
                            ("base_channels", base_channels)):
            check_positive_int(name, value)
        if num_classes is not None:
            check_positive_int("num_classes", num_classes)
        if not isinstance(preact, bool):
            raise ValueError(f"preact={preact!r} must be True or False")
        norm_act = NormAct(norm, activation, activation_param)
        self.norm, self.preact, self.output_stride = norm, preact, output_stride

        self.conv1 = nn.Conv2d(3, base_channels, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = norm_act(base_channels)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_channels = base_channels
        schedule = stage_dilations(STAGE_STRIDES, output_stride, STEM_STRIDE)
        for i, (blocks, (stride, dilation)) in enumerate(zip(layers, schedule)):
            width = groups * width_per_group * 2 ** i
            out_channels = 4 * base_channels * 2 ** i
            stage = []
            for b in range(blocks):
                stage.append((str(b), self._block(in_channels, width, out_channels,
                                                  stride if b == 0 else 1, dilation, groups,
                                                  norm_act)))
                in_channels = out_channels
            self.add_module(f"layer{i + 1}", nn.Sequential(OrderedDict(stage)))
        self.bn_out = norm_act(in_channels) if preact else None
        self.num_features = in_channels
        self.fc = None if num_classes is None else nn.Linear(in_channels, num_classes)
        init_weights(self)

    def _block(self, in_channels, width, out_channels, stride, dilation, groups, norm_act):
        if self.preact:
            return PreActBlock(in_channels, (width, width, out_channels), stride, dilation,
                               groups, norm_act)
        return Bottleneck(in_channels, width, out_channels, stride, dilation, groups, norm_act)

    def forward(self, x):
        x = self.maxpool(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        if self.bn_out is not None:
            x = self.bn_out(x)
        if self.fc is None:
            return x
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


#: Blocks per stage of the two depths the InPlace-ABN paper trains (Sec. 4.1).
RESNEXT101_LAYERS = (3, 4, 23, 3)
RESNEXT152_LAYERS = (3, 8, 36, 3)


def _resnext_64x4d(layers, num_classes, width, kwargs):
    channels = scaled("width", 64, width)
    return ResNeXt(layers, groups=channels, width_per_group=4, base_channels=channels,
                   num_classes=num_classes, **kwargs)


def resnext101(num_classes=1000, width=1.0, **kwargs):
    """ResNeXt-101 64x4d (blocks 3-4-23-3, cardinality 64, 4 channels per group).

    ``width`` scales the cardinality and every channel count (``round(64 * width)`` groups and
    stem channels; 1 is the paper's network, small values give cheap test networks). Other
    keyword arguments go to :class:`ResNeXt` (``norm``, ``preact``, ``output_stride``, ...).
    """
    return _resnext_64x4d(RESNEXT101_LAYERS, num_classes, width, kwargs)


def resnext152(num_classes=1000, width=1.0, **kwargs):
    """ResNeXt-152 64x4d (blocks 3-8-36-3, cardinality 64, 4 channels per group), the deeper
    classification network of the InPlace-ABN paper (Table 1). Arguments as
    :func:`resnext101`.
    """
    return _resnext_64x4d(RESNEXT152_LAYERS, num_classes, width, kwargs)


__all__ = ["ResNeXt", "resnext101", "resnext152", "RESNEXT101_LAYERS", "RESNEXT152_LAYERS"]
