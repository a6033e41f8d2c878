"""WideResNet-38 (Wu, Shen, van den Hengel, "Wider or Deeper: Revisiting the ResNet Model for
Visual Recognition", 2016, model A) with STD-BN or InPlace-ABN, the second body of the
InPlace-ABN paper (Rota Bulò et al. 2018, Sec. 4.1-4.2).

What is implemented (the InPlace-ABN release's ``WiderResNetA2``, with its names): a 3x3
convolution ``mod1`` (64 channels, stride 1), then six stages ``mod2`` ... ``mod7`` of
pre-activation residual blocks (:class:`~layers.residual.PreActBlock`):

=====  ======  ==================  ===============  ======================
stage  blocks  block channels      kind             stride (output stride)
=====  ======  ==================  ===============  ======================
mod2   3       128, 128            basic (3x3 x2)   max-pool before: 2
mod3   3       256, 256            basic            max-pool before: 4
mod4   6       512, 512            basic            first block: 8
mod5   3       512, 1024           basic            first block: 16
mod6   1       512, 1024, 2048     bottleneck       first block: 32
mod7   1       1024, 2048, 4096    bottleneck       1
=====  ======  ==================  ===============  ======================

and a final BN-act ``bn_out`` (4096 channels). 1 + 2 x 15 + 3 x 2 convolutions + the classifier
are the 38 layers. A block's first convolution takes the stride; a 1x1 projection shortcut
appears where the stride or the channel count changes (the first block of every stage). The
two poolings are ``maxpool3x3/2``. With ``output_stride`` 16 or 8 the strided stages keep
stride 1 and dilate instead: at 8, as the release's ``dilation=True``, ``mod5`` has dilation 2,
``mod6`` and ``mod7`` 4. Parameters: 109,167,912 with 1000 classes (105,070,912 without the
classifier): this layout, the release's, not a number taken from Wu et al.

Left out: the release's ``Dropout2d`` in ``mod6`` / ``mod7`` of its segmentation variant
(p = 0.3 / 0.5; the paper does not mention it). Every BN + activation of this network is
pre-activation, so with ``norm="iabn"`` all of them are in place (identity shortcuts copy the
block input first, see :class:`~layers.residual.PreActBlock`).
"""
from collections import OrderedDict

import torch
import torch.nn as nn

from .residual import (NormAct, PreActBlock, check_positive_int, init_weights, scaled,
                       stage_dilations)

#: (blocks, block channels) of the six stages of WideResNet-38 (model A).
WIDERESNET38 = ((3, (128, 128)), (3, (256, 256)), (6, (512, 512)), (3, (512, 1024)),
                (1, (512, 1024, 2048)), (1, (1024, 2048, 4096)))
STEM_CHANNELS = 64
#: The two max-poolings before mod2 and mod3; then the strides of mod4 ... mod7.
POOLED_STRIDE = 4
STAGE_STRIDES = (2, 2, 2, 1)


class WideResNet(nn.Module):
    """A wide pre-activation ResNet of six stages (model A of Wu et al.) with ``norm="bn"``
    (STD-BN), ``"iabn"`` (InPlace-ABN) or ``"iabn_sync"`` (InPlace-ABN synchronised over the
    default process group).

    Args:
        stages: ``(blocks, channels)`` per stage, six of them (default: WideResNet-38);
            ``channels`` is 2 (basic block) or 3 (bottleneck) channel counts.
        stem_channels: output channels of ``mod1``.
        num_classes: classifier outputs, or ``None`` for the body alone (features).
        output_stride: 32, 16 or 8 (input size / feature size, via dilation).
        norm: ``"bn"``, ``"iabn"`` or ``"iabn_sync"``.
        activation, activation_param: of every BN + activation (default leaky ReLU 0.01).
    """

    def __init__(self, stages=WIDERESNET38, stem_channels=STEM_CHANNELS, num_classes=1000,
                 output_stride=32, norm="bn", activation="leaky_relu", activation_param=None):
        super().__init__()
        stages = tuple((blocks, tuple(channels)) for blocks, channels in stages)
        if len(stages) != 6:
            raise ValueError(f"stages has {len(stages)} entries, expected six (blocks, "
                             "channels) pairs")
        for i, (blocks, channels) in enumerate(stages):
            check_positive_int(f"stages[{i}] blocks", blocks)
            for c in channels:
                check_positive_int(f"stages[{i}] channels", c)
        check_positive_int("stem_channels", stem_channels)
        if num_classes is not None:
            check_positive_int("num_classes", num_classes)
        norm_act = NormAct(norm, activation, activation_param)
        self.norm, self.output_stride = norm, output_stride

        self.mod1 = nn.Sequential(OrderedDict([
            ("conv1", nn.Conv2d(3, stem_channels, 3, stride=1, padding=1, bias=False))]))
        self.pool2 = nn.MaxPool2d(3, stride=2, padding=1)
        self.pool3 = nn.MaxPool2d(3, stride=2, padding=1)
        schedule = [(1, 1), (1, 1)] + stage_dilations(STAGE_STRIDES, output_stride,
                                                      POOLED_STRIDE)
        in_channels = stem_channels
        for i, ((blocks, channels), (stride, dilation)) in enumerate(zip(stages, schedule)):
            stage = []
            for b in range(blocks):
                stage.append((f"block{b + 1}", PreActBlock(
                    in_channels, channels, stride if b == 0 else 1, dilation,
                    norm_act=norm_act)))
                in_channels = channels[-1]
            self.add_module(f"mod{i + 2}", nn.Sequential(OrderedDict(stage)))
        self.bn_out = norm_act(in_channels)
        self.num_features = in_channels
        self.fc = None if num_classes is None else nn.Linear(in_channels, num_classes)
        init_weights(self)

    def forward(self, x):
        x = self.mod2(self.pool2(self.mod1(x)))
        x = self.mod3(self.pool3(x))
        x = self.mod7(self.mod6(self.mod5(self.mod4(x))))
        x = self.bn_out(x)
        if self.fc is None:
            return x
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def wideresnet38(num_classes=1000, width=1.0, **kwargs):
    """WideResNet-38 (model A of Wu et al., as in the InPlace-ABN release).

    ``width`` scales every channel count (``round(c * width)``; 1 is the paper's network).
    Other keyword arguments go to :class:`WideResNet` (``norm``, ``output_stride``, ...).
    """
    stages = tuple((blocks, tuple(scaled("width", c, width) for c in channels))
                   for blocks, channels in WIDERESNET38)
    return WideResNet(stages, scaled("width", STEM_CHANNELS, width), num_classes, **kwargs)


__all__ = ["WideResNet", "wideresnet38", "WIDERESNET38"]
