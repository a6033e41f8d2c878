"""Segmentation inference (single- or multi-scale, optionally flipped, whole-image or sliding
window) and evaluation over a loader.

Multi-scale / flip testing averages the softmax *probabilities*: at each scale (and for the
flipped input) the logits are resized back to the image size, turned into probabilities, and the
probabilities are averaged over all scales and flips; the prediction is their argmax. This is
DeepLab's test-time procedure (``tensorflow/models``, ``research/deeplab/model.py``,
``predict_labels_multi_scale``: ``softmax`` of each resized scale's / flipped logits, then
``reduce_mean`` over them), the DeepLabV3 head the paper uses. (Segmentation logits differ in
scale across input resolutions, so averaging probabilities keeps one scale from dominating;
ten-crop classification in :mod:`experiments.train.metrics` averages logits instead, following
fb.resnet.torch.) The paper's Table 2 top rows are single scale without flipping
(``scales=(1.0,)``, ``flip=False``); its Cityscapes test entry uses scales
``(1.0, 1.25, 1.5, 1.75, 2.0)`` with flipping.

Resizing is bilinear with ``align_corners=False`` both ways (the input to
``round(side * scale)``, at least 1 pixel, and the logits back), like the network's own
upsampling of its logits (:class:`layers.deeplab.DeepLabV3`).

Sliding window: with ``window`` set and a (scaled) image larger than ``window`` in height or
width, the network runs on ``window x window`` tiles at stride ``ceil(window * (1 - overlap))``,
the last tile of each row / column aligned with the image's end; a side shorter than the window
is zero-padded at the bottom / right (zero is the mean colour after the per-channel
normalisation) and the padding cropped off the logits. Overlapping tiles' *logits* are averaged
per pixel (as mmsegmentation's ``slide_inference``), then the scale's probabilities are taken
as above. Images no larger than the window in either side run whole, unpadded.
"""
import math
import numbers

import torch
import torch.nn.functional as F

from .. import distributed
from .metrics import all_reduce_confusion, confusion_matrix, iou_from_confusion, mean_iou, \
    pixel_accuracy


def _check_scales(scales):
    try:
        scales = tuple(scales)
    except TypeError:
        raise ValueError(f"scales={scales!r}: expected a sequence of positive numbers") from None
    if not scales or any(isinstance(s, bool) or not isinstance(s, numbers.Real)
                         or not math.isfinite(s) or s <= 0 for s in scales):
        raise ValueError(f"scales={scales!r}: expected a non-empty sequence of positive numbers")
    return tuple(float(s) for s in scales)


def _check_window(window, overlap):
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 1):
        raise ValueError(f"window={window!r}: expected None or an integer >= 1")
    if isinstance(overlap, bool) or not isinstance(overlap, numbers.Real) \
            or not 0.0 <= float(overlap) < 1.0:
        raise ValueError(f"overlap={overlap!r}: expected a number in [0, 1)")


def _check_num_classes(num_classes):
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes={num_classes!r}: expected an integer >= 1")


def window_starts(size, window, overlap):
    """The start offsets of the tiles along one side of ``size >= window`` pixels: every
    ``ceil(window * (1 - overlap))`` pixels, the last one at ``size - window``."""
    stride = max(1, math.ceil(window * (1.0 - overlap) - 1e-9))
    if size <= window:
        return [0]
    return list(range(0, size - window, stride)) + [size - window]


def _run(model, x, num_classes):
    logits = model(x)
    expected = (x.shape[0], num_classes, *x.shape[-2:])
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != expected:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"model output: expected logits of shape {expected} (num_classes="
                         f"{num_classes}, at the input size), got {got}")
    return logits.float()


def _sliding_logits(model, x, window, overlap, num_classes):
    n, _, h, w = x.shape
    pad_h, pad_w = max(window - h, 0), max(window - w, 0)
    if pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    height, width = x.shape[-2:]
    total = torch.zeros(n, num_classes, height, width, dtype=torch.float32, device=x.device)
    count = torch.zeros(1, 1, height, width, dtype=torch.float32, device=x.device)
    for top in window_starts(height, window, overlap):
        for left in window_starts(width, window, overlap):
            tile = x[:, :, top:top + window, left:left + window]
            total[:, :, top:top + window, left:left + window] += _run(model, tile, num_classes)
            count[:, :, top:top + window, left:left + window] += 1
    return (total / count)[:, :, :h, :w]


def _logits(model, x, window, overlap, num_classes):
    if window is not None and (x.shape[-2] > window or x.shape[-1] > window):
        return _sliding_logits(model, x, window, overlap, num_classes)
    return _run(model, x, num_classes)


def predict_logits(model, image, *, scales=(1.0,), flip=False, window=None, overlap=1 / 3,
                   num_classes):
    """Class scores ``(N, num_classes, H, W)`` float32 of a batch ``image`` ``(N, 3, H, W)``:
    the softmax probabilities averaged over ``scales`` and, with ``flip``, the horizontally
    flipped input (its output flipped back), each computed whole or in sliding windows (see the
    module docstring). ``model`` returns logits at its input's size; it is run as it is (the
    caller sets eval mode and ``no_grad``). The argmax over dim 1 is the prediction."""
    scales = _check_scales(scales)
    _check_window(window, overlap)
    _check_num_classes(num_classes)
    if image.dim() != 4:
        raise ValueError(f"image: expected an (N, C, H, W) batch, got shape "
                         f"{tuple(image.shape)}")
    height, width = image.shape[-2:]
    probs = torch.zeros(image.shape[0], num_classes, height, width, dtype=torch.float32,
                        device=image.device)
    views = 0
    for scale in scales:
        size = (max(1, round(height * scale)), max(1, round(width * scale)))
        scaled = image if size == (height, width) else \
            F.interpolate(image, size=size, mode="bilinear", align_corners=False)
        for flipped in ((False, True) if flip else (False,)):
            x = scaled.flip(-1) if flipped else scaled
            logits = _logits(model, x, window, overlap, num_classes)
            if flipped:
                logits = logits.flip(-1)
            if size != (height, width):
                logits = F.interpolate(logits, size=(height, width), mode="bilinear",
                                       align_corners=False)
            probs += logits.softmax(dim=1)
            views += 1
    return probs / views


def _json_float(value):
    return None if math.isnan(value) else float(value)


@torch.no_grad()
def evaluate_segmentation(model, loader, device, *, num_classes, scales=(1.0,), flip=False,
                          window=None, overlap=1 / 3, ignore_index=255, non_blocking=False,
                          sink=None):
    """Mean IoU, pixel accuracy and per-class IoU of ``model`` (put in eval mode, its mode
    restored after) over ``loader``, which yields ``(images (N, 3, H, W), targets (N, H, W)
    int64)``; predictions from :func:`predict_logits`. ``sink``, if given, is called with each
    batch's predicted train ids ``(N, H, W)`` int64 in loader order (the prediction command
    writes them as files: the files and the metrics come from one pass).

    In a distributed run each rank evaluates its own shard and the confusion matrices (and the
    image counts) are summed over the ranks, so every rank returns the metrics of the whole
    set: ``{"miou", "pixel_accuracy", "iou_per_class", "count"}``, fractions in ``[0, 1]``,
    ``count`` the number of images; an undefined value (a class absent from both ground truth
    and prediction; no non-void pixel at all) is ``None`` so the dict is JSON-ready.
    """
    scales = _check_scales(scales)
    _check_window(window, overlap)
    _check_num_classes(num_classes)
    device = torch.device(device)
    was_training = model.training
    model.eval()
    cm = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
    count = 0
    try:
        for images, target in loader:
            images = images.to(device, non_blocking=non_blocking)
            target = target.to(device, non_blocking=non_blocking)
            if target.dim() != 3 or target.shape[0] != images.shape[0] \
                    or target.shape[-2:] != images.shape[-2:]:
                raise ValueError(f"targets: expected shape ({images.shape[0]}, "
                                 f"{images.shape[-2]}, {images.shape[-1]}) to match the "
                                 f"images, got {tuple(target.shape)}")
            scores = predict_logits(model, images, scales=scales, flip=flip, window=window,
                                    overlap=overlap, num_classes=num_classes)
            prediction = scores.argmax(dim=1)
            cm += confusion_matrix(prediction, target, num_classes, ignore_index)
            if sink is not None:
                sink(prediction)
            count += images.shape[0]
    finally:
        model.train(was_training)
    cm = all_reduce_confusion(cm)
    count = int(round(distributed.all_reduce([count], device=device)[0]))
    if count == 0:
        raise ValueError("evaluate_segmentation: the loader yielded no images")
    return {
        "miou": _json_float(mean_iou(cm)),
        "pixel_accuracy": _json_float(pixel_accuracy(cm)),
        "iou_per_class": [_json_float(v) for v in iou_from_confusion(cm).tolist()],
        "count": count,
    }


__all__ = ["evaluate_segmentation", "predict_logits", "window_starts"]
