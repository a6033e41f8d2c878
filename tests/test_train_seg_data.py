"""experiments.train.data, segmentation: the Cityscapes, COCO-Stuff and Vistas loaders on tiny
trees in their released layouts (written here with PIL, independent of the generators), their
errors for broken trees, the paper's joint transforms, class-uniform sampling and
make_loader(train_sampler=...)."""
import json
import shutil
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from experiments.train.data import (ClassUniformSampler, COCOStuff, Cityscapes,
                                    DatasetLayoutError, SegmentationDataset, SegmentationEval,
                                    SegmentationTrain, Vistas, make_loader)
from experiments.train.data import cityscapes as cs
from experiments.train.data import cocostuff as coco
from experiments.train.data.loaders import SeededSampler, sample_seed
from experiments.train.data.transforms import IMAGENET_MEAN, IMAGENET_STD

W, H = 16, 8  # Cityscapes keeps 2:1


def _save(path, array, mode=None, palette=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(np.asarray(array, dtype=np.uint8))
    if mode == "P":
        image = image.convert("L")
        image = Image.frombytes("P", image.size, image.tobytes())
        image.putpalette(palette)
    image.save(path)


def _rgb(seed, h=H, w=W):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _cs_label(rare=False):
    """labelIds: columns 0-3 car (26), 4-7 unlabeled (0), 8-15 road (7); ``rare`` adds a
    2x2 person (24) block."""
    label = np.full((H, W), 7, np.uint8)
    label[:, :4], label[:, 4:8] = 26, 0
    if rare:
        label[:2, 8:10] = 24
    return label


def make_cityscapes(root, *, test_labels=False, coarse=False):
    cities = {"train": ["aachen", "bochum"], "val": ["frankfurt"], "test": ["berlin"]}
    if coarse:
        cities["train_extra"] = ["erlangen"]
    for split, names in cities.items():
        for ci, city in enumerate(names):
            for k in range(2):
                stem = f"{city}_{k:06d}_000019"
                _save(root / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png",
                      _rgb(10 * ci + k))
                if split == "train_extra":
                    _save(root / "gtCoarse" / split / city / f"{stem}_gtCoarse_labelIds.png",
                          np.full((H, W), 33, np.uint8))  # bicycle
                    continue
                if split == "test" and not test_labels:
                    continue
                gt = root / "gtFine" / split / city
                label = _cs_label(rare=(split == "train" and ci == 1 and k == 1))
                _save(gt / f"{stem}_gtFine_labelIds.png", label)
                _save(gt / f"{stem}_gtFine_color.png", _rgb(0))           # ignored
                _save(gt / f"{stem}_gtFine_instanceIds.png", label)      # ignored
    return root


def make_cocostuff(root):
    """Two train and one val pixel maps; one train map is a palette PNG; one extra train
    image has no pixel map (not annotated)."""
    label = np.full((12, 10), 92, np.uint8)            # banner -> 0
    label[:3], label[3:6], label[6:9] = 183, 0, 182    # other, unlabeled -> 255; wood -> 90
    for split, ids in (("train", [9, 25]), ("val", [139])):
        for n, i in enumerate(ids):
            name = f"{i:012d}"
            Image.fromarray(_rgb(i, 12, 10)).save(
                _mk(root / "images" / f"{split}2017") / f"{name}.jpg")
            mode = "P" if (split, n) == ("train", 1) else None
            _save(root / "annotations" / f"stuff_{split}2017_pixelmaps" / f"{name}.png",
                  label, mode, palette=list(range(256)) * 3)
    Image.fromarray(_rgb(0, 12, 10)).save(root / "images" / "train2017" / "000000000030.jpg")
    return root


VISTAS_LABELS = [
    {"name": "construction--flat--road", "readable": "Road", "color": [128, 64, 128],
     "instances": False, "evaluate": True},
    {"name": "nature--ignored", "readable": "Ignored", "color": [1, 2, 3],
     "instances": False, "evaluate": False},
    {"name": "object--vehicle--car", "readable": "Car", "color": [0, 0, 142],
     "instances": True, "evaluate": True},
    {"name": "void--unlabeled", "readable": "Unlabeled", "color": [0, 0, 0],
     "instances": False, "evaluate": False},
]


def make_vistas(root, config="config.json", labels="labels"):
    """A tiny Vistas tree: the v1.x archive's layout, or with ``config="config_v1.2.json",
    labels="v1.2/labels"`` the v2.0 download's research edition v1.2."""
    root.mkdir(parents=True, exist_ok=True)
    (root / config).write_text(json.dumps({"labels": VISTAS_LABELS}))
    palette = [c for lab in VISTAS_LABELS for c in lab["color"]]
    palette += [7] * (768 - len(palette))
    label = np.zeros((6, 9), np.uint8)                  # road -> 0
    label[1], label[2], label[3], label[4] = 1, 2, 3, 3  # 255, car -> 1, 255, 255
    for split, keys in (("training", ["a" * 22, "b" * 22, "c" * 22]),
                        ("validation", ["d" * 22]), ("testing", ["e" * 22, "f" * 22])):
        for i, key in enumerate(keys):
            Image.fromarray(_rgb(i, 6, 9)).save(_mk(root / split / "images") / f"{key}.jpg")
            if split != "testing":
                _save(root / split / labels / f"{key}.png", label, "P", palette)
    return root


def _mk(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def cityscapes(tmp_path_factory):
    return make_cityscapes(tmp_path_factory.mktemp("cityscapes"), coarse=True)


@pytest.fixture(scope="module")
def cocostuff(tmp_path_factory):
    return make_cocostuff(tmp_path_factory.mktemp("cocostuff"))


@pytest.fixture(scope="module")
def vistas(tmp_path_factory):
    return make_vistas(tmp_path_factory.mktemp("vistas"))


def _raises_layout(match_path, fn, *args, **kwargs):
    with pytest.raises(DatasetLayoutError) as info:
        fn(*args, **kwargs)
    assert str(match_path) in str(info.value), str(info.value)
    assert "Expected layout" in str(info.value)
    return info.value


# ---------------------------------------------------------------------------------------------
# Loaders on good trees


def test_cityscapes(cityscapes):
    ds = Cityscapes(cityscapes, "train")
    assert isinstance(ds, SegmentationDataset) and len(ds) == 4 and ds.num_fine == 4
    assert ds.num_classes == 19 and ds.classes[13] == "car" and ds.classes[-1] == "bicycle"
    assert ds.IGNORE_INDEX == 255
    image, target = ds[0]
    assert isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (W, H)
    assert isinstance(target, np.ndarray) and target.dtype == np.uint8 and target.shape == (H, W)
    assert (target[:, :4] == 13).all() and (target[:, 4:8] == 255).all()
    assert (target[:, 8:] == 0).all()
    # every labelId of the official table, and the void ones
    assert [int(cs.LUT[i]) for i in range(34)] == [
        255] * 7 + [0, 1, 255, 255, 2, 3, 4, 255, 255, 255, 5, 255, 6, 7, 8, 9, 10, 11, 12, 13,
                    14, 15, 255, 255, 16, 17, 18]
    assert ds.class_presence() == [[0, 13], [0, 13], [0, 13], [0, 11, 13]]
    assert len(Cityscapes(cityscapes, "val")) == 2
    test = Cityscapes(cityscapes, "test")
    assert len(test) == 2 and all(label is None for _, label in test.samples)
    assert (test[1][1] == 255).all() and test.class_presence() == [[], []]
    both = Cityscapes(cityscapes, "train", coarse=True)
    assert len(both) == 6 and both.num_fine == 4
    assert (both[5][1] == 18).all() and "gtCoarse" in str(both.samples[5][1])
    with pytest.raises(ValueError, match="coarse"):
        Cityscapes(cityscapes, "val", coarse=True)
    with pytest.raises(ValueError, match="split"):
        Cityscapes(cityscapes, "training")


def test_cityscapes_test_labels_used_when_present(tmp_path):
    root = make_cityscapes(tmp_path / "cs", test_labels=True)
    test = Cityscapes(root, "test")
    assert all(label is not None for _, label in test.samples)
    assert (test[0][1][:, :4] == 13).all()


def test_cocostuff(cocostuff):
    ds = COCOStuff(cocostuff, "train")
    assert len(ds) == 2  # the image without a pixel map is not a sample
    assert ds.num_classes == 91 and len(set(ds.classes)) == 91
    assert ds.classes[0] == "banner" and ds.classes[90] == "wood"
    assert ds.classes[coco.CLASSES.index("sky-other")] == "sky-other"
    assert coco.CLASSES.index("sky-other") == 157 - 92
    for i in range(2):  # an "L" and a "P" pixel map read alike
        image, target = ds[i]
        assert image.size == (10, 12) and target.shape == (12, 10)
        assert (target[:6] == 255).all() and (target[6:9] == 90).all()
        assert (target[9:] == 0).all()
    assert ds.samples[0][0].name == "000000000009.jpg"
    assert int(coco.LUT[92]) == 0 and int(coco.LUT[183]) == 255 and int(coco.LUT[0]) == 255
    assert int(coco.LUT[91]) == 255 and int(coco.LUT[182]) == 90
    assert ds.class_presence() == [[0, 90], [0, 90]]
    assert len(COCOStuff(cocostuff, "val")) == 1
    with pytest.raises(ValueError, match="split"):
        COCOStuff(cocostuff, "test")


@pytest.fixture(scope="module", params=["v1", "v2_download"])
def vistas_any(request, tmp_path_factory):
    """The tiny Vistas tree in each released layout: ``config.json`` and ``<split>/labels/``;
    the v2.0 download's ``config_v1.2.json`` and ``<split>/v1.2/labels/``."""
    names = {"v1": ("config.json", "labels"),
             "v2_download": ("config_v1.2.json", "v1.2/labels")}[request.param]
    return make_vistas(tmp_path_factory.mktemp(f"vistas_{request.param}"), *names)


def test_vistas(vistas_any):
    vistas = vistas_any
    ds = Vistas(vistas, "training")
    assert len(ds) == 3 and ds.classes == ["Road", "Car"] and ds.num_classes == 2
    assert ds.names == ["construction--flat--road", "object--vehicle--car"]
    image, target = ds[0]
    assert image.size == (9, 6) and target.shape == (6, 9)
    # palette indices, not colours: 0 -> 0, 1 (evaluate false) -> 255, 2 -> 1, 3 -> 255
    assert (target[0] == 0).all() and (target[5] == 0).all() and (target[2] == 1).all()
    assert (target[[1, 3, 4]] == 255).all()
    assert ds.class_presence() == [[0, 1]] * 3
    assert len(Vistas(vistas, "validation")) == 1
    test = Vistas(vistas, "testing")
    assert len(test) == 2 and (test[0][1] == 255).all()


# ---------------------------------------------------------------------------------------------
# Broken trees


def test_cityscapes_broken_trees(cityscapes, tmp_path):
    root = shutil.copytree(cityscapes, tmp_path / "cs")
    _raises_layout(tmp_path / "nowhere", Cityscapes, tmp_path / "nowhere", "train")
    shutil.rmtree(root / "gtFine" / "val")
    _raises_layout(root / "gtFine" / "val", Cityscapes, root, "val")
    shutil.rmtree(root / "leftImg8bit" / "val")
    _raises_layout(root / "leftImg8bit" / "val", Cityscapes, root, "val")
    label = root / "gtFine/train/aachen/aachen_000001_000019_gtFine_labelIds.png"
    label.unlink()
    err = _raises_layout(label, Cityscapes, root, "train")
    assert "aachen_000001_000019_leftImg8bit.png" in str(err)
    for p in (root / "leftImg8bit" / "test").iterdir():
        shutil.rmtree(p)
    _raises_layout(root / "leftImg8bit" / "test", Cityscapes, root, "test")


def test_cityscapes_coarse_needs_its_labels(cityscapes, tmp_path):
    root = shutil.copytree(cityscapes, tmp_path / "cs")
    shutil.rmtree(root / "gtCoarse")
    Cityscapes(root, "train")
    _raises_layout(root / "gtCoarse" / "train_extra", Cityscapes, root, "train", coarse=True)


def test_label_of_another_size_names_both_files(cityscapes, tmp_path):
    root = shutil.copytree(cityscapes, tmp_path / "cs")
    ds = Cityscapes(root, "val")
    image_path, label_path = ds.samples[1]
    _save(label_path, np.full((H, W + 2), 7, np.uint8))
    err = _raises_layout(label_path, ds.__getitem__, 1)
    assert str(image_path) in str(err) and f"{W + 2}x{H}" in str(err) and f"{W}x{H}" in str(err)
    _save(label_path, _rgb(0))  # an RGB "label map"
    _raises_layout(label_path, ds.__getitem__, 1)
    label_path.write_bytes(b"not a png")
    _raises_layout(label_path, ds.__getitem__, 1)
    _raises_layout(label_path, ds.class_presence)


def test_cocostuff_broken_trees(cocostuff, tmp_path):
    root = shutil.copytree(cocostuff, tmp_path / "coco")
    (root / "images" / "val2017" / "000000000139.jpg").unlink()
    err = _raises_layout(root / "images" / "val2017" / "000000000139.jpg", COCOStuff, root, "val")
    assert "stuff_val2017_pixelmaps" in str(err)
    shutil.rmtree(root / "annotations" / "stuff_train2017_pixelmaps")
    _raises_layout(root / "annotations" / "stuff_train2017_pixelmaps", COCOStuff, root, "train")
    shutil.rmtree(root / "images" / "train2017")
    _raises_layout(root / "images" / "train2017", COCOStuff, root, "train")


def test_vistas_broken_trees(vistas, tmp_path):
    root = shutil.copytree(vistas, tmp_path / "v")
    config = root / "config.json"
    for text in ("{not json", json.dumps({"classes": []}), json.dumps({"labels": [{"x": 1}]}),
                 json.dumps({"labels": [dict(VISTAS_LABELS[0], evaluate=False)]})):
        config.write_text(text)
        _raises_layout(config, Vistas, root, "training")
    config.unlink()
    _raises_layout(config, Vistas, root, "training")
    config.write_text(json.dumps({"labels": VISTAS_LABELS}))
    label = root / "training" / "labels" / f"{'b' * 22}.png"
    label.unlink()
    _raises_layout(label, Vistas, root, "training")
    shutil.rmtree(root / "validation" / "labels")
    _raises_layout(root / "validation" / "labels", Vistas, root, "validation")
    shutil.rmtree(root / "testing" / "images")
    _raises_layout(root / "testing" / "images", Vistas, root, "testing")


def test_vistas_v2_download_missing_v12_labels_is_named(tmp_path):
    root = make_vistas(tmp_path / "v", "config_v1.2.json", "v1.2/labels")
    shutil.rmtree(root / "validation" / "v1.2" / "labels")
    _raises_layout(root / "validation" / "v1.2" / "labels", Vistas, root, "validation")


# ---------------------------------------------------------------------------------------------
# Transforms


def _denorm(x):
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return x * std + mean


def test_segmentation_train_shapes_and_dtypes(cityscapes):
    ds = Cityscapes(cityscapes, "train", SegmentationTrain(12))
    torch.manual_seed(0)
    for i in range(len(ds)):
        x, y = ds[i]
        assert x.shape == (3, 12, 12) and x.dtype == torch.float32
        assert y.shape == (12, 12) and y.dtype == torch.int64
        assert set(y.unique().tolist()) <= {0, 11, 13, 255}
    x, y = Cityscapes(cityscapes, "val", SegmentationEval())[0]
    assert x.shape == (3, H, W) and y.shape == (H, W) and y.dtype == torch.int64
    pixels = np.array(Cityscapes(cityscapes, "val")[0][0], dtype=np.float32) / 255
    assert torch.allclose(_denorm(x), torch.from_numpy(pixels).permute(2, 0, 1), atol=1e-5)


def test_small_image_is_padded_with_mean_colour_and_void():
    image = Image.fromarray(np.full((4, 6, 3), 200, np.uint8))
    target = np.full((4, 6), 3, np.uint8)
    torch.manual_seed(0)
    for _ in range(5):
        x, y = SegmentationTrain(10, scale=(1.0, 1.0))(image, target)
        inside = y != 255
        assert inside.sum() == 24 and (y[inside] == 3).all()
        rows, cols = inside.any(1).nonzero().flatten(), inside.any(0).nonzero().flatten()
        assert len(rows) == 4 and len(cols) == 6 and rows.diff().eq(1).all()
        assert (x[:, ~inside] == 0).all()  # zeros after normalisation: the mean colour
        assert torch.allclose(_denorm(x)[:, inside], torch.tensor(200 / 255), atol=1e-5)


def test_flip_moves_image_and_target_together():
    ramp = np.tile(np.arange(8, dtype=np.uint8) * 30, (8, 1))
    image = Image.fromarray(np.stack([ramp] * 3, -1))
    target = np.tile(np.arange(8, dtype=np.uint8), (8, 1))
    x, y = SegmentationTrain(8, scale=(1.0, 1.0), flip=1.0)(image, target)
    assert (y == torch.arange(7, -1, -1)).all()
    assert torch.allclose(_denorm(x)[0] * 255, torch.from_numpy(ramp[:, ::-1].copy()).float(),
                          atol=1e-3)
    x0, y0 = SegmentationTrain(8, scale=(1.0, 1.0), flip=0.0)(image, target)
    assert (y0 == torch.arange(8)).all()
    torch.manual_seed(1)
    flips = [SegmentationTrain(8, scale=(1.0, 1.0))(image, target)[1][0, 0].item() == 7
             for _ in range(200)]
    assert 60 < sum(flips) < 140


def test_scale_range_is_honoured():
    image = Image.fromarray(np.full((10, 20, 3), 90, np.uint8))
    target = np.zeros((10, 20), np.uint8)
    t = SegmentationTrain(48, scale=(0.7, 2.0), flip=0.0)
    torch.manual_seed(0)
    widths = set()
    for _ in range(60):
        _, y = t(image, target)
        valid = y != 255
        w, h = int(valid.any(0).sum()), int(valid.any(1).sum())
        assert 14 <= w <= 40 and 7 <= h <= 20 and abs(w - 2 * h) <= 1
        widths.add(w)
    assert min(widths) <= 17 and max(widths) >= 36
    _, y = SegmentationTrain(48, scale=(0.5, 0.5))(image, target)
    assert (y != 255).sum() == 10 * 5


def test_transform_argument_validation():
    for kwargs, name in (({"crop": 0}, "crop"), ({"crop": 4.0}, "crop"),
                         ({"crop": 4, "scale": (0, 1)}, "scale"),
                         ({"crop": 4, "scale": (2, 1)}, "scale"),
                         ({"crop": 4, "scale": 1.0}, "scale"),
                         ({"crop": 4, "flip": 1.5}, "flip"),
                         ({"crop": 4, "std": (1, 0, 1)}, "std")):
        with pytest.raises(ValueError, match=name):
            SegmentationTrain(**kwargs)
    with pytest.raises(ValueError, match="mean"):
        SegmentationEval(mean=(0.5, 0.5))
    with pytest.raises(ValueError, match="target"):
        SegmentationEval()(Image.new("RGB", (4, 4)), np.zeros((4, 5), np.uint8))


# ---------------------------------------------------------------------------------------------
# Class-uniform sampling

# 20 images: class 0 in all, class 1 in the even ones, class 2 only in image 7, class 3 nowhere.
PRESENCE = [[0] + ([1] if i % 2 == 0 else []) + ([2] if i == 7 else []) for i in range(20)]


def test_class_uniform_shows_every_class_uniformly():
    s = ClassUniformSampler(PRESENCE, 4, num_replicas=1, rank=0, seed=3, length=31)
    assert s.absent_classes == [3] and s.classes.tolist() == [0, 1, 2] and len(s) == 31
    for epoch in range(3):
        s.set_epoch(epoch)
        classes, indices = s.slot_classes(), s.epoch_indices()
        for j in range(0, 30, 3):
            assert sorted(classes[j:j + 3].tolist()) == [0, 1, 2]
        counts = Counter(classes.tolist())
        assert set(counts) == {0, 1, 2} and max(counts.values()) - min(counts.values()) <= 1
        assert all(c in PRESENCE[i] for c, i in zip(classes.tolist(), indices.tolist()))
        assert list(s) == indices.tolist()


def test_class_uniform_oversamples_the_rare_class():
    s = ClassUniformSampler(PRESENCE, 4, num_replicas=1, rank=0, length=300)
    shown = Counter(s.epoch_indices().tolist())
    assert shown[7] >= 100 > 3 * 300 / 20  # uniform image sampling: 15 expected
    assert set(shown) == set(range(20))    # class 0 and 1 slots still reach the others


def test_class_uniform_is_a_function_of_seed_and_epoch():
    def indices(seed, epoch):
        s = ClassUniformSampler(PRESENCE, 4, num_replicas=1, rank=0, seed=seed)
        s.set_epoch(epoch)
        return list(s)
    assert indices(0, 0) == indices(0, 0) and indices(5, 2) == indices(5, 2)
    assert indices(0, 0) != indices(0, 1) and indices(0, 0) != indices(1, 0)
    np.random.seed(0)
    torch.manual_seed(0)
    a = indices(0, 4)
    np.random.seed(1)
    torch.manual_seed(1)
    assert indices(0, 4) == a


def test_class_uniform_shards_partition_the_epoch():
    shards = [ClassUniformSampler(PRESENCE, 4, num_replicas=2, rank=r, seed=7, length=31)
              for r in range(2)]
    for s in shards:
        s.set_epoch(2)
    full = shards[0].epoch_indices()
    assert (full == shards[1].epoch_indices()).all()
    a, b = list(shards[0]), list(shards[1])
    assert len(a) == len(b) == 15 == len(shards[0])
    merged = [None] * 30
    merged[0::2], merged[1::2] = a, b
    assert merged == full[:30].tolist()
    # occurrence numbers count earlier appearances over the whole epoch (all ranks)
    occ = shards[0].occurrences() + shards[1].occurrences()
    pos = list(range(0, 30, 2)) + list(range(1, 30, 2))
    assert occ == [full[:p].tolist().count(full[p]) for p in pos]


def test_class_uniform_validation():
    with pytest.raises(ValueError, match="class id"):
        ClassUniformSampler([[0], [4]], 4, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="no image contains"):
        ClassUniformSampler([[], []], 4, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="length"):
        ClassUniformSampler(PRESENCE, 4, num_replicas=1, rank=0, length=0)
    with pytest.raises(ValueError, match="rank"):
        ClassUniformSampler(PRESENCE, 4, num_replicas=2, rank=2)
    assert ClassUniformSampler(PRESENCE, 4).num_replicas == 1  # no process group: one rank


# ---------------------------------------------------------------------------------------------
# make_loader(train_sampler=...)


def _batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def test_make_loader_with_class_uniform_sampler(cityscapes):
    ds = Cityscapes(cityscapes, "train", SegmentationTrain(8))
    presence = ds.class_presence()

    def factory(num_replicas, rank, seed):
        return ClassUniformSampler(presence, ds.num_classes, num_replicas=num_replicas,
                                   rank=rank, seed=seed, length=8)

    loader = make_loader(ds, 2, train=True, workers=0, seed=5, device="cpu",
                         train_sampler=factory)
    assert isinstance(loader.sampler.sampler, ClassUniformSampler) and len(loader) == 4
    first = _batches(loader)
    x, y = first[0]
    assert x.shape == (2, 3, 8, 8) and x.dtype == torch.float32
    assert y.shape == (2, 8, 8) and y.dtype == torch.int64
    again = make_loader(ds, 2, train=True, workers=0, seed=5, device="cpu",
                        train_sampler=factory)
    again.sampler.set_epoch(0)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(first, _batches(again)))
    with pytest.raises(ValueError, match="fewer than one batch"):
        make_loader(ds, 9, train=True, workers=0, seed=0, device="cpu", train_sampler=factory)
    with pytest.raises(ValueError, match="train_sampler"):
        make_loader(ds, 1, train=False, workers=0, seed=0, device="cpu", train_sampler=factory)
    with pytest.raises(TypeError, match="set_epoch"):
        make_loader(ds, 1, train=True, workers=0, seed=0, device="cpu",
                    train_sampler=lambda n, r, s: list(range(4)))


def test_repeated_indices_get_their_own_augmentation_seed():
    class Repeating:
        def __init__(self):
            self.epoch = None

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            return iter([3, 3, 1])

        def __len__(self):
            return 3

        def occurrences(self):
            return [0, 1, 0]

    pairs = list(SeededSampler(Repeating(), seed=9))
    assert [i for i, _ in pairs] == [3, 3, 1]
    assert pairs[0][1] == sample_seed(9, 0, 3) and pairs[2][1] == sample_seed(9, 0, 1)
    assert pairs[1][1] not in (pairs[0][1], pairs[2][1])
    assert sample_seed(9, 0, 3, 0) == sample_seed(9, 0, 3)
