"""Segmentation loss, metrics and inference (experiments/train/segmentation), InPlace-ABN Table 2.

The bootstrapped loss is checked against a direct per-pixel Python implementation of the
documented definition and with ``gradcheck``; the metrics against hand-computed confusion
matrices; inference against the plain forward pass of models whose behaviour under flipping,
tiling and rescaling is known; and the distributed confusion sum with 2 gloo ranks started by
``torch.multiprocessing``, each evaluating half of the data.
"""
import datetime
import math
import os
import time
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from experiments.train.segmentation import (OnlineBootstrappedCrossEntropy, all_reduce_confusion,
                                            confusion_matrix, evaluate_segmentation,
                                            iou_from_confusion, mean_iou, pixel_accuracy,
                                            predict_logits, window_starts)

VOID = 255


# --------------------------------------------------------------------------- metrics


def test_confusion_matrix_and_miou_hand_computed():
    target = torch.tensor([[0, 0, 1, VOID], [1, 2, 2, VOID]])
    pred = torch.tensor([[0, 1, 1, 3], [1, 2, 0, 0]])  # predictions on void pixels are ignored
    cm = confusion_matrix(pred, target, 4)
    assert cm.dtype == torch.int64
    assert cm.tolist() == [[1, 1, 0, 0],
                           [0, 2, 0, 0],
                           [1, 0, 1, 0],
                           [0, 0, 0, 0]]
    iou = iou_from_confusion(cm)
    assert iou[:3].tolist() == pytest.approx([1 / 3, 2 / 3, 1 / 2])
    assert math.isnan(iou[3])  # class 3: in neither truth nor prediction (void excluded)
    assert mean_iou(cm) == pytest.approx(0.5)  # (1/3 + 2/3 + 1/2) / 3: class 3 excluded
    assert pixel_accuracy(cm) == pytest.approx(4 / 6)


def test_class_in_truth_never_predicted_counts_zero():
    cm = confusion_matrix(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2]), 3)
    assert iou_from_confusion(cm).tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert mean_iou(cm) == pytest.approx(0.5)
    # a class predicted but absent from the truth also counts 0
    cm = confusion_matrix(torch.tensor([2, 1]), torch.tensor([0, 1]), 3)
    assert iou_from_confusion(cm).tolist() == pytest.approx([0.0, 1.0, 0.0])


def test_confusion_matrix_accumulates_and_validates():
    g = torch.Generator().manual_seed(0)
    target = torch.randint(0, 5, (3, 7, 9), generator=g)
    target[torch.rand(3, 7, 9, generator=g) < 0.2] = VOID
    pred = torch.randint(0, 5, (3, 7, 9), generator=g)
    cm = confusion_matrix(pred, target, 5)
    assert torch.equal(cm, confusion_matrix(pred[:1], target[:1], 5)
                       + confusion_matrix(pred[1:], target[1:], 5))
    valid = target != VOID
    assert int(cm.sum()) == int(valid.sum())
    reference = np.zeros((5, 5), dtype=np.int64)
    np.add.at(reference, (target[valid].numpy(), pred[valid].numpy()), 1)
    assert cm.tolist() == reference.tolist()
    assert confusion_matrix(pred, torch.full_like(target, VOID), 5).sum() == 0
    with pytest.raises(ValueError, match="target"):
        confusion_matrix(pred, torch.full_like(target, 7), 5)
    with pytest.raises(ValueError, match="prediction"):
        confusion_matrix(torch.full_like(pred, 5), target, 5)
    with pytest.raises(ValueError, match="num_classes"):
        confusion_matrix(pred, target, 0)
    with pytest.raises(ValueError, match="shape"):
        confusion_matrix(pred[:1], target, 5)
    empty = torch.zeros(3, 3, dtype=torch.int64)
    assert math.isnan(mean_iou(empty)) and math.isnan(pixel_accuracy(empty))
    # one process: the all-reduce is the identity (a copy)
    reduced = all_reduce_confusion(cm)
    assert torch.equal(reduced, cm) and reduced.dtype == torch.int64


# --------------------------------------------------------------------------- loss


def _naive_bootstrapped(logits, target, p, m, ignore_index=VOID):
    """The documented definition, pixel by pixel in float64 Python."""
    logits = logits.detach().double().numpy()
    target = target.numpy()
    n, _, h, w = logits.shape
    crop_losses = []
    for i in range(n):
        losses = []
        for y in range(h):
            for x in range(w):
                t = int(target[i, y, x])
                if t == ignore_index:
                    continue
                z = logits[i, :, y, x]
                lse = z.max() + math.log(np.exp(z - z.max()).sum())
                losses.append(lse - z[t])
        if not losses:
            continue  # all-void crop: not counted
        k = math.ceil(Fraction(str(m)) * len(losses))
        chosen = sorted(losses, reverse=True)[:k]
        chosen = [v for v in chosen if math.exp(-v) < p] if p < 1 else chosen
        crop_losses.append(sum(chosen) / len(chosen) if chosen else 0.0)
    return sum(crop_losses) / len(crop_losses) if crop_losses else 0.0


def _segmentation_batch(seed, n=4, c=5, h=6, w=7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, h, w, generator=g, dtype=torch.float64) * 2
    target = torch.randint(0, c, (n, h, w), generator=g)
    target[torch.rand(n, h, w, generator=g) < 0.25] = VOID
    target[1] = VOID  # one crop entirely void
    # a crop predicted confidently right everywhere: no hard pixel below p = 0.6
    target[2, :, :] = 0
    logits[2] = -4.0
    logits[2, 0] = 4.0
    return logits, target


@pytest.mark.parametrize("p, m", [(1.0, 0.25), (1.0, 0.3), (1.0, 1.0), (0.6, 0.25),
                                  (0.6, 0.5), (0.6, 1.0), (0.3, 0.8), (0.999, 1 / 3)])
def test_loss_matches_naive_per_pixel_reference(p, m):
    logits, target = _segmentation_batch(seed=1)
    criterion = OnlineBootstrappedCrossEntropy(p=p, m=m, ignore_index=VOID)
    got = criterion(logits, target)
    assert got.dtype == torch.float64 and got.dim() == 0
    assert float(got) == pytest.approx(_naive_bootstrapped(logits, target, p, m), rel=1e-12)


def test_loss_paper_setting_is_top_quarter_per_crop():
    """p = 1.0, m = 25% without void pixels: each crop's ceil(25%) worst pixels, averaged over
    the crops (seamseg's ``ohem=.25``)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, 5, 6, generator=g)
    target = torch.randint(0, 4, (3, 5, 6), generator=g)
    pixel = F.cross_entropy(logits, target, reduction="none").flatten(1)
    k = math.ceil(0.25 * 30)
    expected = pixel.topk(k, dim=1).values.mean(dim=1).mean()
    torch.testing.assert_close(OnlineBootstrappedCrossEntropy()(logits, target), expected)
    # m = 1 with p = 1 is the plain cross-entropy of each crop, averaged over the crops
    torch.testing.assert_close(OnlineBootstrappedCrossEntropy(m=1.0)(logits, target),
                               pixel.mean(dim=1).mean())


def test_loss_low_precision_dtypes():
    logits, target = _segmentation_batch(seed=2)
    reference = OnlineBootstrappedCrossEntropy()(logits, target)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        got = OnlineBootstrappedCrossEntropy()(logits.to(dtype), target)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), reference, rtol=2e-2, atol=2e-2)


def test_loss_all_void_batch_is_zero_with_gradient():
    logits = torch.randn(2, 3, 4, 4, requires_grad=True)
    target = torch.full((2, 4, 4), VOID)
    loss = OnlineBootstrappedCrossEntropy()(logits, target)
    assert float(loss.detach()) == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_loss_gradcheck():
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(2, 3, 2, 3, generator=g, dtype=torch.float64) * 3).requires_grad_()
    target = torch.randint(0, 3, (2, 2, 3), generator=g)
    target[0, 0, 0] = VOID
    # the top-k selection is piecewise constant: the losses must be well separated, so that the
    # finite differences do not change which pixels are selected
    pixel = F.cross_entropy(logits.detach(), target, ignore_index=VOID, reduction="none")
    for crop in range(2):
        values = pixel[crop][target[crop] != VOID].sort().values
        assert (values.diff() > 1e-3).all()
        assert ((values - (-math.log(0.5))).abs() > 1e-3).all()
    for p, m in ((1.0, 0.5), (0.5, 0.7), (1.0, 1.0)):
        criterion = OnlineBootstrappedCrossEntropy(p=p, m=m)
        assert torch.autograd.gradcheck(lambda z: criterion(z, target), (logits,))


def test_loss_validates_arguments():
    for name, kwargs in (("p", dict(p=0.0)), ("p", dict(p=1.5)), ("p", dict(p=float("nan"))),
                         ("m", dict(m=0)), ("m", dict(m=-0.1)), ("m", dict(m=1.01)),
                         ("m", dict(m=True)), ("ignore_index", dict(ignore_index=2.5))):
        with pytest.raises(ValueError, match=name):
            OnlineBootstrappedCrossEntropy(**kwargs)
    criterion = OnlineBootstrappedCrossEntropy()
    logits = torch.randn(2, 3, 4, 5)
    with pytest.raises(ValueError, match="target"):
        criterion(logits, torch.zeros(2, 4, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="int64"):
        criterion(logits, torch.zeros(2, 4, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="logits"):
        criterion(logits[0], torch.zeros(4, 5, dtype=torch.int64))
    assert OnlineBootstrappedCrossEntropy(m=1 / 3).kept(torch.tensor([0, 1, 3, 4, 30])).tolist() \
        == [0, 1, 1, 2, 10]
    assert OnlineBootstrappedCrossEntropy(m=0.3).kept(torch.tensor([10, 11])).tolist() == [3, 4]


# --------------------------------------------------------------------------- inference


def _conv1x1(c_in=3, classes=4, seed=0):
    torch.manual_seed(seed)
    conv = nn.Conv2d(c_in, classes, kernel_size=1)
    return conv.eval()


class _WithColumnRamp(nn.Module):
    """A 1x1 conv plus a logit ramp along the width: not flip-equivariant."""

    def __init__(self):
        super().__init__()
        self.conv = _conv1x1()

    def forward(self, x):
        ramp = torch.linspace(0, 2, x.shape[-1])
        bias = torch.stack([ramp, -ramp, 0 * ramp, ramp / 2])
        return self.conv(x) + bias[None, :, None, :]


class _WithTileMean(nn.Module):
    """A 1x1 conv plus the per-channel mean of its input: depends on the tile it sees."""

    def __init__(self):
        super().__init__()
        self.conv = _conv1x1()

    def forward(self, x):
        return self.conv(x) + self.conv(x.mean(dim=(2, 3), keepdim=True)) * 0.5


def test_single_scale_is_the_softmax_of_the_model():
    model = _conv1x1()
    x = torch.randn(2, 3, 9, 11)
    with torch.no_grad():
        got = predict_logits(model, x, num_classes=4)
        assert got.dtype == torch.float32 and got.shape == (2, 4, 9, 11)
        torch.testing.assert_close(got, model(x).softmax(1))
        # window larger than the image: runs whole
        torch.testing.assert_close(predict_logits(model, x, window=16, num_classes=4),
                                   model(x).softmax(1))


def test_flip():
    x = torch.randn(2, 3, 8, 10)
    with torch.no_grad():
        model = _conv1x1()
        torch.testing.assert_close(predict_logits(model, x, flip=True, num_classes=4),
                                   predict_logits(model, x, num_classes=4))
        ramp = _WithColumnRamp()
        expected = (ramp(x).softmax(1) + ramp(x.flip(-1)).flip(-1).softmax(1)) / 2
        torch.testing.assert_close(predict_logits(ramp, x, flip=True, num_classes=4), expected)


def test_window_starts():
    assert window_starts(10, 4, 1 / 3) == [0, 3, 6]
    assert window_starts(7, 4, 1 / 3) == [0, 3]
    assert window_starts(4, 4, 1 / 3) == [0]
    assert window_starts(8, 4, 0.0) == [0, 4]
    assert window_starts(9, 3, 1 / 3) == [0, 2, 4, 6]


@pytest.mark.parametrize("shape", [(2, 3, 10, 7), (1, 3, 10, 3), (1, 3, 5, 13)])
def test_sliding_window_of_a_1x1_conv_equals_the_whole_image(shape):
    model = _conv1x1()
    x = torch.randn(*shape)
    with torch.no_grad():
        whole = predict_logits(model, x, num_classes=4)
        tiled = predict_logits(model, x, window=4, num_classes=4)
        torch.testing.assert_close(tiled, whole)
        torch.testing.assert_close(predict_logits(model, x, window=4, flip=True,
                                                  scales=(1.0, 1.5), num_classes=4),
                                   predict_logits(model, x, flip=True, scales=(1.0, 1.5),
                                                  num_classes=4))


def test_sliding_window_averages_overlapping_logits():
    """Tiles at rows 0, 3, 6 and columns 0, 3 of a 10 x 7 image (window 4, overlap 1/3), each
    with its own tile mean; the logits of the tiles covering a pixel are averaged."""
    model = _WithTileMean()
    x = torch.randn(2, 3, 10, 7)
    with torch.no_grad():
        total = torch.zeros(2, 4, 10, 7)
        count = torch.zeros(10, 7)
        for top in (0, 3, 6):
            for left in (0, 3):
                total[:, :, top:top + 4, left:left + 4] += model(x[:, :, top:top + 4,
                                                                   left:left + 4])
                count[top:top + 4, left:left + 4] += 1
        expected = (total / count).softmax(1)
        torch.testing.assert_close(predict_logits(model, x, window=4, num_classes=4), expected)
        # a padded side: the 3-wide image is padded with zeros to the window, then cropped
        x3 = x[:, :, :, :3]
        padded = F.pad(x3, (0, 1))
        total = torch.zeros(2, 4, 10, 4)
        count = torch.zeros(10, 4)
        for top in (0, 3, 6):
            total[:, :, top:top + 4] += model(padded[:, :, top:top + 4])
            count[top:top + 4] += 1
        expected = (total / count)[..., :3].softmax(1)
        torch.testing.assert_close(predict_logits(model, x3, window=4, num_classes=4), expected)


def test_multi_scale_of_a_1x1_conv_is_close_to_single_scale_on_a_smooth_image():
    model = _conv1x1()
    ys, xs = torch.meshgrid(torch.linspace(0, 1, 48), torch.linspace(0, 1, 40), indexing="ij")
    x = torch.stack([torch.sin(2 * ys), torch.cos(3 * xs), ys * xs])[None] * 2
    with torch.no_grad():
        single = predict_logits(model, x, num_classes=4)
        multi = predict_logits(model, x, scales=(0.75, 1.0, 1.25, 2.0), num_classes=4)
        assert multi.shape == single.shape
        torch.testing.assert_close(multi.sum(1), torch.ones(1, 48, 40))
        # bilinear resampling at the borders shifts by under a pixel: small on a smooth image
        assert (multi - single).abs().max() < 2e-2
        # the scales really run: a manual average of the two resized softmaxes
        half = F.interpolate(x, size=(24, 20), mode="bilinear", align_corners=False)
        back = F.interpolate(model(half), size=(48, 40), mode="bilinear", align_corners=False)
        torch.testing.assert_close(predict_logits(model, x, scales=(0.5, 1.0), num_classes=4),
                                   (back.softmax(1) + model(x).softmax(1)) / 2)


def test_predict_logits_validates():
    model = _conv1x1()
    x = torch.randn(1, 3, 4, 4)
    for kwargs, name in ((dict(scales=()), "scales"), (dict(scales=(1.0, 0)), "scales"),
                         (dict(scales=(True,)), "scales"), (dict(window=0), "window"),
                         (dict(window=2.5), "window"), (dict(window=4, overlap=1.0), "overlap")):
        with pytest.raises(ValueError, match=name):
            predict_logits(model, x, num_classes=4, **kwargs)
    with pytest.raises(ValueError, match="num_classes"):
        predict_logits(model, x, num_classes=5)


class _ArgmaxOfChannels(nn.Module):
    """Logits of 4 classes = the image's 3 channels and a 4th class that is never predicted
    (prediction: the argmax channel); records that it runs in eval mode under no_grad."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.eye(4, 3).view(4, 3, 1, 1))
            self.conv.bias.copy_(torch.tensor([0.0, 0.0, 0.0, -100.0]))
        self.calls = []

    def forward(self, x):
        self.calls.append((self.training, torch.is_grad_enabled()))
        return self.conv(x)


def _eval_data(seed=0, batches=4, batch=2, h=6, w=5):
    g = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(batches):
        images = torch.randn(batch, 3, h, w, generator=g)
        target = torch.randint(0, 3, (batch, h, w), generator=g)
        target[torch.rand(batch, h, w, generator=g) < 0.2] = VOID
        data.append((images, target))
    return data


def _expected_cm(data, num_classes):
    return sum(confusion_matrix(images.argmax(1), target, num_classes) for images, target in data)


def test_evaluate_segmentation_known_model():
    data = _eval_data()
    num_classes = 4  # class 3 never occurs in truth nor prediction: None
    model = _ArgmaxOfChannels().train()
    result = evaluate_segmentation(model, data, "cpu", num_classes=num_classes)
    cm = _expected_cm(data, num_classes)
    assert result["count"] == 8
    assert result["miou"] == pytest.approx(mean_iou(cm))
    assert result["pixel_accuracy"] == pytest.approx(pixel_accuracy(cm))
    expected_iou = iou_from_confusion(cm).tolist()
    assert result["iou_per_class"][:3] == pytest.approx(expected_iou[:3])
    assert result["iou_per_class"][3] is None
    assert model.training  # mode restored
    assert model.calls and all(call == (False, False) for call in model.calls)
    # flipping / several scales of a per-pixel model agree on this data (no resampling at 1.0)
    flipped = evaluate_segmentation(model, data, "cpu", num_classes=num_classes, flip=True,
                                    window=4)
    assert flipped["miou"] == pytest.approx(result["miou"])
    with pytest.raises(ValueError, match="no images"):
        evaluate_segmentation(model, [], "cpu", num_classes=num_classes)
    with pytest.raises(ValueError, match="scales"):
        evaluate_segmentation(model, data, "cpu", num_classes=num_classes, scales=(-1.0,))


# --------------------------------------------------------------------------- 2 gloo ranks

WORLD_SIZE = 2
NUM_CLASSES = 4
DDP_TIMEOUT_S = 120


def _ddp_worker(rank, world_size, init_method, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=DDP_TIMEOUT_S))
    try:
        data = _eval_data()
        shard = data[rank::world_size]  # each rank: half of the batches
        local = _expected_cm(shard, NUM_CLASSES)
        summed = all_reduce_confusion(local)
        result = evaluate_segmentation(_ArgmaxOfChannels(), shard, "cpu",
                                       num_classes=NUM_CLASSES)
        torch.save({"local": local, "summed": summed, "result": result},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_confusion_summed_over_two_gloo_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    init_method = (tmp_path / "rendezvous").as_uri()  # no port: no race with other tests
    context = mp.spawn(_ddp_worker, args=(WORLD_SIZE, init_method, str(tmp_path)),
                       nprocs=WORLD_SIZE, join=False)
    deadline = time.monotonic() + DDP_TIMEOUT_S
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail("gloo workers did not finish in time")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    data = _eval_data()
    full = _expected_cm(data, NUM_CLASSES)
    single = evaluate_segmentation(_ArgmaxOfChannels(), data, "cpu", num_classes=NUM_CLASSES)
    assert not torch.equal(results[0]["local"], full)  # each rank really holds a part
    assert torch.equal(results[0]["local"] + results[1]["local"], full)
    for r in results:
        assert r["summed"].dtype == torch.int64
        assert torch.equal(r["summed"], full)
        assert r["result"] == single  # every rank gets the whole set's metrics, count 8
    assert single["count"] == 8
