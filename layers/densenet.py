"""DenseNet-BC models (Huang et al. 2017) in three implementations of equal function.

The structure and parameter names follow torchvision's ``models/densenet.py`` (a torchvision
state dict loads into the ImageNet models built here with ``norm="bn"``, ``preact=True``).
``impl`` chooses how a dense layer keeps what its backward pass needs (Pleiss et al. 2017):

* ``"naive"``: ``torch.cat`` + BN + activation + convolution as separate autograd ops, so the
  concatenation and the normalized copy of every layer are stored: memory quadratic in depth,
  as the original implementation.
* ``"shared"``: the paper's method (:mod:`layers.shared_storage`). Concatenations and BN
  outputs go into two storages shared by all layers of the network and are recomputed in
  backward; only convolution outputs persist, so feature-map memory is linear in depth. The
  transitions' ``concat -> BN -> act -> conv`` and, with ``norm="bn"``, every layer's second
  ``BN -> act -> conv`` take the same route.
* ``"checkpoint"``: ``torch.utils.checkpoint`` (non-reentrant) around each layer's
  ``concat -> BN -> act -> conv1x1``, as torchvision's ``memory_efficient=True`` and the
  authors' later PyTorch code do; the recomputation re-uses the batch statistics without
  updating the running statistics a second time.
* ``"shared_inplace"`` (``norm="iabn"`` or ``"iabn_sync"`` only): the two papers combined
  (:mod:`layers.shared_inplace`). One shared storage instead of two: the concatenation is
  normalized and activated in place in it, and the convolution's backward and InPlace-ABN's
  both read that buffer; it holds at most ``bn_size * growth_rate`` channels at a time (the
  concatenation is processed in chunks of channels, a 1x1 convolution being a sum over them).
  The final BN + activation + pooling of a pre-activation network take the same route, so no
  concatenation or normalized copy is kept for backward at all.

``norm="bn"`` uses ``nn.BatchNorm2d`` (PyTorch's own BN) followed by the network's
``activation``, ReLU by default as torchvision's; another activation (leaky ReLU, ELU, the
identity) gives the STD-BN baseline of the InPlace-ABN paper, with the same modules and state
dict. The activation is the network's, applied after every ``nn.BatchNorm2d``, so
``nn.SyncBatchNorm.convert_sync_batchnorm`` keeps it. ``norm="iabn"`` uses layers from
:mod:`layers.abn` with the activation built in (leaky ReLU, slope 0.01, by default; it must be
invertible): ``InPlaceABN`` where its input is a convolution output (the bottleneck, the stem,
post-activation layers), out-of-place ``ABN`` on concatenations. ``norm="iabn_sync"``
synchronises every one of them over the default process group: ``InPlaceABNSync`` and
``ABNSync`` (out of place) in the same places; without an initialised process group it computes
what ``"iabn"`` computes. ``preact=False`` gives post-activation layers (``conv -> BN -> act``,
Fig. 2 left of the memory-efficient DenseNet paper).

A module hook (forward, pre-forward, backward) on a norm or convolution that a memory-efficient
implementation computes without calling it (a dense layer's ``norm1`` and ``conv1``, a
transition's, the final ``norm5`` of ``"shared_inplace"``) makes that step run as in
``"naive"``: the hook runs and sees what it sees there, at the memory cost of that step.

All implementations have the same modules and state dict; the shared storages are plain
attributes of the network, not part of its state. ``model.features`` runs on its own, as
torchvision's: ``model.features(x)`` is the final feature map (for ``norm="bn"`` before the
final activation, which ``forward`` applies, as torchvision's; the ABN layers' activation is
part of the layer). :func:`load_torchvision_state_dict` loads torchvision's released
checkpoints, whose keys have the legacy names (``norm.1``, ``conv.2``).
"""
import dataclasses
import math
import re
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules import module as module_globals
from torch.utils.checkpoint import checkpoint

from . import functional
from .abn import ABN, NORM_TYPES, InPlaceABN, exporting
from .residual import NORM_MODULES
from . import shared_inplace
from .shared_storage import SharedStorage, SharedStorages, concat_norm_act_conv

IMPLS = ("naive", "shared", "shared_inplace", "checkpoint")
#: The implementations that need an in-place norm (``"iabn"``, ``"iabn_sync"``).
INPLACE_IMPLS = ("shared_inplace",)
NORMS = ("bn", "iabn", "iabn_sync")
#: ``norm`` -> the activations it takes: any of the ABN layers' for STD-BN, the invertible ones
#: for the in-place layers.
ALLOWED_ACTIVATIONS = {"bn": ("relu", "leaky_relu", "elu", "identity"),
                       "iabn": functional.INVERTIBLE_ACTIVATIONS,
                       "iabn_sync": functional.INVERTIBLE_ACTIVATIONS}
#: ``norm`` -> its default activation: torchvision's ReLU for ``"bn"``, leaky ReLU (slope
#: 0.01, the InPlace-ABN paper's) for the in-place layers.
DEFAULT_ACTIVATIONS = {"bn": "relu", "iabn": "leaky_relu", "iabn_sync": "leaky_relu"}


# --------------------------------------------------------------------------- building blocks
@dataclasses.dataclass(frozen=True)
class _Activation:
    """A network's activation: ``name`` and its parameter (slope or alpha, 0 for the others).

    Called on a batch norm's fresh output, it activates it in place, as torchvision's
    ``relu(inplace=True)``; the ABN layers apply their own.
    """

    name: str
    param: float

    def __call__(self, y):
        if self.name == "relu":
            return F.relu(y, inplace=True)
        if self.name == "leaky_relu":
            return F.leaky_relu(y, self.param, inplace=True)
        if self.name == "elu":
            return F.elu(y, self.param, inplace=True)
        return y

    def module(self):
        """The activation as a module, or ``None`` for the identity."""
        if self.name == "relu":
            return nn.ReLU(inplace=True)
        if self.name == "leaky_relu":
            return nn.LeakyReLU(self.param, inplace=True)
        if self.name == "elu":
            return nn.ELU(self.param, inplace=True)
        return None


def _make_norm(norm, channels, input_is_conv_output, activation):
    """A BN + activation module: in place (InPlace-ABN) only over a convolution's output.

    ``nn.BatchNorm2d`` (``norm="bn"``) leaves the activation to the caller (:func:`_norm_act`).
    """
    if norm == "bn":
        return nn.BatchNorm2d(channels)
    layer = NORM_MODULES[norm][0 if input_is_conv_output else 1]
    return layer(channels, activation=activation.name, activation_param=activation.param)


def _norm_act(norm, x, activation):
    """``act(norm(x))``; ``norm`` ``None`` is the identity. A torch batch norm is followed by
    ``activation``, an ABN layer applies its own."""
    if norm is None:
        return x
    y = norm(x)
    return y if isinstance(norm, ABN) else activation(y)


def _norm_act_again(norm, x, activation):
    """:func:`_norm_act` recomputed in a checkpoint's backward: running statistics untouched.

    In training the batch statistics are used again with momentum 0, which leaves the running
    statistics exactly as they are (and ``num_batches_tracked`` is not counted again); the
    same tensors are saved as in the first call, as non-reentrant checkpointing requires.
    """
    if norm is None or not norm.training:
        return _norm_act(norm, x, activation)
    if isinstance(norm, ABN):  # synchronised again, over the same group, if norm is
        return functional.abn(x, norm.weight, norm.bias, norm.running_mean, norm.running_var,
                              True, 0.0, norm.eps, norm.activation, norm.activation_param,
                              norm.scale_mode, norm._group())
    if isinstance(norm, nn.SyncBatchNorm):
        # Its own forward, to synchronise again (after nn.SyncBatchNorm.convert_sync_batchnorm)
        # and save the same tensors; momentum 0 and the count restored leave its state as is.
        momentum, count = norm.momentum, norm.num_batches_tracked
        count = None if count is None else count.clone()
        norm.momentum = 0.0
        try:
            y = norm(x)
        finally:
            norm.momentum = momentum
            if count is not None:
                norm.num_batches_tracked.copy_(count)
        return activation(y)
    y = F.batch_norm(x, norm.running_mean, norm.running_var, norm.weight, norm.bias, True, 0.0,
                     norm.eps)
    return activation(y)


def _checkpointed(features, norm, conv, activation):
    """``conv(act(norm(cat(features))))`` under ``torch.utils.checkpoint`` (non-reentrant)."""
    calls = []

    def bottleneck(*inputs):
        x = torch.cat(inputs, 1)
        y = (_norm_act_again(norm, x, activation) if calls
             else _norm_act(norm, x, activation))
        calls.append(None)
        return conv(y)

    return checkpoint(bottleneck, *features, use_reentrant=False)


def _hooked(*modules):
    """Whether a forward or backward hook is registered on one of ``modules`` (``None``: none)
    or on every module (``torch.nn.modules.module.register_module_*_hook``).

    The memory-efficient routes compute a norm and a convolution without calling them as
    modules, so their hooks would never run; a step with hooks on them calls the modules as
    the naive implementation does (storing that step's concatenation), and the hooks see
    what they see there."""
    if (module_globals._global_forward_pre_hooks or module_globals._global_forward_hooks
            or module_globals._global_backward_pre_hooks
            or module_globals._global_backward_hooks):
        return True
    return any(m is not None and bool(m._forward_pre_hooks or m._forward_hooks
                                      or m._backward_pre_hooks or m._backward_hooks)
               for m in modules)


class _Route:
    """How one network computes its ``concat -> norm -> act -> conv`` steps (its ``impl``),
    and the ``activation`` that follows its torch batch norms. ``chunk_channels``: the most
    channels the one storage of ``"shared_inplace"`` holds at a time."""

    def __init__(self, impl, activation, chunk_channels):
        self.impl = impl
        self.activation = activation
        self.chunk_channels = chunk_channels
        self.storages = {"shared": SharedStorages,
                         "shared_inplace": SharedStorage}.get(impl, lambda: None)()

    def _shares(self, impl):
        """Whether this route computes through ``impl``'s shared storage now (not while the
        model is exported, which records the plain operations)."""
        return self.impl == impl and not exporting()

    def norm_act(self, norm, x):
        """``act(norm(x))`` (:func:`_norm_act` with this network's activation)."""
        return _norm_act(norm, x, self.activation)

    def concat_norm_act_conv(self, features, norm, conv, checkpointed=False):
        """``conv(act(norm(cat(features))))``; ``checkpointed`` marks a dense layer's bottleneck.
        With hooks on ``norm`` or ``conv`` it calls them as modules (:func:`_hooked`)."""
        hooked = _hooked(norm, conv)
        if self._shares("shared") and not hooked:
            return concat_norm_act_conv(features, self.storages, norm, conv,
                                        activation=self.activation.name,
                                        activation_param=self.activation.param)
        if self._shares("shared_inplace") and not hooked:
            return shared_inplace.concat_norm_act_conv(features, self.storages, norm, conv,
                                                       self._chunk(features[0]))
        if (checkpointed and self.impl == "checkpoint" and not exporting() and not hooked
                and any(f.requires_grad for f in features)):
            return _checkpointed(features, norm, conv, self.activation)
        x = features[0] if len(features) == 1 else torch.cat(features, 1)
        return conv(self.norm_act(norm, x))

    def norm_act_conv(self, x, norm, conv):
        """``conv(act(norm(x)))`` of a convolution output ``x``; InPlace-ABN runs in place."""
        if isinstance(norm, InPlaceABN):
            return conv(norm(x))
        return self.concat_norm_act_conv([x], norm, conv)

    def pools_in_storage(self, norm):
        """Whether the final ``norm`` + activation + global pooling go through the storage."""
        return norm is not None and self._shares("shared_inplace") and not _hooked(norm)

    def norm_act_pool(self, features, norm):
        """``act(norm(cat(features)))`` averaged over space, ``(N, C)``, in the storage."""
        return shared_inplace.concat_norm_act_pool(features, self.storages, norm,
                                                   self._chunk(features[0]))

    def _chunk(self, like):
        """Channels of ``like``'s maps the one storage takes at a time: ``chunk_channels``, or
        as many as fit in the room reserved for them at a larger resolution (an earlier
        block's), so that smaller maps take fewer, wider chunks at no cost in memory."""
        n, _, *spatial = like.shape
        fits = self.storages.capacity(like) // max(1, n * math.prod(spatial))
        return max(self.chunk_channels, fits)

    def reserve(self, batch, channels, spatial, like):
        """Size the shared storages once for a whole block whose widest concatenation or
        bottleneck has ``channels`` channels (no-op for the other impls)."""
        if self.storages is None or exporting():
            return
        if self.impl == "shared_inplace":
            channels = min(channels, self.chunk_channels)
        self.storages.reserve(batch * channels * spatial, like)


# --------------------------------------------------------------------------- modules
class _DenseLayer(nn.Module):
    """One bottleneck layer: ``BN-act-conv1x1-BN-act-conv3x3`` (pre-activation) or
    ``conv1x1-BN-act-conv3x3-BN-act`` (post-activation) of the concatenated features."""

    def __init__(self, num_input_features, growth_rate, bn_size, drop_rate, norm, preact,
                 route):
        super().__init__()
        width = bn_size * growth_rate
        conv1 = nn.Conv2d(num_input_features, width, kernel_size=1, stride=1, bias=False)
        conv2 = nn.Conv2d(width, growth_rate, kernel_size=3, stride=1, padding=1, bias=False)
        act = route.activation
        if preact:
            self.norm1 = _make_norm(norm, num_input_features, False, act)
            self.conv1 = conv1
            self.norm2 = _make_norm(norm, width, True, act)
            self.conv2 = conv2
        else:
            self.conv1 = conv1
            self.norm1 = _make_norm(norm, width, True, act)
            self.conv2 = conv2
            self.norm2 = _make_norm(norm, growth_rate, True, act)
        self.drop_rate = float(drop_rate)
        self.preact = preact
        self.route = route

    def forward(self, features):
        route = self.route
        if self.preact:
            bottleneck = route.concat_norm_act_conv(features, self.norm1, self.conv1,
                                                    checkpointed=True)
            new_features = route.norm_act_conv(bottleneck, self.norm2, self.conv2)
        else:
            bottleneck = route.concat_norm_act_conv(features, None, self.conv1,
                                                    checkpointed=True)
            new_features = route.norm_act(self.norm2,
                                          route.norm_act_conv(bottleneck, self.norm1, self.conv2))
        if self.drop_rate > 0:
            new_features = F.dropout(new_features, p=self.drop_rate, training=self.training)
        return new_features


class _DenseBlock(nn.ModuleDict):
    """``num_layers`` dense layers; takes a tensor, returns the list of all its features."""

    def __init__(self, num_layers, num_input_features, bn_size, growth_rate, drop_rate, norm,
                 preact, route):
        super().__init__()
        for i in range(num_layers):
            self.add_module(f"denselayer{i + 1}", _DenseLayer(
                num_input_features + i * growth_rate, growth_rate, bn_size, drop_rate, norm,
                preact, route))
        self.num_output_features = num_input_features + num_layers * growth_rate
        self.widest = max(self.num_output_features, bn_size * growth_rate)
        self.route = route

    def forward(self, init_features):
        # Room for the widest concatenation (the block output, read by the transition) or
        # bottleneck, so that the storages are allocated once and not grown layer by layer.
        n, _, h, w = init_features.shape
        self.route.reserve(n, self.widest, h * w, init_features)
        features = [init_features]
        for layer in self.values():
            features.append(layer(features))
        return features


class _Transition(nn.Module):
    """``BN-act-conv1x1-avgpool`` (pre-activation) or ``conv1x1-BN-act-avgpool`` of a block's
    features, reducing the channels to ``num_output_features``."""

    def __init__(self, num_input_features, num_output_features, norm, preact, route):
        super().__init__()
        conv = nn.Conv2d(num_input_features, num_output_features, kernel_size=1, stride=1,
                         bias=False)
        if preact:
            self.norm = _make_norm(norm, num_input_features, False, route.activation)
            self.conv = conv
        else:
            self.conv = conv
            self.norm = _make_norm(norm, num_output_features, True, route.activation)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)
        self.preact = preact
        self.route = route

    def forward(self, features):
        if self.preact:
            out = self.route.concat_norm_act_conv(features, self.norm, self.conv)
        else:
            out = self.route.norm_act(self.norm,
                                      self.route.concat_norm_act_conv(features, None, self.conv))
        return self.pool(out)


def _stem(num_init_features, small_inputs, norm, preact, activation):
    """The first layers: a 3x3 convolution for 32x32 inputs (plus BN-act if post-activation),
    torchvision's ``conv7x7/2 - BN - ReLU - maxpool3x3/2`` otherwise.

    With ``norm="bn"`` the activation is a module after ``norm0``: torchvision's ``relu0``, or
    ``act0`` for another activation (none for the identity); it has no state.
    """
    if small_inputs:
        layers = [("conv0", nn.Conv2d(3, num_init_features, kernel_size=3, stride=1, padding=1,
                                      bias=False))]
    else:
        layers = [("conv0", nn.Conv2d(3, num_init_features, kernel_size=7, stride=2, padding=3,
                                      bias=False))]
    if not small_inputs or not preact:
        layers.append(("norm0", _make_norm(norm, num_init_features, True, activation)))
        module = activation.module() if norm == "bn" else None
        if module is not None:
            layers.append(("relu0" if activation.name == "relu" else "act0", module))
    if not small_inputs:
        layers.append(("pool0", nn.MaxPool2d(kernel_size=3, stride=2, padding=1)))
    return layers


class _Features(nn.Sequential):
    """The feature extractor of a :class:`DenseNet`: stem, dense blocks, transitions and the
    final norm, callable on its own (``model.features(x)``) as torchvision's.

    A dense block returns the list of its feature maps (the memory-efficient implementations
    concatenate them only where a layer reads them); a module that is not a transition gets
    their concatenation, and so does the caller: the result is always one tensor.
    """

    def forward(self, x, final_norm=True):
        """The final feature map; without ``final_norm``, what the final norm of a
        pre-activation network would take: the list of the last block's feature maps."""
        out = x
        for name, module in self.named_children():
            if name == "norm5" and not final_norm:
                return out
            if isinstance(out, list) and not isinstance(module, (_DenseBlock, _Transition)):
                out = torch.cat(out, 1)  # the final norm (pre-activation networks)
            out = module(out)
        return torch.cat(out, 1) if isinstance(out, list) else out


# --------------------------------------------------------------------------- validation
def _check_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def _check_activation(norm, activation, activation_param):
    """The network's :class:`_Activation`: ``activation`` (``None``: ``norm``'s default)."""
    if activation is None:
        activation = DEFAULT_ACTIVATIONS[norm]
    allowed = ALLOWED_ACTIVATIONS[norm]
    if not isinstance(activation, str) or activation not in allowed:
        reason = ""
        if isinstance(activation, str) and activation in functional.ACTIVATIONS:
            reason = (f" with norm={norm!r}: its in-place layers need an invertible "
                      "activation")
        raise ValueError(f"activation={activation!r} is not supported{reason}; "
                         f"allowed: {', '.join(allowed)}")
    _, param = functional.check_activation(activation, activation_param, inplace=norm != "bn")
    if activation == "leaky_relu" and not param >= 0:
        # the kernels and torch's in-place backward take the derivative from the output's sign
        raise ValueError(f"activation_param={activation_param!r} for leaky_relu: the slope "
                         "must be >= 0")
    return _Activation(activation, param)


def _check_arguments(growth_rate, block_config, num_init_features, bn_size, compression,
                     num_classes, small_inputs, impl, norm, preact, drop_rate):
    _check_int("growth_rate", growth_rate)
    if (not isinstance(block_config, Sequence) or not block_config
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                   for n in block_config)):
        raise ValueError(f"block_config={block_config!r} must be a non-empty sequence of "
                         "integers >= 1 (layers per dense block)")
    _check_int("num_init_features", num_init_features)
    _check_int("bn_size", bn_size)
    _check_int("num_classes", num_classes)
    if not 0 < compression <= 1:
        raise ValueError(f"compression={compression!r} must lie in (0, 1]")
    if not 0 <= drop_rate < 1:
        raise ValueError(f"drop_rate={drop_rate!r} must lie in [0, 1)")
    functional.check_choice("impl", impl, IMPLS)
    functional.check_choice("norm", norm, NORMS)
    if impl in INPLACE_IMPLS and norm == "bn":
        raise ValueError(f"impl={impl!r} normalizes in place: it needs norm='iabn' or "
                         f"'iabn_sync', not norm={norm!r} (use impl='shared' for nn.BatchNorm2d)")
    for name, value in (("small_inputs", small_inputs), ("preact", preact)):
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r} must be True or False")


# --------------------------------------------------------------------------- the network
class DenseNet(nn.Module):
    r"""DenseNet-BC (bottleneck layers, compressed transitions).

    Args:
        growth_rate: feature maps each layer adds (``k``).
        block_config: number of layers of each dense block.
        num_init_features: output channels of the first convolution.
        bn_size: the bottleneck has ``bn_size * growth_rate`` channels.
        compression: a transition keeps ``floor(compression * C)`` of its ``C`` channels.
        num_classes: outputs of the classifier.
        small_inputs: 32x32 stem (3x3 convolution, no pooling) instead of the ImageNet one.
        impl: ``"naive"``, ``"shared"`` (memory-efficient, the default), ``"shared_inplace"``
            (one shared storage, in place: ``norm="iabn"`` or ``"iabn_sync"``) or
            ``"checkpoint"``.
        norm: ``"bn"`` (``nn.BatchNorm2d`` + activation), ``"iabn"`` (InPlace-ABN) or
            ``"iabn_sync"`` (InPlace-ABN synchronised over the default process group).
        preact: pre-activation (``BN-act-conv``, the default) or post-activation layers.
        drop_rate: dropout after each dense layer.
        activation: ``"relu"`` (the default for ``norm="bn"``: torchvision's network),
            ``"leaky_relu"`` (the default for the in-place norms), ``"elu"`` or
            ``"identity"``; the in-place norms refuse ``"relu"``, which cannot be inverted.
        activation_param: the leaky-ReLU slope (default 0.01, must be >= 0, > 0 in place) or
            the ELU alpha (default 1, > 0).
    """

    def __init__(self, growth_rate, block_config, num_init_features, bn_size=4, compression=0.5,
                 num_classes=1000, small_inputs=False, impl="shared", norm="bn", preact=True,
                 drop_rate=0, activation=None, activation_param=None):
        _check_arguments(growth_rate, block_config, num_init_features, bn_size, compression,
                         num_classes, small_inputs, impl, norm, preact, drop_rate)
        act = _check_activation(norm, activation, activation_param)
        super().__init__()
        self.impl, self.norm, self.preact = impl, norm, preact
        self.activation, self.activation_param = act.name, act.param
        self._route = _Route(impl, act, chunk_channels=bn_size * growth_rate)

        self.features = _Features(OrderedDict(
            _stem(num_init_features, small_inputs, norm, preact, act)))
        num_features = num_init_features
        for i, num_layers in enumerate(block_config):
            block = _DenseBlock(num_layers, num_features, bn_size, growth_rate, drop_rate, norm,
                                preact, self._route)
            self.features.add_module(f"denseblock{i + 1}", block)
            num_features = block.num_output_features
            if i != len(block_config) - 1:
                num_output_features = max(1, math.floor(num_features * compression))
                self.features.add_module(f"transition{i + 1}", _Transition(
                    num_features, num_output_features, norm, preact, self._route))
                num_features = num_output_features
        if preact:  # the last block's features are not normalized yet
            self.features.add_module("norm5", _make_norm(norm, num_features, False, act))
        self.classifier = nn.Linear(num_features, num_classes)
        self._initialize()

    def _initialize(self):
        """torchvision's initialization: He-normal convolutions, BN (1, 0), zero linear bias."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
            elif isinstance(m, NORM_TYPES):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.constant_(m.bias, 0)

    def extra_repr(self):
        # the torch batch norms do not show the activation that follows them
        return (f"impl={self.impl}, norm={self.norm}, preact={self.preact}, "
                f"activation={self.activation}, activation_param={self.activation_param}")

    def shared_storage_bytes(self):
        """Bytes held by the shared storages (0 unless ``impl`` is a shared one)."""
        storages = self._route.storages
        return 0 if storages is None else storages.nbytes

    def forward(self, x):
        final_norm = getattr(self.features, "norm5", None)
        if self._route.pools_in_storage(final_norm):
            return self.classifier(self._route.norm_act_pool(
                self.features(x, final_norm=False), final_norm))
        out = self.features(x)
        if self.preact and self.norm == "bn":  # the final BN's activation, as torchvision's
            out = self._route.activation(out)
        out = torch.flatten(F.adaptive_avg_pool2d(out, (1, 1)), 1)
        return self.classifier(out)


# --------------------------------------------------------------------------- entry points
def densenet_bc(depth, growth_rate, num_classes=10, **kwargs):
    """DenseNet-BC-``depth`` for 32x32 inputs (CIFAR): three blocks of ``(depth - 4) / 6``
    bottleneck layers, ``2 * growth_rate`` initial features, compression 0.5.

    ``depth`` counts the convolutions and the classifier (two per dense layer, the first one,
    two transitions, the classifier), so it must be ``6n + 4`` (40, 100, 190, 250, ...).
    Other keyword arguments go to :class:`DenseNet`.
    """
    _check_int("depth", depth, minimum=10)
    if (depth - 4) % 6:
        raise ValueError(f"depth={depth!r} must be of the form 6n + 4 with n >= 1 "
                         "(e.g. 40, 100, 190, 250)")
    n = (depth - 4) // 6
    return DenseNet(growth_rate, (n, n, n), 2 * growth_rate, num_classes=num_classes,
                    small_inputs=True, **kwargs)


def _imagenet(growth_rate, block_config, **kwargs):
    return DenseNet(growth_rate, block_config, 2 * growth_rate, **kwargs)


def densenet121(**kwargs):
    """DenseNet-121 (k=32, blocks 6-12-24-16), ImageNet."""
    return _imagenet(32, (6, 12, 24, 16), **kwargs)


def densenet169(**kwargs):
    """DenseNet-169 (k=32, blocks 6-12-32-32), ImageNet."""
    return _imagenet(32, (6, 12, 32, 32), **kwargs)


def densenet201(**kwargs):
    """DenseNet-201 (k=32, blocks 6-12-48-32), ImageNet."""
    return _imagenet(32, (6, 12, 48, 32), **kwargs)


def densenet161(**kwargs):
    """DenseNet-161 (k=48, blocks 6-12-36-24), ImageNet."""
    return _imagenet(48, (6, 12, 36, 24), **kwargs)


def densenet232(growth_rate=48, **kwargs):
    """DenseNet-232 (k=48, blocks 6-12-48-48), ImageNet: a deep model of Pleiss et al.

    Their footnote 10 prints blocks 6-32-48-48, but that network has 273 layers and 71.5M
    parameters; 6-12-48-48 has the stated 232 layers (counted as for DenseNet-264) and the
    stated 55M parameters (55.6M). ``growth_rate`` other than 48 gives the same layout at
    another width (small values: cheap test networks).
    """
    return _imagenet(growth_rate, (6, 12, 48, 48), **kwargs)


def densenet264(growth_rate=32, **kwargs):
    """DenseNet-264 (blocks 6-12-64-48; k=32, or k=48 as Pleiss et al.'s largest), ImageNet.

    The blocks of Huang et al.'s DenseNet-264; they give Pleiss et al.'s 33M (k=32: 33.3M) and
    73M (k=48: 72.7M) parameters, which their footnote's 6-32-64-48 (41.3M, 90.5M) does not.
    """
    return _imagenet(growth_rate, (6, 12, 64, 48), **kwargs)


# --------------------------------------------------------------------------- torchvision weights
#: A dense layer's key in torchvision's released checkpoints: ``denselayerN.norm.1.weight``
#: where the module is now ``denselayerN.norm1`` (torchvision's ``_load_state_dict`` pattern,
#: plus ``num_batches_tracked``, which checkpoints saved since PyTorch 0.4.1 have).
_LEGACY_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\."
    r"((?:[12])\.(?:weight|bias|running_mean|running_var|num_batches_tracked))$"
)


def torchvision_state_dict(state_dict):
    """``state_dict`` with torchvision's legacy DenseNet keys renamed, as a new dict.

    torchvision's released DenseNet checkpoints (``densenet121-a639ec97.pth`` and the others)
    name a dense layer's modules ``norm.1``, ``conv.1``, ``norm.2``, ``conv.2``; the modules are
    ``norm1``, ``conv1``, ``norm2``, ``conv2`` here and in torchvision's current code, which
    renames the keys on loading with this regular expression. Other keys are kept; the tensors
    are not copied, and ``state_dict`` is not modified.
    """
    renamed = OrderedDict()
    for key, value in state_dict.items():
        match = _LEGACY_KEY.match(key)
        renamed[match.group(1) + match.group(2) if match else key] = value
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        renamed._metadata = OrderedDict(
            (_LEGACY_KEY.sub(r"\1\2", prefix + ".weight")[:-len(".weight")]
             if prefix else prefix, value)
            for prefix, value in metadata.items())
    return renamed


def load_torchvision_state_dict(model, state_dict, strict=True):
    """Load a torchvision DenseNet checkpoint (legacy or current key names) into ``model``.

    ``model`` is a :class:`DenseNet` of the same architecture (e.g. ``densenet121()`` for
    ``densenet121-a639ec97.pth``), any ``impl``; ``state_dict`` the checkpoint's dict, e.g.
    ``torch.load(path, weights_only=True)`` or ``torchvision.models.DenseNet121_Weights.DEFAULT
    .get_state_dict()``. Checkpoints saved before PyTorch 0.4.1 have no
    ``num_batches_tracked``: each norm keeps its own count (0 in a new model), as
    ``nn.BatchNorm2d`` does. Only ``norm="bn"``,
    ``preact=True`` with the default ``activation="relu"`` computes torchvision's function;
    other models take the weights with their own activation (and, with ``scale_mode="abs"``,
    the scale ``|weight| + eps``).
    Returns ``model.load_state_dict``'s result (missing and unexpected keys).
    """
    if not isinstance(model, DenseNet):
        raise TypeError(f"model must be a layers.densenet.DenseNet, got {type(model).__name__}")
    return model.load_state_dict(torchvision_state_dict(state_dict), strict=strict)


__all__ = ["DenseNet", "densenet_bc", "densenet121", "densenet169", "densenet201",
           "densenet161", "densenet232", "densenet264", "load_torchvision_state_dict",
           "torchvision_state_dict", "IMPLS", "INPLACE_IMPLS", "NORMS", "ALLOWED_ACTIVATIONS",
           "DEFAULT_ACTIVATIONS"]
