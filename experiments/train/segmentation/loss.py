"""The online-bootstrapped cross-entropy of the InPlace-ABN segmentation experiments (Rota Bulò
et al. 2018, Sec. 4.2: "computing the loss using an *online bootstrapping* strategy as
described in [23, 28] (setting p = 1.0 and m = 25%)").

Our reading, per crop ``i`` of the batch, over its ``n_i`` non-void pixels:

* ``K_i = ceil(m * n_i)``;
* the selected pixels are the ``K_i`` pixels with the highest cross-entropy, of which those
  already predicted with probability ``>= p`` for their true class are dropped ("easy"
  pixels; with ``p = 1.0`` none is dropped);
* the crop's loss is the mean cross-entropy over its selected pixels (0 when it selects none,
  which only happens for ``p < 1`` when every pixel is easy);
* the batch loss is the mean of the crop losses over the crops with at least one non-void
  pixel. Crops that are entirely void contribute nothing and are not counted; a batch without
  any non-void pixel gives 0 (connected to ``logits``, with zero gradient), not NaN.

Why this reading. Both parameters act on the same ranking, since ``p_true < p`` is the same as
``loss > -log p``: a threshold keeps a top set of the ranking, ``m`` keeps the top ``K``. The
"hard pixels below ``p``, but at least ``K`` of them" combination (Wu, Shen, van den Hengel
2016 [28]; the OHEM loss of PSPNet / HRNet, ``thresh`` with ``min_kept``) keeps
``max(#hard, K)`` pixels, which at the paper's ``p = 1.0`` is every pixel: plain cross-entropy,
``m`` without effect. The paper sets both, so we take the combination where both act, the top
``K`` capped by the threshold (``min(#hard, K)`` pixels), which at ``p = 1.0`` is the top 25% of
each crop's pixels. That is what the paper's authors' own later code does: Mapillary's seamseg
(``seamseg/algos/semantic_seg.py``, ``SemanticSegLoss``, default config ``[sem] ohem = .25``)
takes, per image, the mean of the ``ceil(0.25 * pixels)`` highest per-pixel losses and averages
over the images; and Pohlen et al.'s FRRN [23] (``TobyPDE/FRRN``,
``dltools/losses.py:bootstrapped_xentropy``) takes, per image, the mean of the ``K`` worst
pixels and averages over the batch. Bootstrapping is therefore per crop, not over the whole
batch. Two deliberate differences from seamseg: ``K`` counts the non-void pixels only (seamseg
counts all pixels, void ones entering its mean as zeros when fewer than ``K`` are valid) and
all-void crops are left out of the batch mean (seamseg divides by every crop).

``m`` is read as the nearest fraction with denominator at most 10^6 (exact for any decimal of
up to six digits, and for 1/3 and the like), so ``K_i`` is computed exactly in integers on the
logits' device, without a host synchronisation. Ties at the ``K``-th loss select equal values,
so the loss does not depend on which tied pixel is taken.
"""
import math
import numbers
from fractions import Fraction

import torch
import torch.nn as nn
import torch.nn.functional as F

_MAX_DENOMINATOR = 10 ** 6


def _check_fraction(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"{name}={value!r}: expected a number in (0, 1]")
    return float(value)


class OnlineBootstrappedCrossEntropy(nn.Module):
    """Per-crop online-bootstrapped cross-entropy (see the module docstring for the exact
    definition and its sources).

    ``p``: pixels whose predicted probability of the true class is ``>= p`` are never used
    (``p = 1.0``: no threshold). ``m``: the fraction of each crop's non-void pixels, those with
    the highest cross-entropy, that the loss averages. ``ignore_index``: the void label.

    ``forward(logits, target)``: ``logits`` ``(N, C, H, W)`` of any floating dtype (float16 and
    bfloat16 are computed in float32), ``target`` ``(N, H, W)`` int64 with values in
    ``[0, C)`` or ``ignore_index``. Returns a scalar (float32, or float64 for float64 logits).
    """

    def __init__(self, p=1.0, m=0.25, ignore_index=255):
        super().__init__()
        self.p = _check_fraction("p", p)
        self.m = _check_fraction("m", m)
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
            raise ValueError(f"ignore_index={ignore_index!r}: expected an integer")
        self.ignore_index = ignore_index
        fraction = Fraction(self.m).limit_denominator(_MAX_DENOMINATOR)
        self._m_num, self._m_den = fraction.numerator, fraction.denominator
        # p_true < p  <=>  -log p_true > -log p
        self._loss_threshold = -math.log(self.p) if self.p < 1.0 else None

    def extra_repr(self):
        return f"p={self.p}, m={self.m}, ignore_index={self.ignore_index}"

    def kept(self, num_valid):
        """``K = ceil(m * num_valid)`` per crop, exactly, for an int64 tensor ``num_valid``."""
        return (num_valid * self._m_num + (self._m_den - 1)) // self._m_den

    def forward(self, logits, target):
        if logits.dim() != 4:
            raise ValueError(f"logits: expected an (N, C, H, W) tensor, got shape "
                             f"{tuple(logits.shape)}")
        if not logits.is_floating_point():
            raise TypeError(f"logits: expected a floating dtype, got {logits.dtype}")
        n, _, h, w = logits.shape
        if tuple(target.shape) != (n, h, w):
            raise ValueError(f"target: expected shape {(n, h, w)} to match the logits, got "
                             f"{tuple(target.shape)}")
        if target.dtype != torch.int64:
            raise TypeError(f"target: expected int64 labels, got {target.dtype}")
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        pixel_loss = F.cross_entropy(logits, target, ignore_index=self.ignore_index,
                                     reduction="none").reshape(n, -1)
        valid = (target != self.ignore_index).reshape(n, -1)
        num_valid = valid.sum(dim=1)
        # Void pixels sort last (cross-entropy is >= 0) and K never exceeds the valid count.
        ranked, _ = pixel_loss.masked_fill(~valid, -1.0).sort(dim=1, descending=True)
        position = torch.arange(ranked.shape[1], device=ranked.device)
        selected = position.unsqueeze(0) < self.kept(num_valid).unsqueeze(1)
        if self._loss_threshold is not None:
            selected &= ranked > self._loss_threshold
        crop_sum = torch.where(selected, ranked, torch.zeros_like(ranked)).sum(dim=1)
        crop_loss = crop_sum / selected.sum(dim=1).clamp(min=1).to(crop_sum.dtype)
        crops = (num_valid > 0).sum().clamp(min=1).to(crop_loss.dtype)
        return crop_loss.sum() / crops


__all__ = ["OnlineBootstrappedCrossEntropy"]
