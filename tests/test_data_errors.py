"""Bad data stops a run before training, with one line naming the file: label values outside
the official label tables (Cityscapes, COCO-Stuff, Mapillary Vistas), a label map of the wrong
size or mode, a corrupt image (``--verify-data``).

The label table is cityscapesScripts' ``helpers/labels.py``: labelIds 0..33 ('unlabeled' 0
.. 'bicycle' 33), 19 of them evaluated, with train ids road 7 -> 0, car 26 -> 13, bicycle 33 ->
18; the official evaluator aborts on any other value ("Unknown label with id 250").
COCO-Stuff's challenge pixel maps hold 0 (unlabeled), the stuff ids 92..182 and 183 ('other'),
the ids cocostuffapi's ``cocoSegmentationToPng`` writes; a Vistas label map holds indices into
its config's label list.
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from experiments.train.data import COCOStuff, Cityscapes, DatasetLayoutError, Vistas
from experiments.train.data.generate_segmentation import (generate_cityscapes,
                                                          generate_cocostuff, generate_vistas)

ROOT = Path(__file__).resolve().parents[1]
#: (labelId, trainId) pairs of the official table; 255: not evaluated (void).
OFFICIAL = [(0, 255), (1, 255), (4, 255), (6, 255), (7, 0), (8, 1), (11, 2), (17, 5), (26, 13),
            (29, 255), (30, 255), (33, 18)]


@pytest.fixture
def cityscapes(tmp_path):
    return generate_cityscapes(tmp_path / "cityscapes", train_images=2, val_images=1,
                               size=(64, 32))


def _val_label(root):
    return next((root / "gtFine" / "val").rglob("*_gtFine_labelIds.png"))


def _write_label(path, values):
    """Overwrite the 64x32 label map ``path`` with ``values`` repeated over its pixels."""
    pixels = np.resize(np.asarray(values, np.uint8), 64 * 32).reshape(32, 64)
    Image.fromarray(pixels).save(path)  # uint8 (H, W): mode "L"


def test_every_official_label_id_maps_by_the_table_and_any_other_value_is_an_error(cityscapes):
    label = _val_label(cityscapes)
    _write_label(label, list(range(34)))
    _, target = Cityscapes(cityscapes, "val")[0]
    raw = np.asarray(Image.open(label))
    for label_id, train_id in OFFICIAL:
        assert set(target[raw == label_id].tolist()) == {train_id}, label_id

    _write_label(label, [7, 26, 250])
    with pytest.raises(DatasetLayoutError, match=r"\[250\]") as error:
        Cityscapes(cityscapes, "val")[0]
    assert str(label) in str(error.value)

    # A labelTrainIds map saved under the labelIds name: train ids and 255 for void.
    _write_label(label, [0, 13, 18, 255])
    with pytest.raises(DatasetLayoutError, match=r"\[255\]"):
        Cityscapes(cityscapes, "val").class_presence()


@pytest.mark.parametrize("bad", [91, 1, 184, 255])
def test_a_cocostuff_value_outside_the_challenge_ids_is_an_error(tmp_path, bad):
    """Thing ids 1..91 (a stuff+things map), 184+ and a train-id map's 255 are no values of a
    stuff pixel map; 0, 92..182 and 183 are."""
    root = generate_cocostuff(tmp_path / "coco", train_images=1, val_images=1)
    label = next((root / "annotations" / "stuff_val2017_pixelmaps").glob("*.png"))
    height, width = np.asarray(Image.open(label)).shape
    good = np.resize(np.array([0, 92, 150, 182, 183], np.uint8), height * width)
    Image.fromarray(good.reshape(height, width)).save(label)
    _, target = COCOStuff(root, "val")[0]
    assert set(np.unique(target).tolist()) == {255, 0, 58, 90}  # 0 and 183 void
    good[7] = bad
    Image.fromarray(good.reshape(height, width)).save(label)
    with pytest.raises(DatasetLayoutError, match=rf"\[{bad}\]") as error:
        COCOStuff(root, "val")[0]
    assert str(label) in str(error.value)


def test_a_vistas_index_beyond_the_config_labels_is_an_error(tmp_path):
    """v1.2's config lists 66 labels (ids 0..65, 65 void--unlabeled): 65 is void, 66 an
    error naming the file."""
    root = generate_vistas(tmp_path / "vistas", train_images=1, val_images=1, test_images=1)
    label = next((root / "validation" / "labels").glob("*.png"))
    with Image.open(label) as image:
        palette, (width, height) = image.getpalette(), image.size
    for value, ok in ((65, True), (66, False)):
        pixels = np.zeros((height, width), np.uint8)
        pixels[0, 0] = value
        image = Image.fromarray(pixels).convert("P")
        image.putpalette(palette)
        image.save(label)
        if ok:
            assert Vistas(root, "validation")[0][1][0, 0] == 255
            continue
        with pytest.raises(DatasetLayoutError, match=r"\[66\]") as error:
            Vistas(root, "validation")[0]
        assert str(label) in str(error.value)


def test_headers_find_a_label_map_of_the_wrong_size_or_mode(cityscapes):
    label = _val_label(cityscapes)
    Image.new("L", (32, 32), 7).save(label)
    with pytest.raises(DatasetLayoutError, match="32x32") as error:
        Cityscapes(cityscapes, "val").check_headers()
    assert str(label) in str(error.value)
    Image.new("RGB", (64, 32), (7, 7, 7)).save(label)
    with pytest.raises(DatasetLayoutError, match="'RGB'"):
        Cityscapes(cityscapes, "val").check_headers()


def _segmentation_point(root, tmp_path, *extra):
    return subprocess.run(
        [sys.executable, "-m", "experiments.iabn_table2_segmentation", "--dataset",
         "cityscapes", "--data", str(root), "--body", "resnext101", "--model-arg",
         "width=0.03125", "--norm", "bn", "--crops", "2", "--crop", "32", "--epochs", "1",
         "--out", str(tmp_path / "p.json"), "--epochs-csv", str(tmp_path / "p.csv"),
         "--weights", str(tmp_path / "p.pt"), "--work-dir", str(tmp_path / "work"), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=600)


def _refused_before_training(done, path, tmp_path):
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], done.stderr[-3000:]
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "work").exists()


def test_a_validation_label_of_the_wrong_size_stops_the_point_before_training(cityscapes,
                                                                               tmp_path):
    label = _val_label(cityscapes)
    Image.new("L", (32, 32), 7).save(label)
    _refused_before_training(_segmentation_point(cityscapes, tmp_path), label, tmp_path)


def test_verify_data_finds_a_corrupt_image_before_training(cityscapes, tmp_path):
    image = next((cityscapes / "leftImg8bit" / "val").rglob("*.png"))
    data = image.read_bytes()
    image.write_bytes(data[:len(data) // 2])  # the header reads, the pixels do not
    _refused_before_training(_segmentation_point(cityscapes, tmp_path, "--verify-data"), image,
                             tmp_path)


def test_a_bad_label_read_by_a_loader_worker_ends_the_point_with_one_line(cityscapes, tmp_path):
    """Label values are checked when a map is read: in a DataLoader worker (``--workers 1``)
    the error comes back wrapped in the worker's traceback, and the point still ends with the
    one line naming the file and the values."""
    label = next((cityscapes / "gtFine" / "train").rglob("*_gtFine_labelIds.png"))
    _write_label(label, [7, 26, 250])
    done = _segmentation_point(cityscapes, tmp_path, "--workers", "1")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    error = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and str(label) in error[0] and "[250]" in error[0], done.stderr


def test_verify_decodes_every_imagenet_image(tmp_path):
    """``--verify-data`` on ImageNet: a truncated JPEG whose header reads fails up front."""
    from experiments.train.data import ImageNet, generate_imagenet

    root = generate_imagenet(tmp_path / "imagenet", classes=2, train_per_class=1,
                             val_per_class=2, sizes=[(64, 64)])
    image = sorted((root / "val").rglob("*.JPEG"))[-1]
    data = image.read_bytes()
    image.write_bytes(data[:len(data) // 2])
    val = ImageNet(root, "val", verify=True)  # the header check passes
    with pytest.raises(DatasetLayoutError, match=str(image)):
        val.verify()


def test_the_parity_command_ends_a_data_error_with_one_line(tmp_path):
    """The parity command (``iabn_table1_imagenet parity``) reads ImageNet as the training
    points do: a missing class folder ends it with the loader's message, not a traceback."""
    (tmp_path / "imagenet" / "train").mkdir(parents=True)  # a train/ without class folders
    done = subprocess.run(
        [sys.executable, "-m", "experiments.iabn_table1_imagenet", "parity",
         "--data", str(tmp_path / "imagenet"), "--model", "resnext101", "--steps", "1",
         "--out", str(tmp_path / "parity.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "imagenet" in lines[0], done.stderr
    assert not (tmp_path / "parity.json").exists()
