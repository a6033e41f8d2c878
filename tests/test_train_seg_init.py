"""The paper's test-set models: the Cityscapes one "Vistas pre-trained" and trained on fine +
coarse labels (``--init`` a Vistas point's weights, ``--coarse``), the Vistas one trained on
training + validation (``--train-val``).

``--init`` loads every tensor of a segmentation network of the same body and head; only a
classifier of another number of classes (Vistas' 65 against Cityscapes' 19) keeps its own
initialisation.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments import iabn_table2_segmentation as experiment
from experiments.train import seg_point
from experiments.train.data.generate_segmentation import generate_cityscapes, generate_vistas
from layers.deeplab import deeplabv3

ROOT = Path(__file__).resolve().parents[1]
TINY = {"width": 0.03125}


def _net(classes, seed, **args):
    torch.manual_seed(seed)
    return deeplabv3("resnext101", num_classes=classes, norm="iabn_sync", **{**TINY, **args})


def test_init_loads_all_but_another_data_sets_classifier(tmp_path):
    vistas = _net(65, seed=1)
    torch.save(vistas.state_dict(), tmp_path / "vistas.pt")
    cityscapes = _net(19, seed=2)
    before = {k: v.clone() for k, v in cityscapes.state_dict().items()}
    assert seg_point.load_init(cityscapes, tmp_path / "vistas.pt") == [
        "classifier.weight", "classifier.bias"]
    after, source = cityscapes.state_dict(), vistas.state_dict()
    for key, value in after.items():
        expected = before[key] if key.startswith("classifier.") else source[key]
        assert torch.equal(value, expected), key
    assert not torch.equal(after["aspp.project.0.weight"], before["aspp.project.0.weight"])

    same = _net(65, seed=3)
    assert seg_point.load_init(same, tmp_path / "vistas.pt") == []
    assert torch.equal(same.state_dict()["classifier.weight"], source["classifier.weight"])


def test_init_of_another_width_or_network_is_named(tmp_path):
    torch.save(_net(19, seed=0, width=0.0625).state_dict(), tmp_path / "wide.pt")
    with pytest.raises(ValueError, match=r"--init .*wide.pt: \d+ tensors have another shape"):
        seg_point.load_init(_net(19, seed=0), tmp_path / "wide.pt")
    torch.save(_net(19, seed=0).body.state_dict(), tmp_path / "body.pt")
    with pytest.raises(ValueError, match=r"--init .*body.pt: not a segmentation network"):
        seg_point.load_init(_net(19, seed=0), tmp_path / "body.pt")


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    root = tmp_path_factory.mktemp("trees")
    return (generate_cityscapes(root / "cs", train_images=3, val_images=2, size=(64, 32),
                                coarse_extra=2),
            generate_vistas(root / "vi", train_images=3, val_images=2, test_images=1,
                            sizes=((64, 48),)))


def _options(dataset, root, tmp_path, *extra):
    p = seg_point.parser(experiment.EXPERIMENT, "test")
    return seg_point.check(p, p.parse_args([str(a) for a in (
        "--dataset", dataset, "--data", root, "--body", "resnext101", "--norm", "iabn_sync",
        "--epochs", "1", "--crops", "2", "--crop", "32", "--out", tmp_path / "p.json",
        "--epochs-csv", tmp_path / "p.csv", "--weights", tmp_path / "p.pt", "--work-dir",
        tmp_path / "w", *extra)]))


def test_train_val_trains_on_both_splits(trees, tmp_path):
    _, vistas = trees
    train, val = seg_point.datasets(_options("vistas", vistas, tmp_path))
    assert len(train) == 3
    train, val = seg_point.datasets(_options("vistas", vistas, tmp_path, "--train-val"))
    assert len(train) == 5 and train.samples[3:] == val.samples
    assert len(train.class_presence()) == 5


def test_init_and_pretrained_together_are_refused(trees, tmp_path, capsys):
    cityscapes, _ = trees
    torch.save({}, tmp_path / "w.pt")
    with pytest.raises(SystemExit) as exit_:
        _options("cityscapes", cityscapes, tmp_path, "--init", tmp_path / "w.pt",
                 "--pretrained", tmp_path / "w.pt")
    assert exit_.value.code == 2 and "not both" in capsys.readouterr().err


def test_a_vistas_pretrained_fine_and_coarse_point_runs(trees, tmp_path):
    """The Cityscapes test model's chain in miniature: a Vistas network's weights start a
    Cityscapes point on fine + coarse labels; the artifact records both."""
    cityscapes, _ = trees
    torch.save(_net(65, seed=1).state_dict(), tmp_path / "vistas.pt")
    done = subprocess.run(
        [sys.executable, "-m", "experiments.iabn_table2_segmentation", "--dataset", "cityscapes",
         "--data", str(cityscapes), "--body", "resnext101", "--model-arg", "width=0.03125",
         "--norm", "iabn_sync", "--crops", "2", "--crop", "32", "--epochs", "1", "--coarse",
         "--init", str(tmp_path / "vistas.pt"), "--out", str(tmp_path / "p.json"),
         "--epochs-csv", str(tmp_path / "p.csv"), "--weights", str(tmp_path / "p.pt"),
         "--work-dir", str(tmp_path / "w")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "p.json").read_text())
    assert record["config"]["init"] == str(tmp_path / "vistas.pt")
    assert record["config"]["coarse"] is True
    assert record["results"][0]["train_images"] == 3 + 2
