"""Semantic-segmentation metrics: the confusion matrix over non-void pixels, per-class IoU
(Jaccard index), mean IoU and pixel accuracy, with the confusion summed over the ranks of a
distributed run.

Conventions (the Cityscapes benchmark's, ``cityscapesScripts``
``evaluation/evalPixelLevelSemanticLabeling.py``, which the paper's "averaged Jaccard numbers"
are):

* pixels whose ground truth is ``ignore_index`` (void) are left out entirely, whatever is
  predicted there (Cityscapes counts no false positive on an ignored ground-truth pixel);
* ``IoU_c = TP / (TP + FP + FN)`` from the accumulated confusion of the whole set (not a mean
  of per-image IoUs); it is NaN when ``TP + FP + FN = 0``, i.e. class ``c`` occurs neither in
  the ground truth nor in the prediction (``getIouScoreForLabel`` returns ``nan`` when its
  denominator is 0);
* mean IoU is the mean over the classes whose IoU is not NaN (``getScoreAverage`` skips the NaN
  scores; the same as ``nanmean`` in torchvision's references and mmsegmentation). A class
  present in the ground truth but never predicted has IoU 0 and counts; a class predicted but
  absent from the ground truth also has IoU 0 and counts.
"""
import math

import torch

from .. import distributed


def _check_num_classes(num_classes):
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes={num_classes!r}: expected an integer >= 1")


def confusion_matrix(prediction, target, num_classes, ignore_index=255):
    """The ``(num_classes, num_classes)`` int64 confusion matrix of integer label tensors of the
    same shape: entry ``[t, p]`` counts the non-void pixels of ground truth ``t`` predicted as
    ``p`` (rows: truth, columns: prediction). Pixels where ``target == ignore_index`` are left
    out; other labels, and predictions on non-void pixels, must lie in ``[0, num_classes)``.
    On ``target``'s device."""
    _check_num_classes(num_classes)
    if prediction.shape != target.shape:
        raise ValueError(f"prediction shape {tuple(prediction.shape)} does not match target "
                         f"shape {tuple(target.shape)}")
    for name, t in (("prediction", prediction), ("target", target)):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{name}: expected integer labels, got {t.dtype}")
    valid = target != ignore_index
    truth = target[valid].long()
    pred = prediction.to(target.device)[valid].long()
    if truth.numel():
        if bool(((truth < 0) | (truth >= num_classes)).any()):
            bad = torch.unique(truth[(truth < 0) | (truth >= num_classes)])[:10].tolist()
            raise ValueError(f"target: labels {bad} outside [0, {num_classes}) and not "
                             f"ignore_index={ignore_index}")
        if bool(((pred < 0) | (pred >= num_classes)).any()):
            bad = torch.unique(pred[(pred < 0) | (pred >= num_classes)])[:10].tolist()
            raise ValueError(f"prediction: labels {bad} outside [0, {num_classes})")
    counts = torch.bincount(truth * num_classes + pred, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)


def _check_confusion(cm):
    if not isinstance(cm, torch.Tensor) or cm.dim() != 2 or cm.shape[0] != cm.shape[1]:
        shape = tuple(cm.shape) if isinstance(cm, torch.Tensor) else type(cm).__name__
        raise ValueError(f"confusion matrix: expected a square (C, C) tensor, got {shape}")


def iou_from_confusion(cm):
    """Per-class IoU ``TP / (TP + FP + FN)`` of confusion matrix ``cm`` (rows truth, columns
    prediction), float64 of shape ``(C,)``; NaN for the classes absent from both the ground
    truth and the prediction."""
    _check_confusion(cm)
    cm = cm.double()
    tp = cm.diagonal()
    union = cm.sum(dim=0) + cm.sum(dim=1) - tp
    nan = torch.full_like(tp, float("nan"))
    return torch.where(union > 0, tp / union.clamp(min=1), nan)


def mean_iou(cm):
    """The mean of :func:`iou_from_confusion` over the classes whose IoU is defined (not NaN);
    NaN if none is (no non-void pixel at all). A Python float."""
    iou = iou_from_confusion(cm)
    defined = ~torch.isnan(iou)
    if not bool(defined.any()):
        return math.nan
    return float(iou[defined].mean())


def pixel_accuracy(cm):
    """The fraction of non-void pixels predicted correctly (trace / total); NaN without any
    pixel. A Python float."""
    _check_confusion(cm)
    total = float(cm.sum())
    return float(cm.diagonal().sum()) / total if total > 0 else math.nan


def all_reduce_confusion(cm):
    """``cm`` summed over the ranks of a distributed run (an exact int64 sum; a copy of ``cm``
    in one process). Every rank must call it."""
    _check_confusion(cm)
    if cm.is_floating_point():
        raise TypeError(f"confusion matrix: expected integer counts, got {cm.dtype}")
    return distributed.all_reduce_tensor(cm.long(), op="sum")


__all__ = ["all_reduce_confusion", "confusion_matrix", "iou_from_confusion", "mean_iou",
           "pixel_accuracy"]
