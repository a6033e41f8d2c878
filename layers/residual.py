"""Building blocks of the residual networks (:mod:`layers.resnext`, :mod:`layers.wideresnet`)
and the DeepLabV3 head (:mod:`layers.deeplab`): a BN + activation factory and two residual
blocks, each written so that an in-place BN + activation never overwrites a tensor that is
still needed.

``norm`` picks the normalization of a whole network:

* ``"bn"`` (STD-BN): :class:`BatchNormAct2d`, i.e. ``nn.BatchNorm2d`` followed by the
  activation applied in place on BN's output, as the standard implementation does. Backward
  keeps BN's input and the activation's output: two buffers.
* ``"iabn"``: :class:`layers.InPlaceABN` wherever its input is needed by nothing else (the
  output of a convolution or of a max-pooling, a residual sum whose shortcut was copied
  first), :class:`layers.ABN` where it is (``norm_act(channels, inplace=False)``). Backward
  keeps one buffer. In the networks built here every BN + activation qualifies.
* ``"iabn_sync"``: as ``"iabn"`` with the statistics synchronised over the default process
  group (the world): :class:`layers.InPlaceABNSync` where ``"iabn"`` has ``InPlaceABN``,
  :class:`layers.ABNSync` where it has ``ABN``. Without an initialised process group it
  computes what ``"iabn"`` computes.

All have ``nn.BatchNorm2d``'s state-dict keys, so one network's weights load into the others.
The activation is leaky ReLU with slope 0.01 by default, as in every experiment of Rota Bulò
et al. (2018, Sec. 4); ``norm="bn"`` also accepts ``"relu"``.
"""
from collections import OrderedDict

import torch.nn as nn
import torch.nn.functional as F

from . import functional
from .abn import ABN, NORM_TYPES, ABNSync, InPlaceABN, InPlaceABNSync, NormBase, \
    batch_norm_arguments, count_batch

#: Values of ``norm``: standard BN, InPlace-ABN, InPlace-ABN synchronised over the ranks.
NORMS = ("bn", "iabn", "iabn_sync")
#: ``norm`` -> (module where the input may be overwritten, module where it may not).
NORM_MODULES = {"iabn": (InPlaceABN, ABN), "iabn_sync": (InPlaceABNSync, ABNSync)}


def check_positive_int(name, value, minimum=1):
    """Raise a ValueError naming ``name`` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return value


def scaled(name, channels, width):
    """``round(channels * width)``: a channel count of a network scaled by ``width`` (> 0),
    at least 1. ``width=1`` is the paper's network; tests use small widths."""
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not width > 0:
        raise ValueError(f"width={width!r} must be a number > 0 (1 = the paper's network)")
    return max(1, round(channels * width))


def _activate_(y, activation, param):
    """``activation`` applied to ``y`` in place (``param``: slope or alpha)."""
    if activation == "leaky_relu":
        return F.leaky_relu(y, param, inplace=True)
    if activation == "elu":
        return F.elu(y, param, inplace=True)
    if activation == "relu":
        return F.relu(y, inplace=True)
    return y


class BatchNormAct2d(NormBase):
    """``F.batch_norm`` (PyTorch's own BN, as ``nn.BatchNorm2d``) followed by an activation
    applied in place on its output (STD-BN).

    ``activation`` and ``activation_param`` are those of :class:`layers.ABN`. Same parameters,
    buffers, state-dict keys, running-statistics bookkeeping and arguments (``eps``,
    ``momentum``, ``affine``, ``track_running_stats``, ``device``, ``dtype``) as
    ``nn.BatchNorm2d``; with ``activation="relu"`` it computes torchvision's ``bn`` + ``relu``
    pair. Like the ABN layers it is a :class:`layers.abn.NormBase`, not a ``_BatchNorm``, so
    PyTorch's BN walkers (``nn.SyncBatchNorm.convert_sync_batchnorm``, BN folding) cannot drop
    its activation. Neither converter synchronises it (see :func:`layers.convert_sync_batchnorm`):
    a ``norm="bn"`` residual network trains with per-rank statistics, the paper's STD-BN
    baseline; ``norm="iabn_sync"`` is the synchronised one.
    """

    def __init__(self, num_features, activation="leaky_relu", activation_param=None, **kwargs):
        super().__init__(num_features, **kwargs)
        _, self.activation_param = functional.check_activation(activation, activation_param,
                                                               inplace=False)
        self.activation = activation

    def forward(self, input):
        if input.dim() != 4:
            raise ValueError(f"expected a 4-D (N, C, H, W) input, got shape {tuple(input.shape)}")
        # the batch counted once F.batch_norm has accepted it, so a refusal counts nothing
        training, running_mean, running_var, momentum = batch_norm_arguments(self, count=False)
        y = F.batch_norm(input, running_mean, running_var, self.weight, self.bias, training,
                         momentum, self.eps)
        count_batch(self)
        return _activate_(y, self.activation, self.activation_param)

    def extra_repr(self):
        return (f"{super().extra_repr()}, activation={self.activation}, "
                f"activation_param={self.activation_param}")


class NormAct:
    """Makes the BN + activation modules of one network: ``norm_act(channels, inplace=...)``.

    ``inplace`` says whether the module's input may be overwritten (nothing else needs it);
    with ``norm="iabn"`` it picks :class:`InPlaceABN` (``True``) or :class:`ABN` (``False``),
    with ``norm="iabn_sync"`` :class:`InPlaceABNSync` or :class:`ABNSync`, with ``norm="bn"``
    it has no effect. ``activation`` overrides the network's activation for one module, e.g.
    ``"identity"`` for a BN before a residual sum.
    """

    def __init__(self, norm="bn", activation="leaky_relu", activation_param=None):
        functional.check_choice("norm", norm, NORMS)
        # validate once, with the stricter in-place rules when they apply
        functional.check_activation(activation, activation_param, inplace=norm in NORM_MODULES)
        self.norm = norm
        self.activation = activation
        self.activation_param = activation_param

    def __call__(self, channels, inplace=True, activation=None):
        activation = self.activation if activation is None else activation
        param = self.activation_param if activation == self.activation else None
        if self.norm == "bn":
            return BatchNormAct2d(channels, activation=activation, activation_param=param)
        layer = NORM_MODULES[self.norm][0 if inplace else 1]
        return layer(channels, activation=activation, activation_param=param)

    @property
    def inplace(self):
        """Whether this network's BN + activation layers overwrite their input."""
        return self.norm in NORM_MODULES


def conv3x3(in_channels, out_channels, stride=1, groups=1, dilation=1):
    """A 3x3 convolution without bias, padded to keep the size (``/ stride``)."""
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=dilation,
                     groups=groups, dilation=dilation, bias=False)


def conv1x1(in_channels, out_channels, stride=1):
    """A 1x1 convolution without bias."""
    return nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    """torchvision's post-activation ResNeXt bottleneck (``conv-BN-act`` x 3, sum, act).

    ``conv1x1 -> BN-act -> conv3x3 (groups, stride, dilation) -> BN-act -> conv1x1 -> BN ->
    + shortcut -> act``; the shortcut is the input or, with ``downsample``, ``conv1x1 -> BN``
    of it. Module names are torchvision's, so its ``Bottleneck`` weights load. Every BN reads
    a convolution's output, so with ``norm="iabn"`` all are in place (``bn3`` and the
    shortcut's BN with the identity activation). The sum is then taken out of place, since
    ``bn3``'s in-place output is kept for its backward, and activated in place (STD-BN sums
    into ``bn3``'s output, as torchvision does). Backward keeps the block input plus six maps
    with STD-BN, four with InPlace-ABN: the sum and ``bn3``'s output cannot be shared.
    """

    expansion = 4

    def __init__(self, in_channels, width, out_channels, stride=1, dilation=1, groups=1,
                 norm_act=None):
        super().__init__()
        norm_act = norm_act or NormAct()
        self.conv1 = conv1x1(in_channels, width)
        self.bn1 = norm_act(width)
        self.conv2 = conv3x3(width, width, stride, groups, dilation)
        self.bn2 = norm_act(width)
        self.conv3 = conv1x1(width, out_channels)
        self.bn3 = norm_act(out_channels, activation="identity")
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(conv1x1(in_channels, out_channels, stride),
                                            norm_act(out_channels, activation="identity"))
        self.activation = norm_act.activation
        _, self.activation_param = functional.check_activation(
            norm_act.activation, norm_act.activation_param, inplace=False)
        self.sum_in_place = not norm_act.inplace

    def forward(self, x):
        out = self.bn1(self.conv1(x))
        out = self.bn2(self.conv2(out))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        # STD-BN's bn3 output is not saved: sum into it, as torchvision does
        out = out.add_(identity) if self.sum_in_place else out + identity
        return _activate_(out, self.activation, self.activation_param)


class PreActBlock(nn.Module):
    """A pre-activation ("identity mapping") residual block, as the InPlace-ABN release's
    ``IdentityResidualBlock``.

    ``bn1`` (BN-act) on the input, then ``channels`` picks the residual branch: two values
    ``(c1, c2)`` give ``conv3x3 -> BN-act -> conv3x3`` (the basic block), three values
    ``(c1, c2, c3)`` give ``conv1x1 -> BN-act -> conv3x3 (groups) -> BN-act -> conv1x1`` (the
    bottleneck). The stride and dilation apply to the first (basic) or the grouped (bottleneck)
    3x3 convolution. The shortcut is the input itself, or ``conv1x1`` (``proj``) of ``bn1``'s
    output when the stride or the channel count changes; it is added in place to the branch's
    last convolution output.

    With ``norm="iabn"`` every BN is in place. ``bn1`` overwrites the block input, which the
    identity shortcut still needs: the shortcut is then a copy taken first (as in the release),
    held only until the sum, never kept for backward.
    """

    def __init__(self, in_channels, channels, stride=1, dilation=1, groups=1, norm_act=None):
        super().__init__()
        channels = tuple(channels)
        if len(channels) not in (2, 3):
            raise ValueError(f"channels={channels!r} must hold 2 (basic block) or 3 "
                             "(bottleneck) channel counts")
        if len(channels) == 2 and groups != 1:
            raise ValueError(f"groups={groups!r}: grouped convolutions need a bottleneck "
                             "(three channel counts)")
        norm_act = norm_act or NormAct()
        self.bn1 = norm_act(in_channels)
        if len(channels) == 2:
            c1, c2 = channels
            layers = [("conv1", conv3x3(in_channels, c1, stride, dilation=dilation)),
                      ("bn2", norm_act(c1)),
                      ("conv2", conv3x3(c1, c2, dilation=dilation))]
        else:
            c1, c2, c3 = channels
            layers = [("conv1", conv1x1(in_channels, c1)),
                      ("bn2", norm_act(c1)),
                      ("conv2", conv3x3(c1, c2, stride, groups, dilation)),
                      ("bn3", norm_act(c2)),
                      ("conv3", conv1x1(c2, c3))]
        self.convs = nn.Sequential(OrderedDict(layers))
        self.proj = None
        if stride != 1 or in_channels != channels[-1]:
            self.proj = conv1x1(in_channels, channels[-1], stride)
        self.copy_shortcut = norm_act.inplace

    def forward(self, x):
        if self.proj is not None:
            y = self.bn1(x)
            shortcut = self.proj(y)
        else:
            shortcut = x.clone() if self.copy_shortcut else x
            y = self.bn1(x)
        return self.convs(y).add_(shortcut)


def stage_dilations(strides, output_stride, stem_stride):
    """``[(stride, dilation), ...]`` per stage so that the network's output stride is
    ``output_stride``: once the stem's ``stem_stride`` times the stages' strides would exceed
    it, a stage keeps stride 1 and multiplies the dilation by its stride instead (DeepLab's
    atrous convolution; every block of such a stage uses the stage's dilation).
    """
    check_positive_int("output_stride", output_stride)
    reachable = stem_stride
    for s in strides:
        reachable *= s
    if output_stride % stem_stride or output_stride > reachable or (
            output_stride & (output_stride - 1)):
        raise ValueError(f"output_stride={output_stride!r} must be a power of two between "
                         f"{stem_stride} and {reachable}")
    current, dilation, out = stem_stride, 1, []
    for s in strides:
        if current * s > output_stride:
            dilation *= s
            out.append((1, dilation))
        else:
            current *= s
            out.append((s, dilation))
    return out


def init_weights(module):
    """torchvision's initialization: He-normal (fan out) convolutions, BN weight 1 and bias 0,
    zero biases of convolutions and linear layers."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, NORM_TYPES) and m.affine:  # BatchNormAct2d and the ABN layers
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)


__all__ = ["NORMS", "NORM_MODULES", "BatchNormAct2d", "NormAct", "Bottleneck", "PreActBlock",
           "stage_dilations", "init_weights", "scaled", "check_positive_int"]
