"""BN + ACT + CONV building blocks, one per memory strategy of the InPlace-ABN paper (Fig. 2).

Every block is batch normalization (training mode, batch statistics), leaky ReLU with slope
0.01 and a 3x3 convolution without bias (``groups`` as in ResNeXt), built by
:func:`build_block`. They compute the same function; they differ in what they keep for backward
and what backward recomputes (``x``: the block input; ``x_hat``: the normalized input;
``z``: the activation output, the convolution's input):

* ``standard`` (Fig. 2a): ``nn.BatchNorm2d``, in-place leaky ReLU, ``nn.Conv2d``. Stores ``x``
  (BN) and ``z`` (activation and convolution): two buffers.
* ``checkpoint`` (Fig. 2b): stores ``x`` and the batch statistics; backward recomputes ``z``
  from ``x`` with one fused scale-and-shift and the activation, then runs the stock BN backward
  from ``x``. One buffer.
* ``checkpoint_proposed`` (Fig. 2c): stores ``x_hat``; backward recomputes
  ``z = act(gamma * x_hat + beta)`` and runs the BN backward from ``x_hat`` (BN*). One buffer.
* ``inplace_abn_I`` / ``inplace_abn_II`` (Fig. 2d/e): ``layers.InPlaceABN`` (variant I or
  II) and ``nn.Conv2d``; both store only ``z``, which the convolution saves anyway. One buffer.
  ``scale_mode="bn"`` (the scale is ``gamma``, as in ``nn.BatchNorm2d``), so that all five
  blocks compute exactly the same function.

Why the two checkpointing blocks are one autograd function (:class:`_RecomputedBNActConv`) and
not ``torch.utils.checkpoint`` around BN+ACT: the convolution after a checkpointed region saves
the region's output ``z`` for its weight gradient, so ``z`` would stay in memory and nothing
would be saved; checkpointing the convolution too would recompute it in backward, which the
paper's Fig. 2b does not do. Recomputation and the backward passes use ATen's own kernels
(``native_batch_norm_backward``, ``leaky_relu_backward``, ``convolution_backward``), as
``standard`` does, so the timings compare strategies rather than implementations.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from layers import InPlaceABN

STRATEGIES = ("standard", "checkpoint", "checkpoint_proposed", "inplace_abn_I", "inplace_abn_II")
SLOPE = 0.01
KERNEL = 3
PADDING = 1


def _per_channel(vector):
    """``(C,)`` -> ``(C, 1, 1)``, to broadcast over ``(N, C, H, W)``."""
    return vector[:, None, None]


class _RecomputedBNActConv(torch.autograd.Function):
    """BN (batch statistics) + leaky ReLU + conv that stores ``x`` or ``x_hat``, not ``z``."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, conv_weight, store, momentum,
                eps, groups):
        if store == "x":
            y, mean, invstd = torch.native_batch_norm(x, weight, bias, running_mean, running_var,
                                                      True, momentum, eps)
            ctx.save_for_backward(x, mean, invstd, weight, bias, conv_weight)
        else:
            x_hat, _, invstd = torch.native_batch_norm(x, None, None, running_mean, running_var,
                                                       True, momentum, eps)
            y = torch.addcmul(_per_channel(bias), x_hat, _per_channel(weight))
            ctx.save_for_backward(x_hat, invstd, weight, bias, conv_weight)
        z = F.leaky_relu(y, SLOPE, inplace=True)
        ctx.store, ctx.eps, ctx.groups = store, eps, groups
        return F.conv2d(z, conv_weight, None, 1, PADDING, 1, groups)

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.store == "x":
            x, mean, invstd, weight, bias, conv_weight = ctx.saved_tensors
            scale = weight * invstd
            # Recompute z from x with the forward's statistics: one scale-and-shift (Fig. 2b).
            y = torch.addcmul(_per_channel(bias - mean * scale), x, _per_channel(scale))
            bn_input, bn_weight, bn_mean, bn_invstd = x, weight, mean, invstd
        else:
            x_hat, invstd, weight, bias, conv_weight = ctx.saved_tensors
            y = torch.addcmul(_per_channel(bias), x_hat, _per_channel(weight))  # Fig. 2c
            # BN* from x_hat: the stock backward with mean 0, invstd 1 and weight * invstd.
            bn_input, bn_weight = x_hat, weight * invstd
            bn_mean, bn_invstd = torch.zeros_like(invstd), torch.ones_like(invstd)
        z = F.leaky_relu(y, SLOPE, inplace=True)
        grad_z, grad_conv_weight, _ = torch.ops.aten.convolution_backward(
            grad_out, z, conv_weight, None, [1, 1], [PADDING, PADDING], [1, 1], False, [0, 0],
            ctx.groups, [True, True, False])
        grad_y = torch.ops.aten.leaky_relu_backward(grad_z, z, SLOPE, True)
        grad_x, grad_weight, grad_bias = torch.ops.aten.native_batch_norm_backward(
            grad_y, bn_input, bn_weight, None, None, bn_mean, bn_invstd, True, ctx.eps,
            [True, True, True])
        return (grad_x, grad_weight, grad_bias, None, None, grad_conv_weight, None, None, None,
                None)


def _conv(channels, groups, options):
    return nn.Conv2d(channels, channels, KERNEL, padding=PADDING, groups=groups, bias=False,
                     **options)


class StandardBlock(nn.Module):
    """Fig. 2(a): ``nn.BatchNorm2d``, in-place leaky ReLU, convolution."""

    def __init__(self, channels, groups, **options):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels, **options)
        self.conv = _conv(channels, groups, options)

    def forward(self, x):
        return self.conv(F.leaky_relu(self.bn(x), SLOPE, inplace=True))


class RecomputingBlock(nn.Module):
    """Fig. 2(b) (``store="x"``) or 2(c) (``store="x_hat"``); training mode only."""

    def __init__(self, channels, groups, store, **options):
        super().__init__()
        if store not in ("x", "x_hat"):
            raise ValueError(f"store={store!r} must be 'x' (Fig. 2b) or 'x_hat' (Fig. 2c)")
        self.store = store
        self.bn = nn.BatchNorm2d(channels, **options)
        self.conv = _conv(channels, groups, options)

    def forward(self, x):
        if not self.training:
            raise RuntimeError("RecomputingBlock computes batch statistics: call .train()")
        self.bn.num_batches_tracked.add_(1)
        return _RecomputedBNActConv.apply(x, self.bn.weight, self.bn.bias, self.bn.running_mean,
                                          self.bn.running_var, self.conv.weight, self.store,
                                          self.bn.momentum, self.bn.eps, self.conv.groups)


class InPlaceABNBlock(nn.Module):
    """Fig. 2(d)/(e): ``layers.InPlaceABN`` (variant ``"I"`` or ``"II"``), convolution.

    The input is overwritten: pass a non-leaf tensor (e.g. ``x.clone()``).
    """

    def __init__(self, channels, groups, variant, **options):
        super().__init__()
        self.bn = InPlaceABN(channels, activation="leaky_relu", activation_param=SLOPE,
                             scale_mode="bn", variant=variant, **options)
        self.conv = _conv(channels, groups, options)

    def forward(self, x):
        return self.conv(self.bn(x))


def build_block(strategy, channels, groups, dtype=torch.float32, device="cpu"):
    """The block of ``strategy`` (one of :data:`STRATEGIES`), in training mode."""
    options = {"dtype": dtype, "device": device}
    if strategy == "standard":
        block = StandardBlock(channels, groups, **options)
    elif strategy in ("checkpoint", "checkpoint_proposed"):
        store = "x" if strategy == "checkpoint" else "x_hat"
        block = RecomputingBlock(channels, groups, store, **options)
    elif strategy in ("inplace_abn_I", "inplace_abn_II"):
        block = InPlaceABNBlock(channels, groups, strategy.rsplit("_", 1)[1], **options)
    else:
        raise ValueError(f"strategy={strategy!r} must be one of {STRATEGIES}")
    return block.train()


__all__ = ["STRATEGIES", "SLOPE", "build_block", "StandardBlock", "RecomputingBlock",
           "InPlaceABNBlock"]
