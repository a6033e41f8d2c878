"""One shared storage, used in place: the memory-efficient DenseNet with InPlace-ABN.

Pleiss et al. (2017) keep two storages shared by all layers of a network: "Shared Memory
Storage 1" for the concatenation and "Shared Memory Storage 2" for its BN + activation output,
which the bottleneck convolution reads (:mod:`layers.shared_storage`). With an in-place
activated batch norm (Rota Bulò et al. 2018) the second is not needed: the concatenation is
normalized and activated in place in storage 1, the convolution reads it there, and in backward
both the convolution's backward (its weight gradient) and InPlace-ABN's backward (which
recovers what it needs from the activated output, Algorithm 2, variant II) read that same
buffer.

The storage need not hold the whole concatenation either. Batch norm and the activation act
channel by channel, and a convolution sums over its input channels, so for any split of the
concatenated channels into consecutive chunks ``c_1 .. c_m``

    ``conv(act(BN(cat(features))), W) = sum_j conv(act(BN(cat(features)[:, c_j])), W[:, c_j])``.

Each chunk is concatenated into the storage, normalized and activated in place there, and
convolved with its slice of the weight; the partial outputs are summed. The storage holds one
chunk of at most ``chunk_channels`` channels (the DenseNet passes its bottleneck width,
``bn_size * growth_rate``: no more than one bottleneck output), where the two-storage method
needs two buffers of the widest concatenation (the input of the last transition of a block).
The final BN + activation + global average pooling of a pre-activation network take the same
route (:func:`concat_norm_act_pool`), so the last block's concatenation and its normalized
copy are not kept either.

A call saves only the input feature maps (convolution outputs that persist anyway), the
parameters and a (3, C) float64 per-channel ``[mean, rstd, count]``; the scale and shift are
rebuilt from the weight and bias in backward. Backward goes chunk by chunk: concatenate again,
apply the stored statistics in place (the running statistics were updated once, in forward),
run the convolution's (or the pooling's) backward and then InPlace-ABN's. The results and every
gradient equal the composite's up to rounding (the sums over chunks are added in another
order). Synchronised norms combine the statistics and the backward reductions over their
process group, chunk by chunk.

As for the in-place layers, the scale must be invertible: with ``scale_mode="bn"`` a
differentiable call whose ``|weight| < eps`` in some channel is refused (checked on the host,
one synchronisation on CUDA; ``scale_mode="abs"``, the default, needs no check). The storage is
scratch space, as in :mod:`layers.shared_storage`: any order of forward and backward calls is
correct, but two threads must not run the same network on the same device at once.
"""
import torch
import torch.nn.functional as F

from .functional import (BackwardSpec, apply_coefficients, check_activation,
                         check_scale_where_readable, input_names, needs_input_grad,
                         normalize_activate_backward, normalize_activate_into,
                         once_differentiable, reapply_into, scale_and_shift)
from .kernels import common
from .shared_storage import check_conv, conv_dtype, conv_grads, norm_spec

#: Rows of the full per-channel state (:func:`layers.functional.normalize_activate_into`)
#: that a call saves: ``[mean, rstd, count]``; ``[gamma, beta, dgamma_dweight]`` are rebuilt.
_SAVED_ROWS = slice(3, 6)


def chunk_plan(channels, chunk_channels):
    """Split the concatenation of feature maps with ``channels`` channels each into consecutive
    chunks of at most ``chunk_channels`` channels.

    Returns a tuple of chunks, each a tuple of ``(feature index, start, stop)`` channel ranges
    of the features it takes, in order; a feature wider than the room left in a chunk
    continues in the next.
    """
    if isinstance(chunk_channels, bool) or not isinstance(chunk_channels, int) \
            or chunk_channels < 1:
        raise ValueError(f"chunk_channels={chunk_channels!r} must be an integer >= 1")
    chunks, current, room = [], [], chunk_channels
    for index, count in enumerate(channels):
        start = 0
        while start < count:
            take = min(count - start, room)
            current.append((index, start, start + take))
            start, room = start + take, room - take
            if room == 0:
                chunks.append(tuple(current))
                current, room = [], chunk_channels
    if current:
        chunks.append(tuple(current))
    return tuple(chunks)


def _bounds(plan):
    """``[(lo, hi), ...]``: each chunk's channel range in the concatenation."""
    bounds, lo = [], 0
    for chunk in plan:
        hi = lo + sum(stop - start for _, start, stop in chunk)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _fill(storage, features, chunk, writable):
    """A chunk's concatenated channels: a view of ``storage`` they are copied into, or, when it
    is one whole feature map and need not be ``writable``, that feature map itself."""
    (index, start, stop), *rest = chunk
    first = features[index]
    if not rest and not writable and (start, stop) == (0, first.shape[1]):
        return first
    width = sum(b - a for _, a, b in chunk)
    out = storage.view((first.shape[0], width, *first.shape[2:]), first)
    torch.cat([features[i][:, a:b] for i, a, b in chunk], 1, out=out)
    return out


def _part(tensor, lo, hi):
    return None if tensor is None else tensor[lo:hi]


class _ConvHead:
    """``conv2d(y, weight)`` (no bias, dilation 1, one group), summed over the chunks of ``y``'s
    channels in float32 at least (16-bit partial outputs under autocast are not rounded
    between chunks)."""

    def __init__(self, stride, padding):
        self.stride, self.padding = stride, padding

    def add(self, total, y, weight, lo, hi):
        part = F.conv2d(y, weight[:, lo:hi], None, self.stride, self.padding)
        if total is None:
            return part.to(torch.promote_types(part.dtype, torch.float32))
        return total.add_(part)

    def finish(self, total, y):
        dtype = conv_dtype(y)  # the dtype F.conv2d computed in (autocast's, or y's)
        return total.to(dtype)

    def backward(self, grad_out, y, weight, lo, hi, dtype, input_grad, weight_grad):
        return conv_grads(grad_out, y, weight[:, lo:hi], self.stride, self.padding, input_grad,
                          weight_grad, dtype)


class _PoolHead:
    """Global average pooling: ``y.mean((2, 3))``, each chunk filling its own columns."""

    def add(self, total, y, weight, lo, hi):
        pooled = y.mean(tuple(range(2, y.dim())))
        if total is None:
            total = []
        total.append(pooled)
        return total

    def finish(self, total, y):
        return torch.cat(total, 1)

    def backward(self, grad_out, y, weight, lo, hi, dtype, input_grad, weight_grad):
        if not input_grad:
            return None, None
        spatial = y[0, 0].numel()
        dy = (grad_out[:, lo:hi] / spatial).to(y.dtype)
        return dy.view(*dy.shape, *(1,) * (y.dim() - 2)).expand(y.shape), None


class _ChunkedNormActHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, storage, plan, head, spec, head_weight, norm_weight, norm_bias,
                running_mean, running_var, *features):
        total, states, y = None, [], None
        for chunk, (lo, hi) in zip(plan, _bounds(plan)):
            y = _fill(storage, features, chunk, writable=spec is not None)
            if spec is not None:  # in place in the storage; running statistics updated once
                channel = normalize_activate_into(
                    y, y, _part(norm_weight, lo, hi), _part(norm_bias, lo, hi),
                    _part(running_mean, lo, hi), _part(running_var, lo, hi), spec.training,
                    spec.momentum, spec.eps, spec.act, spec.slope, spec.scale_mode, spec.group)
                states.append(channel[_SAVED_ROWS])
            total = head.add(total, y, head_weight, lo, hi)
        state = torch.cat(states, 1) if states else None
        ctx.storage, ctx.plan, ctx.head, ctx.spec = storage, plan, head, spec
        ctx.head_dtype = conv_dtype(y)
        ctx.save_for_backward(head_weight, norm_weight, norm_bias, state, *features)
        return head.finish(total, y)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        head_weight, norm_weight, norm_bias, state, *features = ctx.saved_tensors
        spec, head = ctx.spec, ctx.head
        needs = needs_input_grad(ctx, _CHUNKED_NORM_ACT_HEAD_INPUTS)
        feature_grad = any(needs["features"])
        norm_grad = spec is not None and (needs["norm_weight"] or needs["norm_bias"])
        if spec is not None:
            backward_spec = BackwardSpec.of(common.MODE_Y, spec.act, spec.slope, spec.training,
                                            spec.group, norm_weight, norm_bias)
            # Per-channel values for all chunks at once: the per-channel steps cost per call,
            # whatever the channel count, and a layer has as many chunks as its input has
            # bottleneck widths of channels.
            layer_state = _channel_state(norm_weight, norm_bias, state, spec, features[0])
            a, b = apply_coefficients(layer_state, features[0].dtype)
        head_grads, weight_grads, bias_grads = [], [], []
        pieces = [[] for _ in features]
        for chunk, (lo, hi) in zip(ctx.plan, _bounds(ctx.plan)):
            y = _fill(ctx.storage, features, chunk, writable=spec is not None)
            if spec is not None:  # recomputed in place, running statistics untouched
                # the kernels take a contiguous state (a copy unless one chunk has it all)
                channel = layer_state[:, lo:hi].contiguous()
                reapply_into(y, y, (a[lo:hi], b[lo:hi]), spec.act, spec.slope)
            dy, dhead = head.backward(grad_out, y, head_weight, lo, hi, ctx.head_dtype,
                                      feature_grad or norm_grad, needs["head_weight"])
            head_grads.append(dhead)
            dx = dy
            if spec is not None and dy is not None:
                # dy is this function's own (a convolution's new input gradient, or the
                # kernels' copy of the pooling's broadcast one): dx is written over it.
                dx, dweight, dbias = normalize_activate_backward(
                    y, dy, None, channel, backward_spec, input_grad=feature_grad, dz_owned=True)
                weight_grads.append(dweight)
                bias_grads.append(dbias)
            if feature_grad:
                _distribute(dx, chunk, pieces)
        dfeatures = [None if not need else parts[0] if len(parts) == 1 else torch.cat(parts, 1)
                     for need, parts in zip(needs["features"], pieces)]
        return (None, None, None, None,
                torch.cat(head_grads, 1) if needs["head_weight"] else None,
                torch.cat(weight_grads) if needs["norm_weight"] else None,
                torch.cat(bias_grads) if needs["norm_bias"] else None,
                None, None, *dfeatures)


_CHUNKED_NORM_ACT_HEAD_INPUTS = input_names(_ChunkedNormActHead.forward)


def _channel_state(weight, bias, saved, spec, like):
    """The full (6, C) per-channel state of a call: the scale and shift rebuilt from its
    ``weight`` and ``bias`` beside the ``saved`` ``[mean, rstd, count]`` rows."""
    gamma, beta, dgamma_dweight = scale_and_shift(weight, bias, saved.shape[1], spec.eps,
                                                  spec.scale_mode, like)
    return torch.cat([torch.stack([gamma, beta, dgamma_dweight]), saved])


def _distribute(dx, chunk, pieces):
    """Append to ``pieces[i]`` the slice of a chunk's gradient ``dx`` that belongs to feature
    ``i`` (a feature split over chunks gets several, concatenated at the end)."""
    offset = 0
    for index, start, stop in chunk:
        pieces[index].append(dx[:, offset:offset + stop - start])
        offset += stop - start


def _checked_spec(norm, features):
    """``norm``'s spec for one call, after refusing what the in-place method cannot do."""
    name = type(norm).__name__
    if not hasattr(norm, "activation"):
        raise ValueError(f"norm is an {name}: the shared in-place route needs an ABN layer "
                         "(ABN, InPlaceABN, ABNSync, InPlaceABNSync), whose activation it "
                         "can invert")
    check_activation(norm.activation, norm.activation_param, inplace=True)
    differentiable = torch.is_grad_enabled() and (
        any(f.requires_grad for f in features)
        or (norm.weight is not None and norm.weight.requires_grad))
    accepted = None
    if differentiable and norm.scale_mode == "bn" and norm.weight is not None:
        accepted = check_scale_where_readable(norm.weight, norm.eps)
    return norm_spec(norm, features, accepted=accepted)


def _apply(head, head_weight, features, storage, norm, chunk_channels):
    plan = chunk_plan([f.shape[1] for f in features], chunk_channels)
    spec = running_mean = running_var = None
    if norm is not None:
        spec, running_mean, running_var = _checked_spec(norm, features)
    norm_weight = None if norm is None else norm.weight
    norm_bias = None if norm is None else norm.bias
    return _ChunkedNormActHead.apply(storage, plan, head, spec, head_weight, norm_weight,
                                     norm_bias, running_mean, running_var, *features)


def concat_norm_act_conv(features, storage, norm, conv, chunk_channels):
    """``conv(norm(torch.cat(features, 1)))`` through one shared ``storage``, in place.

    ``features`` is a list of ``(N, C_i, H, W)`` tensors; ``storage`` a
    :class:`~layers.shared_storage.SharedStorage`; ``norm`` an :class:`~layers.ABN` layer
    (any of the four; its activation must be invertible, the statistics are synchronised if
    it is a synchronised one) or ``None`` (``conv(cat(features))``); ``conv`` an
    ``nn.Conv2d`` without bias, groups or dilation; ``chunk_channels`` the most channels the
    storage holds at once. The running statistics are updated once, as the module's own
    forward would.
    """
    check_conv(conv, features)
    return _apply(_ConvHead(conv.stride, conv.padding), conv.weight, features, storage, norm,
                  chunk_channels)


def concat_norm_act_pool(features, storage, norm, chunk_channels):
    """``norm(torch.cat(features, 1)).mean((2, 3))`` (BN + activation + global average
    pooling, ``(N, C)``) through one shared ``storage``, in place; arguments as
    :func:`concat_norm_act_conv`'s, ``norm`` required."""
    if norm is None:
        raise ValueError("norm is required: without one, pool the concatenation directly")
    return _apply(_PoolHead(), None, features, storage, norm, chunk_channels)


__all__ = ["chunk_plan", "concat_norm_act_conv", "concat_norm_act_pool"]
