"""The paper profile's test-set rows as the paper ran them (InPlace-ABN Sec. 4.2, Table 2
bottom): the Cityscapes test model "Vistas pre-trained" (``init``) on "fine + coarse label
data", the Vistas test model on training + validation, and their predictions written for the
benchmark servers (``submissions``) with each row's protocol."""
import copy
import shlex
from pathlib import Path

import pytest
import yaml

from experiments.train import plan, seg_plan

ROOT = Path(__file__).resolve().parents[1]


def _profile(name="paper"):
    return yaml.safe_load((ROOT / "experiments" / "config" / f"{name}.yaml").read_text())


def _specs(profile):
    return seg_plan.point_specs(profile["iabn_table2_segmentation"],
                                plan.point_specs(profile["iabn_table1_imagenet"]))


def _command(spec):
    outputs = {"out": "o.json", "epochs_csv": "o.csv", "weights": "o.pt", "work_dir": "w"}
    return shlex.split(seg_plan.command("iabn_table2_segmentation", {**spec, "device": "cuda"},
                                        "data", "start.pt", None, outputs))


def test_the_test_rows_models_are_trained_as_the_paper_says():
    specs = _specs(_profile())
    cityscapes, vistas = specs["cityscapes_test_model"], specs["vistas_test_model"]
    words = _command(cityscapes)
    # "single Vistas pre-trained model ... fine + coarse label data" + CLASS-UNIFORM SAMPLING
    assert words[words.index("--init") + 1] == "start.pt" and "--pretrained" not in words
    assert cityscapes["init"] == "vistas_test_model"
    assert {"--coarse", "--class-uniform"} <= set(words) and "--train-val" not in words
    assert words[words.index("--crop") + 1] == "872" and cityscapes["devices"] * 3 == 12
    assert "ms_flip=1.0,1.25,1.5,1.75,2.0:flip" in words
    # Vistas test: "use both training and validation", lr 3.5e-3, 90 epochs, 12 x 776^2
    words = _command(vistas)
    assert {"--train-val", "--class-uniform", "--pretrained"} <= set(words)
    assert words[words.index("--lr") + 1] == "0.0035" and vistas["epochs"] == 90
    assert words[words.index("--crop") + 1] == "776" and vistas["devices"] * 3 == 12
    # the validation rows keep the paper's validation setting
    for name in ("bottom_cityscapes", "bottom_cityscapes_cus", "bottom_vistas_cus"):
        assert not {"--init", "--coarse", "--train-val"} & set(_command(specs[name]))


def test_submissions_predict_each_test_split_with_its_rows_protocol():
    profile = _profile()
    specs = _specs(profile)
    subs = seg_plan.submission_specs(profile["iabn_table2_segmentation"], specs)
    assert subs == {
        "cityscapes_test": {"point": "cityscapes_test_model", "split": "test", "eval": "ms_flip"},
        "vistas_test": {"point": "vistas_test_model", "split": "testing", "eval": "single"}}
    assert specs["vistas_test_model"]["evals"]["single"] == {"scales": [1.0], "flip": False}
    spec = {**specs["cityscapes_test_model"], "device": "cuda"}
    words = shlex.split(seg_plan.submission_command(
        subs["cityscapes_test"], spec, "data", "p.json", "p.pt", "folder", "r.json"))
    assert words[:3] == ["python", "-m", "experiments.train.seg_predict"]
    options = dict(zip(words[3::2], words[4::2]))
    assert options == {"--point": "p.json", "--weights": "p.pt", "--data": "data",
                       "--split": "test", "--eval": "ms_flip", "--predictions": "folder",
                       "--out": "r.json", "--device": "cuda", "--dtype": "float32",
                       "--threads": str(spec["threads"]), "--workers": str(spec["workers"])}
    assert seg_plan.submission_specs(_profile("smoke")["iabn_table2_segmentation"],
                                     _specs(_profile("smoke"))) == {}


@pytest.mark.parametrize("edit, message", [
    (lambda b: b["cityscapes_test_model"].update(init="nowhere"), "init 'nowhere' is not"),
    (lambda b: b["cityscapes_test_model"].update(init="cityscapes_test_model"), "is not another"),
    (lambda b: b["vistas_test_model"].update(init="bottom_vistas_cus"), "itself starts"),
    (lambda b: b["cityscapes_test_model"].update(norm="iabn"), "norm 'iabn' but"),
])
def test_a_bad_init_chain_is_refused(edit, message):
    profile = copy.deepcopy(_profile())
    edit(profile["iabn_table2_segmentation"]["bottom"])
    with pytest.raises(ValueError, match=message):
        _specs(profile)


@pytest.mark.parametrize("submission, message", [
    ({"point": "nowhere", "split": "test", "eval": "single"}, "'nowhere' is not a point"),
    ({"point": "vistas_test_model", "split": "testing", "eval": "ms_flip"},
     "has no evaluation 'ms_flip'"),
])
def test_a_submission_of_no_point_or_evaluation_is_refused(submission, message):
    profile = copy.deepcopy(_profile())
    section = profile["iabn_table2_segmentation"]
    section["submissions"]["bad"] = submission
    with pytest.raises(ValueError, match=message):
        seg_plan.submission_specs(section, _specs(profile))


def test_the_submissions_target_plans_the_chain_and_the_predictions(workdir):
    """``snakemake -n iabn_table2_submissions --config profile=paper``: the Vistas test model
    (from ImageNet), the Cityscapes test model from its weights, and one prediction job per
    submission reading its point's artifact and weights."""
    from snakemake_run import snakemake

    result = snakemake(workdir, "-n", "-p", "iabn_table2_submissions", "--config",
                       "profile=paper")
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(line.split(" > ")[0])
                for line in result.stdout.splitlines() if line.startswith("Shell command: ")]
    by_out = {Path(words[words.index("--out") + 1]).name: words for words in commands
              if "--out" in words}
    segmentation = "artifacts/iabn_table2_segmentation/paper-cuda/"
    cityscapes = by_out["cityscapes_test_model.json"]
    assert cityscapes[cityscapes.index("--init") + 1] == (
        segmentation + "vistas_test_model.weights.pt")
    assert "--train-val" in by_out["vistas_test_model.json"]
    for name, point, split in (("cityscapes_test", "cityscapes_test_model", "test"),
                               ("vistas_test", "vistas_test_model", "testing")):
        words = by_out[f"{name}.json"]
        assert "experiments.train.seg_predict" in words
        assert words[words.index("--point") + 1] == f"{segmentation}{point}.json"
        assert words[words.index("--split") + 1] == split
        assert words[words.index("--predictions") + 1] == (
            f"artifacts/submissions/paper-cuda/{name}")
    assert "wideresnet38_iabn_256.json" in by_out  # the ImageNet point both start from
