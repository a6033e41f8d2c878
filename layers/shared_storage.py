"""Shared memory storages and the recomputing ``concat -> BN -> activation -> conv`` operation.

This is §4 of Pleiss et al. (2017), "Memory-Efficient Implementation of DenseNets". A dense
layer reads the concatenation of all earlier feature maps, normalizes it and convolves it.
Stored per layer, the concatenation and the normalized copy grow quadratically with depth.
Here both go into two buffers (:class:`SharedStorages`) that every layer of a network
overwrites in turn: "Shared Memory Storage 1" takes the concatenation and "Shared Memory
Storage 2" the BN + activation output. :func:`concat_norm_act_conv` computes
``conv(act(BN(cat(features))))`` as a single autograd function that saves only

* the input feature maps (convolution outputs that persist anyway, so no new memory),
* the convolution weight and the normalization's parameters,
* a (6, C) float64 per-channel state (batch statistics, scale, shift).

Its backward concatenates and normalizes again into the same two storages, using the stored
statistics (the running statistics are updated once, in forward), and only then runs the
convolution and normalization backwards. The convolution runs inside the function so that
autograd never keeps a view of a storage that a later layer overwrites.

The storages are scratch space: each call fills them and uses them before it returns, so any
call order of forward and backward passes is correct. Two threads must not run the same
network on the same device at once.
"""
import dataclasses
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .abn import ABN, batch_norm_arguments, count_batch
from .functional import (BackwardSpec, apply_coefficients, check_activation, check_arguments,
                         input_names, needs_input_grad, normalize_activate_backward,
                         normalize_activate_into, once_differentiable, reapply_into)
from .kernels import common


class SharedStorage:
    """One growing buffer per device, handed out as tensors of any shape (contents not kept).

    A device's buffer is reallocated only when a request needs more elements than it holds, or
    another dtype. One buffer per device lets ``nn.DataParallel`` replicas, which share this
    object, run side by side on their own devices.
    """

    def __init__(self):
        self._buffers = {}

    @property
    def nbytes(self):
        """Bytes currently allocated, over all devices (0 before the first use)."""
        return sum(buffer.nbytes for buffer in self._buffers.values())

    def capacity(self, like):
        """Elements of ``like``'s dtype the buffer on ``like``'s device holds (0 if none)."""
        buffer = self._buffers.get(like.device)
        return 0 if buffer is None or buffer.dtype != like.dtype else buffer.numel()

    def reserve(self, numel, like):
        """Make room for ``numel`` elements of ``like``'s dtype on ``like``'s device."""
        buffer = self._buffers.get(like.device)
        if buffer is None or buffer.numel() < numel or buffer.dtype != like.dtype:
            self._buffers.pop(like.device, None)  # free the old buffer before allocating
            self._buffers[like.device] = torch.empty(numel, dtype=like.dtype,
                                                     device=like.device)

    def view(self, shape, like):
        """A tensor of ``shape`` at the start of the buffer (uninitialised), laid out as
        ``like``: channels-last if ``like`` is a channels-last 4-D tensor, else contiguous,
        so that a network run in ``torch.channels_last`` never converts layouts."""
        numel = math.prod(shape)
        self.reserve(numel, like)
        flat = self._buffers[like.device][:numel]
        if _is_channels_last(like):
            n, c, h, w = shape
            return flat.view(n, h, w, c).permute(0, 3, 1, 2)
        return flat.view(shape)


def _is_channels_last(x):
    """Whether ``x`` is laid out channels-last (and not also contiguous, as when C = 1)."""
    return (x.dim() == 4 and not x.is_contiguous()
            and x.is_contiguous(memory_format=torch.channels_last))


class SharedStorages:
    """The pair of storages of one network: ``concat`` (storage 1), ``normalized`` (storage 2).

    Owned by the network as a plain attribute: it is no parameter or buffer, so it is not in
    the state dict, and it lives on whatever device the inputs come from.
    """

    def __init__(self):
        self.concat = SharedStorage()
        self.normalized = SharedStorage()

    @property
    def nbytes(self):
        """Bytes of both storages."""
        return self.concat.nbytes + self.normalized.nbytes

    def reserve(self, numel, like):
        """Size both storages for ``numel`` elements at once (e.g. a whole dense block)."""
        self.concat.reserve(numel, like)
        self.normalized.reserve(numel, like)


@dataclasses.dataclass(frozen=True)
class _NormSpec:
    """The non-tensor arguments of the normalization + activation of one call."""

    training: bool
    momentum: float
    eps: float
    act: int
    slope: float
    scale_mode: str
    group: object = None


def norm_activation(norm, activation="relu", activation_param=None):
    """``(kernel code, parameter, scale_mode)`` of a normalization module's activation.

    A torch batch norm (``nn.BatchNorm2d``, ``nn.SyncBatchNorm``) is followed by
    ``activation`` with ``activation_param`` (default ReLU, DenseNet's own choice; any
    activation of :class:`~layers.ABN`, a leaky-ReLU slope >= 0) and has the standard scale;
    an :class:`~layers.ABN` carries its activation and scale parametrization, and the two
    arguments are ignored.
    """
    if isinstance(norm, ABN):
        act, slope = check_activation(norm.activation, norm.activation_param, inplace=False)
        return act, slope, norm.scale_mode
    act, slope = check_activation(activation, activation_param, inplace=False)
    if activation == "leaky_relu" and not slope >= 0:
        # the backward kernels take the activation's derivative from the sign of its output
        raise ValueError(f"activation_param={activation_param!r} for leaky_relu: the slope "
                         "must be >= 0")
    return act, slope, "bn"


def norm_group(norm):
    """The process group ``norm`` synchronises its statistics over, or ``None``.

    The synchronised ABN layers name theirs; an ``nn.SyncBatchNorm`` (e.g. after
    ``nn.SyncBatchNorm.convert_sync_batchnorm``) synchronises over its ``process_group`` or
    the world, as its own forward does.
    """
    if isinstance(norm, ABN):
        return norm._group()
    if isinstance(norm, nn.SyncBatchNorm) and dist.is_available() and dist.is_initialized():
        return dist.group.WORLD if norm.process_group is None else norm.process_group
    return None


def norm_spec(norm, features, activation="relu", activation_param=None, accepted=None):
    """The spec and ``(running_mean, running_var)`` of ``norm`` for one call on the
    concatenation of ``features``.

    Refuses bad arguments first (the activation, ``features``, and the norm's per-channel
    tensors, ``eps`` and ``momentum`` against the concatenation:
    :func:`layers.functional.check_arguments`), then uses the module's own bookkeeping, as its
    forward would: in training it counts the batch in ``num_batches_tracked`` and picks the
    momentum (``None`` = cumulative average). So a refused call leaves every tensor as it was.
    ``accepted``: the verdict of a check the caller ran in a compiled graph, as
    :func:`layers.abn.count_batch` takes it.
    """
    act, slope, scale_mode = norm_activation(norm, activation, activation_param)
    training, running_mean, running_var, momentum = batch_norm_arguments(norm, count=False)
    group = norm_group(norm)
    check_arguments(*concatenation(features), norm.weight, norm.bias, running_mean, running_var,
                    training, norm.eps, momentum, group)
    count_batch(norm, accepted)
    spec = _NormSpec(training, momentum, norm.eps, act, slope, scale_mode, group)
    return spec, running_mean, running_var


def concatenation(features):
    """``(shape, dtype, device)`` of ``torch.cat(features, 1)``, refusing ``features`` that it
    cannot concatenate, before anything is written."""
    if not isinstance(features, (list, tuple)) or not features:
        raise ValueError("features must be a non-empty list of (N, C_i, *) tensors")
    first = features[0]
    for i, feature in enumerate(features):
        if not isinstance(feature, torch.Tensor):
            raise TypeError(f"features[{i}] is a {type(feature).__name__}, not a tensor")
        if (feature.dim() < 2 or feature.dim() != first.dim()
                or feature.shape[0] != first.shape[0] or feature.shape[2:] != first.shape[2:]
                or feature.dtype != first.dtype or feature.device != first.device):
            raise ValueError(
                f"features[{i}] ({tuple(feature.shape)}, {feature.dtype} on {feature.device}) "
                f"cannot be concatenated along channels with features[0] "
                f"({tuple(first.shape)}, {first.dtype} on {first.device})")
    return _concatenated_shape(features), first.dtype, first.device


def _concatenated_shape(features):
    first = features[0]
    return (first.shape[0], sum(f.shape[1] for f in features), *first.shape[2:])


def check_conv(conv, features):
    """Refuse a convolution that the shared routes cannot run on the concatenation of
    ``features``, before anything is written: one with a bias, groups or dilation, or whose
    input channels are not the concatenation's."""
    if conv.bias is not None or conv.groups != 1 or conv.dilation != (1, 1):
        raise ValueError("conv must be an nn.Conv2d with bias=False, groups=1, dilation=1")
    channels = concatenation(features)[0][1]
    if conv.in_channels != channels:
        raise ValueError(f"conv takes {conv.in_channels} input channels, but the features "
                         f"concatenate to {channels}")


def _concat(features, storages):
    """The concatenation of ``features`` in storage 1 (a single feature map is used as is)."""
    if len(features) == 1:
        return features[0]
    return torch.cat(features, 1, out=storages.concat.view(_concatenated_shape(features),
                                                          features[0]))


def conv_dtype(y):
    """The dtype ``F.conv2d`` computes in for input ``y``: the autocast dtype while autocast
    is on for ``y``'s device (it casts input and weight), else ``y``'s own."""
    device = y.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return y.dtype


def conv_grads(grad_out, y, weight, stride, padding, input_grad, weight_grad, dtype):
    """``(dy, dweight)`` of ``conv2d(y, weight)`` (no bias, dilation 1, one group) computed in
    ``dtype``, as the forward's convolution was; returned in ``y``'s and ``weight``'s dtypes.
    """
    dy, dweight, _ = torch.ops.aten.convolution_backward(
        grad_out.to(dtype), y.to(dtype), weight.to(dtype), None, stride, padding, (1, 1),
        False, (0, 0), 1, [input_grad, weight_grad, False])
    return (None if dy is None else dy.to(y.dtype),
            None if dweight is None else dweight.to(weight.dtype))


class _ConcatNormActConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, storages, spec, stride, padding, conv_weight, norm_weight, norm_bias,
                running_mean, running_var, *features):
        x = _concat(features, storages)
        channel = None
        y = x
        if spec is not None:
            y = storages.normalized.view(x.shape, x)
            channel = normalize_activate_into(
                x, y, norm_weight, norm_bias, running_mean, running_var, spec.training,
                spec.momentum, spec.eps, spec.act, spec.slope, spec.scale_mode, spec.group)
            ctx.backward_spec = BackwardSpec.of(common.MODE_XHAT_FROM_X, spec.act, spec.slope,
                                                spec.training, spec.group, norm_weight,
                                                norm_bias)
        ctx.storages, ctx.stride, ctx.padding = storages, stride, padding
        ctx.conv_dtype = conv_dtype(y)
        ctx.save_for_backward(conv_weight, norm_weight, norm_bias, channel, *features)
        return F.conv2d(y, conv_weight, None, stride, padding)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        conv_weight, norm_weight, norm_bias, channel, *features = ctx.saved_tensors
        needs = needs_input_grad(ctx, _CONCAT_NORM_ACT_CONV_INPUTS)
        feature_grad = any(needs["features"])
        norm_grad = channel is not None and (needs["norm_weight"] or needs["norm_bias"])
        x = _concat(features, ctx.storages)  # recomputed into storage 1
        y = x
        if channel is not None:  # recomputed into storage 2, running statistics untouched
            spec = ctx.backward_spec
            y = ctx.storages.normalized.view(x.shape, x)
            reapply_into(x, y, apply_coefficients(channel, x.dtype), spec.act, spec.slope)
        dy, dconv = conv_grads(grad_out, y, conv_weight, ctx.stride, ctx.padding,
                                feature_grad or norm_grad, needs["conv_weight"], ctx.conv_dtype)
        dnorm_weight = dnorm_bias = None
        dx = dy
        if channel is not None and dy is not None:
            dx, dnorm_weight, dnorm_bias = normalize_activate_backward(  # dy is ours
                y, dy, x, channel, ctx.backward_spec, input_grad=feature_grad, dz_owned=True)
        dfeatures = (dx.split([f.shape[1] for f in features], 1) if feature_grad
                     else (None,) * len(features))
        return (None, None, None, None, dconv, dnorm_weight if needs["norm_weight"] else None,
                dnorm_bias if needs["norm_bias"] else None, None, None, *dfeatures)


_CONCAT_NORM_ACT_CONV_INPUTS = input_names(_ConcatNormActConv.forward)


def concat_norm_act_conv(features, storages, norm, conv, activation="relu",
                         activation_param=None):
    """``conv(act(norm(torch.cat(features, 1))))`` through the shared ``storages``.

    ``features`` is a list of ``(N, C_i, H, W)`` tensors; ``norm`` an ``nn.BatchNorm2d``
    (followed by ``activation`` with ``activation_param``, ReLU by default: see
    :func:`norm_activation`), an :class:`~layers.ABN` (its own activation; an ``InPlaceABN`` is
    computed out of place here) or ``None`` (``conv(cat(features))``); ``conv`` an
    ``nn.Conv2d`` without bias, groups or dilation. The running statistics are updated once,
    as the modules' own forward would; the result and every gradient equal the composite's.
    A synchronised norm (``ABNSync``, ``InPlaceABNSync``, ``nn.SyncBatchNorm``) combines the
    statistics and the backward reductions over its process group (:func:`norm_group`).
    Every refusal comes before anything but the scratch storages is written.
    """
    check_conv(conv, features)
    spec, running_mean, running_var = ((None, None, None) if norm is None
                                       else norm_spec(norm, features, activation,
                                                      activation_param))
    norm_weight = None if norm is None else norm.weight
    norm_bias = None if norm is None else norm.bias
    return _ConcatNormActConv.apply(storages, spec, conv.stride, conv.padding, conv.weight,
                                    norm_weight, norm_bias, running_mean, running_var,
                                    *features)


__all__ = ["SharedStorage", "SharedStorages", "concat_norm_act_conv", "norm_activation",
           "norm_group"]
