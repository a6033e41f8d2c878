"""experiments.train.data.generate_segmentation: Cityscapes, COCO-Stuff and Mapillary Vistas
trees in their released layouts, deterministic, written atomically, every class present in
training, read by the real loaders; and the command line of experiments.train.data.generate."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from experiments.train.data import generate as gen
from experiments.train.data import generate_segmentation as seg
from experiments.train.data.cityscapes import Cityscapes
from experiments.train.data.cocostuff import COCOStuff
from experiments.train.data.vistas import Vistas

REPO_ROOT = Path(__file__).resolve().parents[1]
CS_TRAIN_IDS = {7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33}
CS_COLOURS = {lid: colour for _, lid, _, _, colour in seg.CITYSCAPES_LABELS}
CS_INSTANCE_IDS = {lid for _, lid, _, inst, _ in seg.CITYSCAPES_LABELS if inst}


def _tree_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


def _array(path):
    with Image.open(path) as image:
        return image.mode, np.asarray(image)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The three sets at the smoke profile's sizes (40 train + 10 val images)."""
    root = tmp_path_factory.mktemp("seg")
    return {"cityscapes": seg.generate_cityscapes(root / "cityscapes", 40, 10, coarse_extra=2),
            "cocostuff": seg.generate_cocostuff(root / "cocostuff", 40, 10),
            "vistas": seg.generate_vistas(root / "vistas", 40, 10)}


def _small(root, seed=0):
    return (seg.generate_cityscapes(root / "cs", 3, 1, seed, size=(64, 32), test_images=1,
                                    coarse_extra=1),
            seg.generate_cocostuff(root / "coco", 3, 1, seed, sizes=[(40, 30), (30, 40)]),
            seg.generate_vistas(root / "vistas", 3, 1, seed, sizes=[(40, 30)], test_images=1))


def test_generators_are_deterministic(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        _small(tmp_path / name, seed)
    a, b, c = (_tree_bytes(tmp_path / n) for n in "abc")
    assert a == b and a != c
    # Cityscapes names do not depend on the seed; COCO ids and Vistas keys do.
    assert {k for k in a if k.startswith("cs/")} == {k for k in c if k.startswith("cs/")}


def test_cityscapes_layout(smoke):
    root = smoke["cityscapes"]
    for split, cities, count in (("train", {"aachen", "bochum", "bremen"}, 40),
                                 ("val", {"frankfurt", "lindau", "munster"}, 10),
                                 ("test", {"berlin", "bielefeld"}, 2),
                                 ("train_extra", {"augsburg", "bamberg"}, 2)):
        images = sorted((root / "leftImg8bit" / split).glob("*/*_leftImg8bit.png"))
        assert len(images) == count and {p.parent.name for p in images} == cities
        values = set()
        for image in images:
            city, seq, frame = image.name[:-len("_leftImg8bit.png")].split("_")
            assert city == image.parent.name and len(seq) == 6 and frame == "000019"
            with Image.open(image) as im:
                assert im.format == "PNG" and im.mode == "RGB" and im.size == (256, 128)
            stem = image.name[:-len("_leftImg8bit.png")]
            for folder, kind in (("gtFine", "gtFine"), ("gtCoarse", "gtCoarse")):
                if (folder, split) in (("gtFine", "train_extra"), ("gtCoarse", "test")):
                    assert not (root / folder / split).exists()
                    continue
                base = root / folder / split / city / f"{stem}_{kind}"
                mode, label = _array(f"{base}_labelIds.png")
                assert mode == "L" and label.shape == (128, 256) and label.max() <= 33
                mode, colour = _array(f"{base}_color.png")
                assert mode == "RGBA" and (colour[..., 3] == 255).all()
                for lid in np.unique(label):
                    assert (colour[label == lid][:, :3] == CS_COLOURS[lid]).all()
                mode, instance = _array(f"{base}_instanceIds.png")
                assert mode == "I;16"
                instance = instance.astype(np.int64)
                objects = instance >= 1000
                assert (instance[objects] // 1000 == label[objects]).all()
                assert (instance[~objects] == label[~objects]).all()
                assert set(np.unique(label[objects])) <= CS_INSTANCE_IDS
                if kind == "gtFine":
                    values |= set(np.unique(label).tolist())
                    assert not (root / folder / split / city / f"{stem}_gtFine_polygons.json"
                                ).exists()
        if split == "test":
            assert values == {0}  # as released: test labels are all unlabeled
        elif split == "train":
            assert CS_TRAIN_IDS <= values  # every train class ...
            assert {0, 1} <= values and values & {4, 5, 6}  # ... and void ids (-> 255)


def test_cocostuff_layout(smoke):
    root = smoke["cocostuff"]
    assert sorted(p.relative_to(root).as_posix() for p in root.glob("*/*")) == [
        "annotations/stuff_train2017_pixelmaps", "annotations/stuff_val2017_pixelmaps",
        "images/train2017", "images/val2017"]
    ids = {}
    sizes, values = set(), set()
    for split, count in (("train", 40), ("val", 10)):
        images = sorted((root / "images" / f"{split}2017").iterdir())
        labels = sorted((root / "annotations" / f"stuff_{split}2017_pixelmaps").iterdir())
        assert len(images) == len(labels) == count
        assert [p.stem for p in images] == [p.stem for p in labels]
        ids[split] = {p.stem for p in images}
        for image, label in zip(images, labels):
            assert len(image.stem) == 12 and image.stem.isdigit() and image.suffix == ".jpg"
            with Image.open(image) as im:
                assert im.format == "JPEG" and im.mode == "RGB"
                sizes.add(im.size)
            mode, array = _array(label)
            assert mode == "L" and array.shape == (im.size[1], im.size[0])
            values |= set(np.unique(array).tolist())
    assert not ids["train"] & ids["val"]
    assert sizes == set(seg.DEFAULT_COCO_SIZES)
    assert values <= {0, 183} | set(range(92, 183)) and {0, 183} <= values


def test_vistas_layout(smoke):
    root = smoke["vistas"]
    config = json.loads((root / "config.json").read_text())
    labels = config["labels"]
    assert len(labels) == 66 and config["version"] == 1.2
    for label in labels:
        assert set(label) == {"name", "readable", "color", "instances", "evaluate"}
        assert len(label["color"]) == 3 and isinstance(label["instances"], bool)
    assert [lab["evaluate"] for lab in labels] == [True] * 65 + [False]
    assert labels[-1]["name"] == "void--unlabeled" and labels[-1]["color"] == [0, 0, 0]
    assert labels[13]["name"] == "construction--flat--road"
    assert labels[13]["color"] == [128, 64, 128]
    assert len({lab["name"] for lab in labels}) == 66
    palette = [v for lab in labels for v in lab["color"]]
    keys = set()
    for folder, count in (("training", 40), ("validation", 10), ("testing", 2)):
        images = sorted((root / folder / "images").iterdir())
        assert len(images) == count
        if folder == "testing":
            assert sorted(p.name for p in (root / folder).iterdir()) == ["images"]
        for image in images:
            key = image.stem
            assert len(key) == 22 and image.suffix == ".jpg" and key not in keys
            assert set(key) <= set(seg._KEY_ALPHABET.tolist())
            keys.add(key)
            if folder == "testing":
                continue
            with Image.open(root / folder / "labels" / f"{key}.png") as label:
                assert label.mode == "P" and label.getpalette()[:len(palette)] == palette
                array = np.asarray(label)
            with Image.open(image) as im:
                assert im.mode == "RGB" and array.shape == (im.size[1], im.size[0])
            assert array.max() < 66
            mode, instance = _array(root / folder / "instances" / f"{key}.png")
            assert mode == "I;16" and (instance.astype(np.int64) // 256 == array).all()


def test_every_class_is_in_training_and_the_loaders_read_it(smoke):
    for ds, n in ((Cityscapes(smoke["cityscapes"], "train"), 19),
                  (COCOStuff(smoke["cocostuff"], "train"), 91),
                  (Vistas(smoke["vistas"], "training"), 65)):
        assert len(ds) == 40 and ds.num_classes == n
        counts = np.zeros(n, int)
        for present in ds.class_presence():
            counts[present] += 1
        assert counts.min() >= 2, counts  # every class, in several images ...
        assert counts.max() >= 3 * counts.min()  # ... some far more often than others
        image, target = ds[0]
        assert target.shape == (image.size[1], image.size[0])
        assert (target == 255).any() and (target < n).any()  # void pixels and classes
    assert len(Cityscapes(smoke["cityscapes"], "val")) == 10
    assert len(Cityscapes(smoke["cityscapes"], "train", coarse=True)) == 42
    test = Cityscapes(smoke["cityscapes"], "test")
    assert len(test) == 2 and (test[0][1] == 255).all()
    assert len(COCOStuff(smoke["cocostuff"], "val")) == 10
    assert len(Vistas(smoke["vistas"], "validation")) == 10
    assert len(Vistas(smoke["vistas"], "testing")) == 2


def test_few_images_still_hold_every_class(tmp_path):
    seg.generate_cocostuff(tmp_path / "coco", 5, 1, sizes=[(64, 48)])
    seg.generate_cityscapes(tmp_path / "cs", 2, 1, size=(64, 32))
    for ds, n in ((COCOStuff(tmp_path / "coco", "train"), 91),
                  (Cityscapes(tmp_path / "cs", "train"), 19)):
        assert {c for p in ds.class_presence() for c in p} == set(range(n))


def test_vistas_num_classes(tmp_path):
    root = seg.generate_vistas(tmp_path / "v", 2, 1, sizes=[(48, 32)], num_classes=70,
                               test_images=1)
    ds = Vistas(root, "training")
    assert ds.num_classes == 70 and ds.names[:2] == ["animal--bird", "animal--ground-animal"]
    assert ds.names[-1] == "object--generated--class-069"
    assert {c for p in ds.class_presence() for c in p} == set(range(70))


def test_atomic_and_validated(tmp_path, monkeypatch):
    root = seg.generate_cocostuff(tmp_path / "coco", 2, 1, sizes=[(32, 32)])
    before = _tree_bytes(root)
    with pytest.raises(FileExistsError, match="overwrite"):
        seg.generate_cocostuff(root, 2, 1, sizes=[(32, 32)])
    for make in (seg.generate_cityscapes, seg.generate_vistas):
        (tmp_path / "x").mkdir()
        (tmp_path / "x" / "keep").write_text("")
        with pytest.raises(FileExistsError, match="overwrite"):
            make(tmp_path / "x", 1, 1)
        assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["keep"]
        (tmp_path / "x" / "keep").unlink()
        (tmp_path / "x").rmdir()

    calls = []
    finish = seg._Canvas.finish

    def failing_finish(self):
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("disk full")
        return finish(self)

    monkeypatch.setattr(seg._Canvas, "finish", failing_finish)
    for make, path, kwargs in ((seg.generate_cocostuff, root, {"overwrite": True}),
                               (seg.generate_cityscapes, tmp_path / "cs", {}),
                               (seg.generate_vistas, tmp_path / "v", {})):
        calls.clear()
        with pytest.raises(RuntimeError, match="disk full"):
            make(path, 3, 1, **kwargs)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coco"]  # no temporaries
    assert _tree_bytes(root) == before  # the old set is intact
    seg.generate_cocostuff(root, 3, 1, sizes=[(32, 32)], overwrite=True)
    assert len(COCOStuff(root, "train")) == 3

    for call, match in (
            (lambda: seg.generate_cityscapes(tmp_path / "b", 0, 1), "train_images"),
            (lambda: seg.generate_cityscapes(tmp_path / "b", 1, 1, size=(8, 8)), "size"),
            (lambda: seg.generate_cityscapes(tmp_path / "b", 1, 1, cities={"val": ("a_b",)}),
             "cities"),
            (lambda: seg.generate_cocostuff(tmp_path / "b", 1, 0), "val_images"),
            (lambda: seg.generate_cocostuff(tmp_path / "b", 1, 1, sizes=[]), "sizes"),
            (lambda: seg.generate_vistas(tmp_path / "b", 1, 1, num_classes=0), "num_classes")):
        with pytest.raises(ValueError, match=match):
            call()
    assert not (tmp_path / "b").exists()


def test_cli(tmp_path, capsys):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.train.data.generate", "cityscapes", "--out",
         str(tmp_path / "cs"), "--train-images", "4", "--val-images", "2"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "cityscapes: 4 train + 2 val images" in result.stdout
    assert "Warning" not in result.stderr
    ds = Cityscapes(tmp_path / "cs", "train")
    assert len(ds) == 4 and {c for p in ds.class_presence() for c in p} == set(range(19))
    with Image.open(ds.samples[0][0]) as im:
        assert im.size == (256, 128)

    assert gen.main(["cityscapes", "--out", str(tmp_path / "cs2"), "--train-images", "1",
                     "--val-images", "1", "--sizes", "64x32", "--coarse-extra", "1",
                     "--seed", "2"]) == 0
    assert len(Cityscapes(tmp_path / "cs2", "train", coarse=True)) == 2
    assert gen.main(["vistas", "--out", str(tmp_path / "v"), "--train-images", "2",
                     "--val-images", "1", "--sizes", "48x36", "36x48"]) == 0
    assert {Image.open(p).size for p, _ in Vistas(tmp_path / "v", "training").samples} <= {
        (48, 36), (36, 48)}
    assert gen.main(["cocostuff", "--out", str(tmp_path / "c"), "--train-images", "2",
                     "--val-images", "1", "--sizes", "40x30"]) == 0
    assert len(COCOStuff(tmp_path / "c", "train")) == 2
    assert gen.main(["cocostuff", "--out", str(tmp_path / "c"), "--train-images", "2",
                     "--val-images", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err

    args = gen.parse_args(["vistas", "--out", "x"])
    assert (args.train_images, args.val_images, args.sizes) == (40, 10, None)
    for argv, message in (
            (["cityscapes", "--train-per-class", "3"], "--train-per-class does not apply"),
            (["vistas", "--test-per-class", "3"], "--test-per-class does not apply"),
            (["cocostuff", "--classes", "3"], "imagenet only"),
            (["cityscapes", "--sizes", "64x32", "32x16"], "exactly one"),
            (["vistas", "--coarse-extra", "1"], "cityscapes only"),
            (["imagenet", "--train-images", "3"], "--train-images does not apply"),
            (["cifar10", "--val-images", "3"], "--val-images does not apply"),
            (["cifar100", "--sizes", "32x32"], "32x32 images")):
        with pytest.raises(SystemExit):
            gen.parse_args([argv[0], "--out", "x", *argv[1:]])
        assert message in capsys.readouterr().err
