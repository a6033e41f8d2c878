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
    top = [f"{b}_{d}_{c}" for b in ("resnext101", "wideresnet38")
           for d in ("cityscapes", "cocostuff") for c in seg_plan.CONFIGS]
    assert sorted(specs) == sorted(top + ["bottom_cityscapes", "bottom_cityscapes_cus",
                                          "bottom_vistas_cus"])
    # each top cell takes its batch compilation from the same body's capacity point
    assert specs["resnext101_cityscapes_iabn_sync_fixed_batch"]["capacity"] == \
        "resnext101_iabn_fixed_batch"
    assert specs["wideresnet38_cocostuff_bn_fixed_crop"]["capacity"] == \
        "wideresnet38_bn_fixed_crop"
    assert specs["wideresnet38_cocostuff_bn_fixed_crop"]["norm"] == "bn"
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
    assert top.startswith("torchrun --standalone --nproc-per-node=2 -m "
                          "experiments.iabn_table2_segmentation ")
    assert "--capacity cap.json" in top and "--crops" not in top
    assert "--pretrained w.pt" in top and "--model-arg preact=true" in top
    assert "--eval single=1.0:noflip" in top
    bottom = seg_plan.command("iabn_table2_segmentation",
                              {**specs["bottom_cityscapes_cus"], "device": "cpu"},
                              "data/cs", "w.pt", None, outputs)
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
