"""Semantic segmentation for InPlace-ABN Table 2 (Rota Bulò et al. 2018, Sec. 4.2): the loss the
networks train with, the metrics they are scored by, and test-time inference.

- :mod:`.loss`: :class:`OnlineBootstrappedCrossEntropy`, the per-crop online bootstrapping of
  [23, 28] with the paper's ``p = 1.0``, ``m = 25%`` (the mean cross-entropy of each crop's 25%
  hardest non-void pixels, averaged over the crops).
- :mod:`.metrics`: the confusion matrix over non-void pixels, per-class IoU, mean IoU (the
  paper's "averaged Jaccard numbers", Cityscapes conventions) and pixel accuracy, and the
  exact sum of a confusion matrix over DDP ranks.
- :mod:`.inference`: :func:`predict_logits` (single/multi-scale, flip, sliding window;
  softmax probabilities averaged as in DeepLab) and :func:`evaluate_segmentation` over a loader,
  reduced over the ranks.
- :mod:`.submission`: predictions written in the benchmarks' formats (Cityscapes labelIds
  PNGs, Vistas label-index PNGs, COCO-Stuff's RLE result JSON).
"""
from .inference import evaluate_segmentation, predict_logits, window_starts
from .loss import OnlineBootstrappedCrossEntropy
from .metrics import all_reduce_confusion, confusion_matrix, iou_from_confusion, mean_iou, \
    pixel_accuracy

__all__ = ["OnlineBootstrappedCrossEntropy", "all_reduce_confusion", "confusion_matrix",
           "evaluate_segmentation", "iou_from_confusion", "mean_iou", "pixel_accuracy",
           "predict_logits", "window_starts"]
