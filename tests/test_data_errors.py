"""Bad data stops a run before training, with one line naming the file: label values outside
Cityscapes' official label table, a label map of the wrong size or mode, a corrupt image
(``--verify-data``).

The label table is cityscapesScripts' ``helpers/labels.py``: labelIds 0..33 ('unlabeled' 0
.. 'bicycle' 33), 19 of them evaluated, with train ids road 7 -> 0, car 26 -> 13, bicycle 33 ->
18; the official evaluator aborts on any other value ("Unknown label with id 250").
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from experiments.train.data import Cityscapes, DatasetLayoutError
from experiments.train.data.generate_segmentation import generate_cityscapes

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
