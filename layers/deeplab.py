"""DeepLabV3 segmentation networks as the InPlace-ABN paper builds them (Rota Bulò et al. 2018,
Sec. 4.2): a ResNeXt-101 or WideResNet-38 body at output stride 8 and the DeepLabV3 head
(Chen et al. 2017), with STD-BN, InPlace-ABN or InPlace-ABN sync throughout.

Our reading of the paper's head ("4 parallel CONV blocks with 256 output channels each and
dilation rates (1, 12, 24, 36) (with x8 downsampled crop sizes from the body) and kernel sizes
(1, 3, 3, 3). The global 1x1 features are computed in a channel-specific way and CONVed into
256 additional channels. Each output block is followed by BatchNorm before all 1280 features
are stacked and reduced by another CONV+BN+ACT block (into 256 features) and finally CONVed to
the number of target classes"), in torchvision's ``ASPP`` names:

* ``convs[0]``: ``conv1x1 -> BN-act``; ``convs[1..3]``: ``conv3x3`` with dilation 12, 24, 36
  (padding = dilation, same size) ``-> BN-act``; ``convs[4]``: global average pooling per
  channel (the "channel-specific" global 1x1 features) ``-> conv1x1 -> BN-act``, broadcast to
  the map size. Each block is 256 channels; "followed by BatchNorm" is read as BN + the
  network's activation, as in DeepLabV3 (ReLU there, leaky ReLU 0.01 here).
* ``project``: the 5 x 256 = 1280 concatenated features ``-> conv1x1 (256) -> BN-act``.
* ``classifier``: ``conv1x1`` (with bias) to the classes; the logits are upsampled bilinearly
  to the input crop (:class:`DeepLabV3`), where the loss is taken.

Not included, as the paper uses none: the extra 3x3 convolution and the dropout of
torchvision's ``DeepLabHead``, auxiliary losses, hybrid dilation. The rates follow the output
stride (``12, 24, 36`` at 8; ``6, 12, 18`` at 16, as in DeepLabV3). With ``norm="iabn"`` every
BN + activation of the head is InPlace-ABN (``"iabn_sync"``: InPlace-ABN sync): each reads a
convolution's output, which nothing else needs. In training, the pooling branch normalizes one
value per crop and channel, so batches need at least two crops (as ``nn.BatchNorm2d``
requires).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .residual import NormAct, check_positive_int, conv1x1, conv3x3, init_weights, scaled
from .resnext import resnext101
from .wideresnet import wideresnet38

#: The bodies of Table 2, by name: builders taking ``num_classes``, ``width`` and the
#: :class:`~layers.resnext.ResNeXt` / :class:`~layers.wideresnet.WideResNet` arguments.
BODIES = {"resnext101": resnext101, "wideresnet38": wideresnet38}
HEAD_CHANNELS = 256


def atrous_rates(output_stride):
    """DeepLabV3's ASPP dilation rates for ``output_stride``: (6, 12, 18) at 16, doubled at 8."""
    check_positive_int("output_stride", output_stride)
    if 16 % output_stride and output_stride % 16:
        raise ValueError(f"output_stride={output_stride!r} must be a power of two")
    return tuple(r * 16 // output_stride for r in (6, 12, 18))


class _PoolingBranch(nn.Sequential):
    """Global average pooling -> conv1x1 -> BN-act, broadcast back to the input's size."""

    def forward(self, x):
        return super().forward(x).expand(-1, -1, x.shape[-2], x.shape[-1])


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling: five parallel branches, concatenated and projected
    (see the module docstring); ``norm_act`` is a :class:`~layers.residual.NormAct`."""

    def __init__(self, in_channels, out_channels=HEAD_CHANNELS, rates=(12, 24, 36),
                 norm_act=None):
        super().__init__()
        norm_act = norm_act or NormAct()
        rates = tuple(rates)
        if not rates or any(isinstance(r, bool) or not isinstance(r, int) or r < 1
                            for r in rates):
            raise ValueError(f"rates={rates!r} must be integers >= 1 (dilation rates)")
        branches = [nn.Sequential(conv1x1(in_channels, out_channels), norm_act(out_channels))]
        branches += [nn.Sequential(conv3x3(in_channels, out_channels, dilation=r),
                                   norm_act(out_channels)) for r in rates]
        branches.append(_PoolingBranch(nn.AdaptiveAvgPool2d(1),
                                       conv1x1(in_channels, out_channels),
                                       norm_act(out_channels)))
        self.convs = nn.ModuleList(branches)
        self.project = nn.Sequential(conv1x1(len(branches) * out_channels, out_channels),
                                     norm_act(out_channels))

    def forward(self, x):
        return self.project(torch.cat([branch(x) for branch in self.convs], 1))


class DeepLabV3(nn.Module):
    """``body`` (features at ``output_stride``) -> :class:`ASPP` -> ``conv1x1`` classifier,
    logits upsampled bilinearly to the input size. Returns ``(N, num_classes, H, W)``."""

    def __init__(self, body, in_channels, num_classes, rates=(12, 24, 36),
                 head_channels=HEAD_CHANNELS, norm_act=None):
        super().__init__()
        check_positive_int("num_classes", num_classes)
        check_positive_int("head_channels", head_channels)
        self.body = body
        self.aspp = ASPP(in_channels, head_channels, rates, norm_act)
        self.classifier = nn.Conv2d(head_channels, num_classes, kernel_size=1)
        init_weights(self.aspp)
        init_weights(self.classifier)

    def load_body(self, state_dict, classifier_prefix="fc."):
        """Initialise the body from an ImageNet classification network's ``state_dict`` (the
        paper's bodies are "solely trained on ImageNet-1k"): every tensor of the body must be
        there with its shape; the classifier's (keys starting ``classifier_prefix``) are
        dropped; anything else is an error, e.g. a checkpoint of another layout or width.
        The output stride does not matter (dilation changes no parameter)."""
        body_keys = set(self.body.state_dict())
        foreign = sorted(k for k in state_dict
                         if k not in body_keys and not k.startswith(classifier_prefix))
        if foreign:
            raise ValueError(f"state_dict: {len(foreign)} tensors belong to no part of the "
                             f"{type(self.body).__name__} body (first: {foreign[:3]}); is it "
                             "a checkpoint of another network, layout or width?")
        missing = sorted(body_keys - set(state_dict))
        if missing:
            raise ValueError(f"state_dict: lacks {len(missing)} tensors of the "
                             f"{type(self.body).__name__} body (first: {missing[:3]})")
        own = self.body.state_dict()
        wrong = [f"{k}: {tuple(state_dict[k].shape)} vs {tuple(own[k].shape)}"
                 for k in sorted(body_keys) if state_dict[k].shape != own[k].shape]
        if wrong:
            raise ValueError(f"state_dict: {len(wrong)} tensors have another shape than the "
                             f"body's (first: {wrong[:3]}); another width?")
        self.body.load_state_dict({k: state_dict[k] for k in body_keys})

    def forward(self, x):
        logits = self.classifier(self.aspp(self.body(x)))
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)


def deeplabv3(body="resnext101", num_classes=19, output_stride=8, norm="bn",
              activation="leaky_relu", activation_param=None, width=1.0, **body_kwargs):
    """The segmentation network of Table 2: ``body`` (``"resnext101"`` or ``"wideresnet38"``)
    at ``output_stride`` with the DeepLabV3 head, ``norm`` ``"bn"``, ``"iabn"`` or
    ``"iabn_sync"`` everywhere.

    ``num_classes`` defaults to Cityscapes' 19; ``width`` scales every channel count of body
    and head (1 is the paper's network). ``body_kwargs`` go to the body's builder (e.g.
    ``preact=True`` for the ResNeXt-101 layout of the InPlace-ABN release).
    """
    norm_args = dict(norm=norm, activation=activation, activation_param=activation_param)
    if body not in BODIES:
        raise ValueError(f"body={body!r} is not supported; allowed: {', '.join(BODIES)}")
    features = BODIES[body](num_classes=None, width=width, output_stride=output_stride,
                            **norm_args, **body_kwargs)
    return DeepLabV3(features, features.num_features, num_classes, atrous_rates(output_stride),
                     scaled("width", HEAD_CHANNELS, width), NormAct(**norm_args))


__all__ = ["ASPP", "DeepLabV3", "deeplabv3", "atrous_rates", "BODIES"]
