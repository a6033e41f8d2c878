"""InPlace-ABN Table 2's segmentation training: the plan (profile -> points, their capacity
and ImageNet inputs, command lines), the DeepLabV3 body loader, the point's command line end to
end on generated data, and two gloo ranks of an ``iabn_sync`` segmentation run against one
process on the whole batch."""
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import layers
from experiments import iabn_table2_segmentation as experiment
from experiments.train import plan, seg_plan
from layers.deeplab import deeplabv3

ROOT = Path(__file__).resolve().parents[1]


def _profile(name):
    return yaml.safe_load((ROOT / "experiments" / "config" / f"{name}.yaml").read_text())


def _specs(profile):
    training = plan.point_specs(profile["iabn_table1_imagenet"])
    return seg_plan.point_specs(profile["iabn_table2_segmentation"], training)


# --------------------------------------------------------------------------- plan
@pytest.mark.parametrize("profile", ["smoke", "paper"])
def test_every_table2_cell_and_bottom_row_is_a_point(profile):
    config = _profile(profile)
    specs = _specs(config)
    cocostuff = ("wideresnet38",) if profile == "smoke" else ("resnext101", "wideresnet38")
    top = [f"{b}_cityscapes_{c}" for b in ("resnext101", "wideresnet38")
           for c in seg_plan.CONFIGS]
    top += [f"{b}_cocostuff_{c}" for b in cocostuff for c in seg_plan.CONFIGS]
    # the paper profile also trains the test-set rows' own models
    test_models = ["cityscapes_test_model", "vistas_test_model"] if profile == "paper" else []
    assert sorted(specs) == sorted(top + ["bottom_cityscapes", "bottom_cityscapes_cus",
                                          "bottom_vistas_cus"] + test_models)
    # each top cell takes its batch compilation from the capacity point of its own data set
    # and body
    assert specs["resnext101_cityscapes_iabn_sync_fixed_batch"]["capacity"] == \
        "cityscapes_resnext101_iabn_fixed_batch"
    assert specs["wideresnet38_cocostuff_bn_fixed_crop"]["capacity"] == \
        "cocostuff_wideresnet38_bn_fixed_crop"
    assert specs["wideresnet38_cocostuff_bn_fixed_crop"]["norm"] == "bn"
    assert "bodies" not in specs["wideresnet38_cocostuff_bn_fixed_crop"]
    assert specs["bottom_cityscapes_cus"]["class_uniform"] is True
    assert specs["bottom_cityscapes"]["capacity"] is None
    # bodies have their ImageNet point's architecture, which matches the capacity networks
    seg_plan.check_capacity(specs, config["iabn_table2_capacity"])
    pretrained = config["iabn_table2_segmentation"]["pretrained"]["resnext101"]
    table1 = plan.point_specs(config["iabn_table1_imagenet"])[pretrained]
    assert specs["resnext101_cityscapes_bn_fixed_crop"]["model_args"] == {
        k: v for k, v in table1["model_args"].items() if k in seg_plan.ARCHITECTURE_ARGS}


def test_a_body_unlike_the_capacity_networks_is_refused():
    config = _profile("smoke")
    specs = _specs(config)
    capacity = dict(config["iabn_table2_capacity"], layout="postact")
    with pytest.raises(ValueError, match="preact"):
        seg_plan.check_capacity(specs, capacity)
    with pytest.raises(ValueError, match="width"):
        seg_plan.check_capacity(specs, dict(config["iabn_table2_capacity"], width=0.5))


def test_a_top_point_without_a_capacity_chain_of_its_own_data_set_is_refused():
    """COCO-Stuff's cells are not judged from Cityscapes' capacity points: a top point whose
    data set (or body within it) has no capacity chain stops the plan, naming the key."""
    config = copy.deepcopy(_profile("paper"))
    specs = _specs(config)
    capacity = config["iabn_table2_capacity"]
    del capacity["datasets"]["cocostuff"]
    with pytest.raises(ValueError, match=r"resnext101_cocostuff_bn_fixed_crop.*"
                                         r"datasets\.cocostuff\.crops\.resnext101"):
        seg_plan.check_capacity(specs, capacity)
    capacity["datasets"]["cocostuff"] = {"classes": 91, "crops": {"wideresnet38": 496}}
    with pytest.raises(ValueError, match=r"data set 'cocostuff' and body 'resnext101'"):
        seg_plan.check_capacity(specs, capacity)


def test_a_pretrained_point_of_another_network_is_refused():
    config = copy.deepcopy(_profile("smoke"))
    config["iabn_table2_segmentation"]["pretrained"]["resnext101"] = "wideresnet38_iabn_256"
    with pytest.raises(ValueError, match="trains 'wideresnet38'"):
        _specs(config)
    config["iabn_table2_segmentation"]["pretrained"]["resnext101"] = "nope"
    with pytest.raises(ValueError, match="not a point of iabn_table1_imagenet"):
        _specs(config)


def test_command_lines():
    specs = _specs(_profile("smoke"))
    outputs = {"out": "o.json", "epochs_csv": "o.csv", "weights": "o.pt", "work_dir": "w"}
    top = seg_plan.command("iabn_table2_segmentation",
                           {**specs["resnext101_cityscapes_iabn_fixed_crop"], "device": "cpu"},
                           "data/cs", "w.pt", "cap.json", outputs)
    assert top.startswith("python -m experiments.train.launch --standalone "
                          "--nproc-per-node=2 -m experiments.iabn_table2_segmentation ")
    assert "--capacity cap.json" in top and "--crops" not in top
    assert "--pretrained w.pt" in top and "--model-arg preact=true" in top
    assert "--eval single=1.0:noflip" in top
    bottom = seg_plan.command("iabn_table2_segmentation",
                              {**specs["bottom_cityscapes_cus"], "device": "cuda"},
                              "data/cs", "w.pt", None, outputs)
    assert bottom.startswith("torchrun --standalone --nproc-per-node=2 -m "
                             "experiments.iabn_table2_segmentation ")
    assert "--crops 2 --crop 176" in bottom and "--class-uniform" in bottom
    assert "--eval ms_flip=1.0,1.25,1.5,1.75,2.0:flip" in bottom


def test_generate_command_turns_the_profile_into_options():
    command = plan.generate_command("cityscapes", {"train_images": 4, "val_images": 2,
                                                   "sizes": ["64x32"], "seed": 0}, "out/cs")
    assert command == ("python -m experiments.train.data.generate cityscapes --out out/cs "
                       "--train-images 4 --val-images 2 --sizes 64x32 --seed 0")


# --------------------------------------------------------------------------- body loader
def test_body_loads_an_imagenet_checkpoint_and_names_a_wrong_one():
    classifier = layers.resnext101(num_classes=7, width=0.0625, preact=True, norm="iabn")
    model = deeplabv3("resnext101", num_classes=5, norm="bn", width=0.0625, preact=True)
    model.load_body(classifier.state_dict())
    for key, value in classifier.state_dict().items():
        if not key.startswith("fc."):
            assert torch.equal(model.body.state_dict()[key], value), key
    postact = layers.resnext101(num_classes=7, width=0.0625, preact=False)
    with pytest.raises(ValueError, match="belong to no part|lacks"):
        model.load_body(postact.state_dict())
    wider = layers.resnext101(num_classes=7, width=0.125, preact=True)
    with pytest.raises(ValueError, match="another shape"):
        model.load_body(wider.state_dict())


# --------------------------------------------------------------------------- table
def test_table2_brackets_are_relative_to_the_std_bn_row():
    import pandas as pd
    rows = []
    for config, crops, size in (("bn_fixed_crop", 8, 128), ("iabn_fixed_crop", 14, 128),
                                ("iabn_fixed_batch", 8, 168),
                                ("iabn_sync_fixed_batch", 8, 168)):
        rows.append({"point": f"resnext101_cityscapes_{config}", "eval": "single",
                     "body": "resnext101", "dataset": "cityscapes", "norm": "iabn",
                     "crops": crops, "crop_size": size, "pixels": crops * size * size,
                     "miou_pct": 50.0})
    rows.append({**rows[0], "point": "bottom_cityscapes"})
    table = experiment.table2(pd.DataFrame(rows))
    assert list(table["config"]) == list(experiment.ROWS)
    assert table["increase_pct"].tolist() == pytest.approx(
        [0.0, 75.0, 100 * (168 ** 2 / 128 ** 2 - 1), 100 * (168 ** 2 / 128 ** 2 - 1)])


# --------------------------------------------------------------------------- command line
def _run_point(*args):
    return subprocess.run([sys.executable, "-m", "experiments.iabn_table2_segmentation", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cityscapes_tree(tmp_path_factory):
    from experiments.train.data import generate_cityscapes
    root = tmp_path_factory.mktemp("seg") / "cityscapes"
    generate_cityscapes(root, train_images=4, val_images=2, size=(64, 32))
    return root


def _outputs(tmp_path):
    return ["--out", str(tmp_path / "p.json"), "--epochs-csv", str(tmp_path / "p.csv"),
            "--weights", str(tmp_path / "p.pt"), "--work-dir", str(tmp_path / "w")]


def _check(*args):
    """Parse and check the point's options in this process (argparse exits with status 2)."""
    from experiments.train import seg_point
    p = seg_point.parser(experiment.EXPERIMENT, "test")
    return seg_point.check(p, p.parse_args([str(a) for a in args]))


@pytest.mark.parametrize("extra, message", [
    ([], "--crops and --crop (or --capacity) are required"),
    (["--crops", "2", "--crop", "32", "--coarse", "--dataset", "vistas"], "--coarse: Cityscapes"),
    (["--crops", "2", "--crop", "32", "--eval", "a=1:flip", "--eval", "a=2:noflip"],
     "must be unique"),
    (["--crops", "2", "--crop", "32", "--eval", "single=one:noflip"], "NAME=SCALES"),
    (["--crops", "2", "--crop", "32", "--scale", "2", "1"], "0 < MIN <= MAX"),
    (["--crops", "2", "--crop", "32", "--pretrained", "/nonexistent.pt"], "no such file"),
    (["--crops", "0", "--crop", "32"], "--crops 0: must be >= 1"),
])
def test_bad_options_are_named(cityscapes_tree, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        _check("--dataset", "cityscapes", "--data", cityscapes_tree, "--body", "resnext101",
               "--norm", "iabn", "--epochs", "1", *_outputs(tmp_path), *extra)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_capacity_sets_crops_and_another_experiments_file_is_refused(cityscapes_tree, tmp_path,
                                                                     capsys):
    options = ["--dataset", "cityscapes", "--data", cityscapes_tree, "--body", "resnext101",
               "--norm", "iabn", "--epochs", "1", *_outputs(tmp_path)]
    capacity = tmp_path / "capacity.json"
    record = {"experiment": "iabn_table2_capacity", "config": {"mode": "fixed_crop"},
              "results": [{"kind": "measurement", "crops": 9, "crop_size": 8},
                          {"kind": "capacity", "crops": 7, "crop_size": 128}]}
    capacity.write_text(json.dumps(record))
    args = _check(*options, "--capacity", capacity)
    assert (args.crops, args.crop) == (7, 128)
    assert args.capacity_config["capacity_mode"] == "fixed_crop"
    capacity.write_text(json.dumps({**record, "experiment": "densenet_fig4_memory"}))
    with pytest.raises(SystemExit):
        _check(*options, "--capacity", capacity)
    assert "expected iabn_table2_capacity" in capsys.readouterr().err


def test_a_capacity_point_of_another_data_set_is_refused(cityscapes_tree, tmp_path, capsys):
    """A Cityscapes point does not train at COCO-Stuff's capacity (91 classes, 480^2 crops)."""
    capacity = tmp_path / "cocostuff_resnext101_bn_fixed_crop.json"
    capacity.write_text(json.dumps({
        "experiment": "iabn_table2_capacity",
        "config": {"mode": "fixed_crop", "dataset": "cocostuff", "classes": 91},
        "results": [{"kind": "capacity", "crops": 4, "crop_size": 480}]}))
    with pytest.raises(SystemExit) as exit_:
        _check("--dataset", "cityscapes", "--data", cityscapes_tree, "--body", "resnext101",
               "--norm", "iabn", "--epochs", "1", *_outputs(tmp_path), "--capacity", capacity)
    assert exit_.value.code == 2
    assert "data set 'cocostuff', not of --dataset cityscapes" in capsys.readouterr().err


def test_a_checkpoint_of_another_layout_is_refused_before_training(cityscapes_tree, tmp_path):
    weights = tmp_path / "postact.pt"
    torch.save(layers.resnext101(num_classes=4, width=0.03125).state_dict(), weights)
    result = _run_point("--dataset", "cityscapes", "--data", str(cityscapes_tree), "--body",
                        "resnext101", "--model-arg", "width=0.03125", "--model-arg",
                        "preact=true", "--norm", "iabn", "--epochs", "1", "--crops", "2",
                        "--crop", "32", "--pretrained", str(weights), *_outputs(tmp_path))
    assert result.returncode == 2 and f"--pretrained {weights}" in result.stderr
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "w").exists()
