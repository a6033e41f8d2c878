"""The prediction command (``python -m experiments.train.seg_predict``): a trained segmentation
point's predictions written in each benchmark's format, read back by that format's rules, and
scored from the written files to the mIoU the point reported.

The references are the official tools' rules, restated here independently of the code under
test: cityscapesScripts' ``evalPixelLevelSemanticLabeling.py`` (one ``<city>_<seq>_<frame>*.png``
per ground-truth file anywhere under the results folder, same size, one channel, label ids;
the confusion over label ids, ``IoU = TP / (TP + FP + FN)`` with false positives counted on
non-ignored ground truth only, the mean over the classes whose IoU is defined), Mapillary
Vistas' (8-bit PNG ``<key>.png`` of indices into the config's labels) and cocostuffapi's
(compressed-RLE masks per stuff category, decoded as ``maskApi.c``'s ``rleFrString``).
"""
import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from experiments.train import seg_predict
from experiments.train.data import COCOStuff, Cityscapes, Vistas
from experiments.train.data.generate_segmentation import (generate_cityscapes,
                                                          generate_cocostuff, generate_vistas)
from experiments.train.segmentation.submission import SubmissionWriter, coco_rle

ROOT = Path(__file__).resolve().parents[1]
#: cityscapesScripts labels.py: the 19 evaluated label ids, in train-id order.
CITYSCAPES_EVAL_IDS = [7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33]
SMALL = ((64, 48), (48, 64))
#: dataset -> (generator, labelled split, test split or None).
TREES = {
    "cityscapes": (lambda root: generate_cityscapes(root, train_images=4, val_images=2,
                                                    size=(64, 32)), "val", "test"),
    "vistas": (lambda root: generate_vistas(root, train_images=3, val_images=2, test_images=2,
                                            sizes=SMALL), "validation", "testing"),
    "cocostuff": (lambda root: generate_cocostuff(root, train_images=3, val_images=2,
                                                  sizes=SMALL), "val", None),
}


def _run(module, *args):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module", params=sorted(TREES))
def trained(request, tmp_path_factory):
    """``(dataset, root, point JSON, weights)``: a tiny DeepLabV3 trained for a few steps, with a
    single-scale and a two-scale flipped evaluation."""
    dataset = request.param
    work = tmp_path_factory.mktemp(dataset)
    root = TREES[dataset][0](work / "data")
    done = _run("experiments.iabn_table2_segmentation", "--dataset", dataset, "--data", root,
                "--body", "resnext101", "--model-arg", "width=0.03125", "--norm", "iabn_sync",
                "--crops", "2", "--crop", "32", "--epochs", "3", "--lr", "0.05",
                "--bootstrap-m", "1", "--eval", "single=1:noflip", "--eval", "ms_flip=1,1.5:flip",
                "--out", work / "p.json", "--epochs-csv", work / "p.csv", "--weights",
                work / "p.pt", "--work-dir", work / "w")
    assert done.returncode == 0, done.stderr[-3000:]
    return dataset, root, work / "p.json", work / "p.pt"


def _predict(trained, split, evaluation, folder):
    """The command in this process (it sets torch's threads as a point does)."""
    dataset, root, point, weights = trained
    seg_predict.main([str(a) for a in (
        "--point", point, "--weights", weights, "--data", root, "--split", split, "--eval",
        evaluation, "--predictions", folder, "--out", folder.with_suffix(".json"))])
    return json.loads(folder.with_suffix(".json").read_text())["results"][0]


def _read_png(path):
    with Image.open(path) as image:
        assert image.mode in ("L", "P"), path  # one channel, 8 bits
        return np.asarray(image)


def _cityscapes_prediction(folder, gt):
    """The evaluator's ``getPrediction``: exactly one ``<city>_<seq>_<frame>*.png`` under
    ``folder``."""
    city, seq, frame = gt.name.split("_")[:3]
    found = [Path(r) / f for r, _, files in os.walk(folder)
             for f in fnmatch.filter(files, f"{city}_{seq}_{frame}*.png")]
    assert len(found) == 1, (gt, found)
    return found[0]


def _cityscapes_miou(folder, root, split):
    """cityscapesScripts' mIoU of the predictions in ``folder`` over the labelIds of ``split``."""
    conf = np.zeros((256, 256), np.int64)
    for gt in sorted((root / "gtFine" / split).rglob("*_gtFine_labelIds.png")):
        truth = _read_png(gt)
        prediction = _read_png(_cityscapes_prediction(folder, gt))
        assert prediction.shape == truth.shape  # full resolution
        assert set(np.unique(prediction).tolist()) <= set(CITYSCAPES_EVAL_IDS)
        np.add.at(conf, (truth.ravel(), prediction.ravel()), 1)
    ious = []
    for label in CITYSCAPES_EVAL_IDS:
        tp = conf[label, label]
        fn = conf[label].sum() - tp
        fp = conf[CITYSCAPES_EVAL_IDS, label].sum() - tp
        ious.append(tp / (tp + fp + fn) if tp + fp + fn else np.nan)
    return 100 * np.nanmean(ious)


def _vistas_miou(folder, root, split):
    """The mIoU over the config's evaluated labels of the ``<key>.png`` label-index maps."""
    config = json.loads((root / "config.json").read_text())["labels"]
    evaluated = [i for i, label in enumerate(config) if label["evaluate"]]
    conf = np.zeros((256, 256), np.int64)
    for image in sorted((root / split / "images").glob("*.jpg")):
        prediction = _read_png(folder / f"{image.stem}.png")
        with Image.open(image) as rgb:
            assert prediction.shape == (rgb.height, rgb.width)
        assert set(np.unique(prediction).tolist()) <= set(evaluated)
        truth_file = root / split / "labels" / f"{image.stem}.png"
        if truth_file.exists():
            np.add.at(conf, (_read_png(truth_file).ravel(), prediction.ravel()), 1)
    return _mean_iou(conf, evaluated)


def _mean_iou(conf, labels):
    """Mean IoU over ``labels`` (ground truth outside them void), classes with a defined IoU."""
    conf = conf[np.ix_(labels, labels)]
    tp = np.diag(conf)
    union = conf.sum(0) + conf.sum(1) - tp
    return 100 * np.mean(tp[union > 0] / union[union > 0])


def _rle_decode(rle):
    """``maskApi.c``'s ``rleFrString`` and ``rleDecode``: the string back to the mask."""
    s, counts, p = rle["counts"], [], 0
    while p < len(s):
        x, k, more = 0, 0, True
        while more:
            c = ord(s[p]) - 48
            x |= (c & 0x1F) << 5 * k
            more = bool(c & 0x20)
            p, k = p + 1, k + 1
            if not more and c & 0x10:
                x |= -1 << 5 * k
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    h, w = rle["size"]
    flat = np.repeat(np.arange(len(counts)) % 2, counts).astype(bool)
    assert flat.size == h * w
    return flat.reshape((w, h)).T


def _cocostuff_miou(folder, root, split):
    """The result JSON decoded per image (each pixel one stuff id, as the PNG beside it), then
    the mIoU over the 91 stuff classes with unlabeled (0) and 'other' (183) void."""
    annotations = json.loads((folder / f"stuff_{split}2017_results.json").read_text())
    conf = np.zeros((256, 256), np.int64)
    for truth_file in sorted((root / "annotations" / f"stuff_{split}2017_pixelmaps").glob("*")):
        prediction = _read_png(folder / truth_file.name)
        truth = _read_png(truth_file)
        assert prediction.shape == truth.shape
        decoded = np.zeros_like(prediction)
        for ann in annotations:
            if ann["image_id"] == int(truth_file.stem):
                mask = _rle_decode(ann["segmentation"])
                assert not decoded[mask].any() and ann["category_id"] in range(92, 183)
                decoded[mask] = ann["category_id"]
        assert (decoded == prediction).all()
        np.add.at(conf, (truth.ravel(), prediction.ravel()), 1)
    return _mean_iou(conf, list(range(92, 183)))


MIOU = {"cityscapes": _cityscapes_miou, "vistas": _vistas_miou, "cocostuff": _cocostuff_miou}


@pytest.mark.parametrize("evaluation", ["single", "ms_flip"])
def test_predictions_read_back_officially_score_the_points_miou(trained, tmp_path, evaluation):
    dataset, root, point, _ = trained
    split = TREES[dataset][1]
    row = _predict(trained, split, evaluation, tmp_path / "pred")
    reported = {r["eval"]: r for r in json.loads(point.read_text())["results"]}[evaluation]
    assert row["scales"] == reported["scales"] and row["flip"] == reported["flip"]
    recomputed = MIOU[dataset](tmp_path / "pred", root, split)
    assert recomputed == pytest.approx(reported["miou_pct"], abs=1e-9)
    assert row["miou_pct"] == pytest.approx(reported["miou_pct"], abs=1e-9)
    assert row["point_miou_pct"] == reported["miou_pct"]


def test_the_folder_holds_exactly_the_servers_files(trained, tmp_path):
    """The test split where the release has one (COCO-Stuff's loader: val), each image's file
    of its name and size and nothing else (COCO-Stuff: and the result JSON)."""
    dataset, root, _, _ = trained
    split = TREES[dataset][2] or TREES[dataset][1]
    row = _predict(trained, split, "ms_flip", tmp_path / "pred")
    if split == TREES[dataset][2]:
        assert row["miou_pct"] is None  # the test labels are the server's
    folder = tmp_path / "pred"
    if dataset == "cityscapes":
        images = sorted((root / "leftImg8bit" / split).rglob("*_leftImg8bit.png"))
        names = [image.name for image in images]
    else:
        folder_of = {"vistas": root / split / "images", "cocostuff": root / "images" / "val2017"}
        images = sorted(folder_of[dataset].glob("*.jpg"))
        names = [f"{image.stem}.png" for image in images]
    extra = {f"stuff_{split}2017_results.json"} if dataset == "cocostuff" else set()
    assert {p.name for p in folder.iterdir()} == set(names) | extra
    assert row["files"] == len(images) + len(extra)
    for image, name in zip(images, names):
        with Image.open(image) as rgb:
            assert _read_png(folder / name).shape == (rgb.height, rgb.width)


@pytest.mark.parametrize("extra, message", [
    (["--split", "train_extra"], "--split train_extra"),
    (["--eval", "ten_scales"], "--eval ten_scales: the point"),
    (["--predictions", "EXISTING"], "exists"),
])
def test_bad_options_are_refused_before_anything_is_written(trained, tmp_path, capsys, extra,
                                                             message):
    dataset, root, point, weights = trained
    (tmp_path / "EXISTING").mkdir()
    options = {"--point": point, "--weights": weights, "--data": root,
               "--split": TREES[dataset][1], "--predictions": tmp_path / "pred",
               "--out": tmp_path / "r.json"}
    options.update({extra[0]: tmp_path / extra[1] if extra[1] == "EXISTING" else extra[1]})
    with pytest.raises(SystemExit) as exit_:
        seg_predict.main([str(a) for item in options.items() for a in item])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["EXISTING"]


def test_weights_of_another_network_are_named(trained, tmp_path, capsys):
    dataset, root, point, _ = trained
    torch.save({"conv.weight": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(SystemExit) as exit_:
        seg_predict.main([str(a) for a in (
            "--point", point, "--weights", tmp_path / "other.pt", "--data", root, "--split",
            TREES[dataset][1], "--predictions", tmp_path / "pred", "--out", tmp_path / "r.json")])
    assert exit_.value.code == 2 and f"--weights {tmp_path / 'other.pt'}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.pt"]


# --------------------------------------------------------------------------- the writers

def _every_train_id(split_set, index=0):
    """A prediction of the sample's size cycling through every train id."""
    height, width = split_set[index][1].shape
    ids = torch.arange(height * width) % split_set.num_classes
    return ids.reshape(1, height, width)


def test_cityscapes_writer_maps_train_ids_to_label_ids(tmp_path):
    root = generate_cityscapes(tmp_path / "cs", train_images=2, val_images=1, size=(64, 32))
    val = Cityscapes(root, "val")
    writer = SubmissionWriter("cityscapes", val, tmp_path)
    prediction = _every_train_id(val)
    writer(prediction)
    [path] = writer.finish()
    assert path.name == val.samples[0][0].name
    expected = np.array(CITYSCAPES_EVAL_IDS)[prediction[0].numpy()]
    assert (_read_png(path) == expected).all()


def test_vistas_writer_maps_train_ids_to_config_indices(tmp_path):
    """With label 1 not evaluated, train id 1 is label 2: the writer inverts the config."""
    root = generate_vistas(tmp_path / "v", train_images=1, val_images=1, test_images=1,
                           sizes=SMALL)
    config = json.loads((root / "config.json").read_text())
    config["labels"][1]["evaluate"] = False
    (root / "config.json").write_text(json.dumps(config))
    val = Vistas(root, "validation")
    writer = SubmissionWriter("vistas", val, tmp_path)
    prediction = _every_train_id(val)
    writer(prediction)
    [path] = writer.finish()
    evaluated = [i for i, label in enumerate(config["labels"]) if label["evaluate"]]
    assert path.name == val.samples[0][0].stem + ".png"
    assert (_read_png(path) == np.array(evaluated)[prediction[0].numpy()]).all()


def test_cocostuff_writer_writes_stuff_ids_and_their_rle(tmp_path):
    root = generate_cocostuff(tmp_path / "c", train_images=1, val_images=1, sizes=SMALL)
    val = COCOStuff(root, "val")
    writer = SubmissionWriter("cocostuff", val, tmp_path)
    prediction = _every_train_id(val)
    writer(prediction)
    png, results = writer.finish()
    assert (_read_png(png) == prediction[0].numpy() + 92).all()
    annotations = json.loads(results.read_text())
    assert results.name == "stuff_val2017_results.json"
    assert sorted(a["category_id"] for a in annotations) == list(range(92, 183))
    for ann in annotations:
        assert ann["image_id"] == int(png.stem)
        assert (_rle_decode(ann["segmentation"]) == (_read_png(png) == ann["category_id"])).all()


def test_writer_refuses_a_missing_or_extra_prediction(tmp_path):
    root = generate_cityscapes(tmp_path / "cs", train_images=2, val_images=1, size=(64, 32))
    val = Cityscapes(root, "val")
    writer = SubmissionWriter("cityscapes", val, tmp_path)
    with pytest.raises(ValueError, match="0 predictions for 1 images"):
        writer.finish()
    writer(_every_train_id(val))
    with pytest.raises(ValueError, match="more predictions"):
        writer(_every_train_id(val))


@pytest.mark.parametrize("mask, counts", [
    (np.ones((2, 2)), "04"),           # pycocotools.mask.encode: b'04'
    (np.zeros((2, 3)), "6"),
    (np.array([[0, 1], [1, 1]]), "13"),
])
def test_coco_rle_known_strings(mask, counts):
    assert coco_rle(mask) == {"size": list(mask.shape), "counts": counts}


def test_coco_rle_round_trips_random_masks():
    rng = np.random.default_rng(0)
    for shape in ((1, 1), (7, 5), (40, 33), (3, 200)):
        for density in (0.02, 0.5, 0.98):
            mask = rng.random(shape) < density
            assert (_rle_decode(coco_rle(mask)) == mask).all()
