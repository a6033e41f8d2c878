"""Classification metrics: top-k counts, ten-crop averaging and evaluation over a loader,
reduced over the ranks of a distributed run.

Errors are fractions in ``[0, 1]`` (``0.2026`` for the paper's "20.26%").

Ten-crop evaluation averages the *logits* (the network's raw outputs) over the 10 crops before
taking the top-k. That is what fb.resnet.torch does (``Trainer:computeScore`` sums the outputs
over the crops, with the ``:exp()`` that would turn log-probabilities into probabilities
commented out; its models end in a linear layer), and ResNeXt's and DenseNet's ImageNet numbers
were produced with that code. Averaging softmax probabilities is the other common choice
(Caffe-era evaluations); the two rarely disagree on the top class, but the choice is fixed here
so that results are comparable with the papers' code. The reported loss of a ten-crop
evaluation is the cross-entropy of the averaged logits.
"""
import torch
import torch.nn.functional as F

from . import distributed


def _check_logits(logits, target):
    if logits.dim() != 2:
        raise ValueError(f"logits: expected an (N, classes) tensor, got shape "
                         f"{tuple(logits.shape)}")
    if target.shape != logits.shape[:1]:
        raise ValueError(f"target: expected shape ({logits.shape[0]},) to match the logits, got "
                         f"{tuple(target.shape)}")


def topk_correct(logits, target, ks=(1, 5)):
    """How many rows of ``logits`` (N, classes) have ``target`` among their ``k`` highest
    scores, for each ``k`` in ``ks``; a list of ints.

    ``k`` larger than the number of classes counts as the number of classes (every row is then
    correct), so top-5 is defined for the small data sets of the smoke profile. Ties are broken
    by ``torch.topk`` (lowest index first on CPU).
    """
    _check_logits(logits, target)
    if any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks={ks!r}: expected integers >= 1")
    if logits.shape[0] == 0:
        return [0 for _ in ks]
    kmax = min(max(ks), logits.shape[1])
    top = logits.topk(kmax, dim=1, largest=True, sorted=True).indices
    hits = top.eq(target.view(-1, 1).to(top.device))
    return [int(hits[:, :min(k, kmax)].any(dim=1).sum().item()) for k in ks]


def ten_crop_average(output):
    """The per-image logits of a ten-crop output: ``(N, crops, classes)`` -> ``(N, classes)``,
    the mean over crops (see the module docstring for why logits rather than probabilities)."""
    if output.dim() != 3:
        raise ValueError(f"output: expected an (N, crops, classes) tensor, got shape "
                         f"{tuple(output.shape)}")
    return output.mean(dim=1)


def _forward(model, images, ten_crop):
    if not ten_crop:
        return model(images)
    if images.dim() < 3:
        raise ValueError(f"ten-crop images: expected an (N, crops, C, ...) batch, got shape "
                         f"{tuple(images.shape)}")
    n, crops = images.shape[:2]
    logits = model(images.reshape(n * crops, *images.shape[2:]))
    return ten_crop_average(logits.reshape(n, crops, -1))


@torch.no_grad()
def evaluate(model, loader, device, *, ten_crop=False, ks=(1, 5), non_blocking=False):
    """Top-1/top-5 error and mean cross-entropy of ``model`` (put in eval mode) over ``loader``.

    ``loader`` yields ``(images, targets)``; with ``ten_crop`` images are ``(N, 10, C, H, W)``
    and each image's logits are averaged over its crops. In a distributed run each rank
    evaluates its own shard (the loaders give every sample to exactly one rank) and the counts
    are summed over the ranks, so every rank returns the metrics of the whole set:
    ``{"top1_error", "top5_error", "loss", "count"}``. The model's training mode is restored.
    """
    device = torch.device(device)
    was_training = model.training
    model.eval()
    loss_sum = 0.0
    correct = [0 for _ in ks]
    count = 0
    try:
        for images, target in loader:
            images = images.to(device, non_blocking=non_blocking)
            target = target.to(device, non_blocking=non_blocking)
            logits = _forward(model, images, ten_crop)
            loss_sum += float(F.cross_entropy(logits.float() if logits.dtype in
                                              (torch.float16, torch.bfloat16) else logits,
                                              target, reduction="sum"))
            for i, c in enumerate(topk_correct(logits, target, ks)):
                correct[i] += c
            count += target.shape[0]
    finally:
        model.train(was_training)
    totals = distributed.all_reduce([loss_sum, count, *correct], device=device)
    loss_sum, count, correct = totals[0], int(round(totals[1])), totals[2:]
    if count == 0:
        raise ValueError("evaluate: the loader yielded no samples")
    result = {"loss": loss_sum / count, "count": count}
    for k, c in zip(ks, correct):
        result[f"top{k}_error"] = 1.0 - c / count
    return result


__all__ = ["evaluate", "ten_crop_average", "topk_correct"]
