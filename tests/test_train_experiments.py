"""The training experiments on the engine: their plans (profile -> command line), the training
point's command line end to end on generated data, the parity of STD-BN and InPlace-ABN in
float64, and the evaluators of their claims."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from experiments.report import claims, training, training_claims
from experiments.train import parity, plan
from experiments.train.data import generate_cifar, generate_imagenet
from experiments.train.models import build_model

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- plans
SECTION = {
    "defaults": {"dataset": "imagenet", "model": "resnext101", "model_args": {"width": 0.5},
                 "norm": "iabn", "epochs": 3, "batch": 32, "lr": 0.1, "schedule": "step",
                 "schedule_args": {"step_epochs": 30}, "nproc": 1, "resize": 36, "crop": 32,
                 "crop_style": "resize_crop",
                 "evals": {"center224": {"mode": "center", "resize": 36, "crop": 32}},
                 "workers": 0, "threads": 1, "seed": 0, "dtype": "float32",
                 "device": "cpu"},
    "points": {"a": {"norm": "bn"},
               "b": {"model": "densenet264", "model_args": {"width": None, "growth_rate": 8},
                     "nproc": 2}},
}


def test_point_specs_merge_defaults_and_model_args():
    specs = plan.point_specs(SECTION)
    assert specs["a"]["norm"] == "bn" and specs["a"]["model_args"] == {"width": 0.5}
    assert specs["b"]["model_args"] == {"growth_rate": 8}, "null removes a default argument"
    assert specs["b"]["model"] == "densenet264" and specs["b"]["norm"] == "iabn"


def test_paper_table1_trains_on_the_papers_four_gpus():
    """InPlace-ABN Sec. 4: "machines comprising four NVIDIA Titan Xp cards"; STD-BN's batch 256
    is "the maximum batch size that fits in GPU memory", i.e. 64 images on each of four GPUs
    (the InPlace-ABN 512 row: 128)."""
    import yaml

    profile = yaml.safe_load((ROOT / "experiments" / "config" / "paper.yaml").read_text())
    specs = plan.point_specs(profile["iabn_table1_imagenet"])
    assert {name: spec["nproc"] for name, spec in specs.items()} == dict.fromkeys(specs, 4)
    per_gpu = {name: spec["batch"] // spec["nproc"] for name, spec in specs.items()}
    assert per_gpu["resnext101_bn_256"] == 64 and per_gpu["resnext101_iabn_512"] == 128


def test_paper_fig6_trains_with_fb_resnet_torchs_random_sized_crops():
    """DenseNet Sec. 5: ImageNet "following the same procedure described in [9]"
    (fb.resnet.torch's scale augmentation); InPlace-ABN Sec. 4.1: shorter side 256, random
    224 crops. Each point's command carries its style."""
    import yaml

    profile = yaml.safe_load((ROOT / "experiments" / "config" / "paper.yaml").read_text())
    for experiment, style in (("densenet_fig6_imagenet", "random_resized"),
                              ("iabn_table1_imagenet", "resize_crop")):
        for spec in plan.point_specs(profile[experiment]).values():
            words = plan.arguments({**spec, "device": "cuda"}, "/data")
            assert words[words.index("--crop-style") + 1] == style, experiment


def test_command_launches_several_ranks_forked_on_the_cpu_and_by_torchrun_on_cuda():
    specs = plan.point_specs(SECTION)
    outputs = {"out": "o.json", "epochs_csv": "o.csv", "weights": "o.pt", "work_dir": "w"}
    one = plan.command("iabn_table1_imagenet", specs["a"], "data", outputs)
    two = plan.command("iabn_table1_imagenet", specs["b"], "data", outputs)
    gpus = plan.command("iabn_table1_imagenet", {**specs["b"], "device": "cuda"}, "data",
                        outputs)
    assert one.startswith("python -m experiments.iabn_table1_imagenet ")
    assert two.startswith("python -m experiments.train.launch --standalone "
                          "--nproc-per-node=2 -m experiments.iabn_table1_imagenet ")
    assert gpus.startswith("torchrun --standalone --nproc-per-node=2 -m "
                           "experiments.iabn_table1_imagenet ")
    assert gpus.split(" -m ", 1)[1] == two.split(" -m ", 2)[2].replace("--device cpu",
                                                                      "--device cuda")
    assert "--model-arg width=0.5" in one and "--eval center224=center:36:32" in one
    assert "--work-dir w" in two and "--model-arg growth_rate=8" in two


def test_build_model_names_a_bad_model_or_argument():
    with pytest.raises(ValueError, match="model='resnet50'"):
        build_model("resnet50", norm="bn", num_classes=10)
    with pytest.raises(ValueError, match="model_args"):
        build_model("densenet_bc", norm="bn", num_classes=10, depth=10, growth_rate=4,
                    widht=2)


# --------------------------------------------------------------------------- parity
#: model -> (constructor arguments, input size, batch) at which its tiny version learns.
PARITY_MODELS = {"resnext101": ({"width": 1 / 32}, 32, 8),
                 "densenet_bc": ({"depth": 10, "growth_rate": 4, "impl": "naive"}, 16, 4)}


def _batches(count=3, batch=4, size=16, classes=5):
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 3, size, size, generator=generator, dtype=torch.float64),
             torch.randint(classes, (batch,), generator=generator)) for _ in range(count)]


@pytest.mark.parametrize("name", sorted(PARITY_MODELS))
def test_inplace_abn_trains_like_standard_bn_in_float64(name):
    torch.manual_seed(0)
    model_args, size, batch = PARITY_MODELS[name]
    models = parity.twin_models(name, model_args, num_classes=5)
    records = parity.train_side_by_side(models, _batches(size=size, batch=batch), steps=12,
                                        lr=0.01)
    losses = [r["loss_std_bn"] for r in records]
    assert losses[-1] < losses[0], "the networks must learn for the comparison to mean much"
    inplace = parity.relative_differences(records, "inplace_abn")
    control = parity.relative_differences(records, "control")
    assert inplace[0] <= max(10 * control[0], 1e-13), "the same forward to rounding"
    summary = parity.summary(records)
    assert parity.keeps_pace(summary["steps_within_rounding_inplace_abn"],
                             summary["steps_within_rounding_control"])
    if name == "densenet_bc":  # well conditioned: the three agree to rounding throughout
        assert max(inplace) < 1e-13 and max(control) < 1e-13


def test_rounding_control_starts_within_rounding_of_standard_bn():
    torch.manual_seed(0)
    standard, _, control = parity.twin_models("densenet_bc", PARITY_MODELS["densenet_bc"][0], 5)
    ratio = max(((c - s).abs() / s.abs().clamp_min(1e-300)).max().item()
                for s, c in zip(standard.parameters(), control.parameters()))
    assert 0 < ratio <= 2 * parity.CONTROL_PERTURBATION


def test_parity_check_detects_a_different_computation():
    """The control: InPlace-ABN with its default |w| + eps scale computes another function,
    and the comparison sees it from the first step."""
    torch.manual_seed(0)
    models = parity.twin_models("resnext101", {"width": 1 / 32}, num_classes=5)
    for module in models[1].modules():
        if hasattr(module, "scale_mode"):
            module.scale_mode = "abs"
    records = parity.train_side_by_side(models, _batches(size=32, batch=8), steps=3, lr=0.01)
    assert parity.steps_within_rounding(records, "inplace_abn") == 0
    assert parity.steps_within_rounding(records, "control") >= 1


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate_cifar(root / "cifar10", "cifar10", train_per_class=8, test_per_class=2)
    generate_imagenet(root / "imagenet", classes=4, train_per_class=8, val_per_class=2)
    return root


def _outputs(tmp_path, name="p"):
    return ["--out", str(tmp_path / f"{name}.json"), "--epochs-csv",
            str(tmp_path / f"{name}.epochs.csv"), "--weights", str(tmp_path / f"{name}.pt"),
            "--work-dir", str(tmp_path / "work")]


def _run(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_table1_point_trains_evaluates_and_writes_its_artifacts(data, tmp_path):
    done = _run("experiments.iabn_table1_imagenet", "--data", str(data / "imagenet"),
                "--model", "resnext101", "--model-arg", "width=0.03125", "--norm", "iabn",
                "--epochs", "2", "--batch", "8", "--schedule", "step", "--resize", "20",
                "--crop", "16", "--eval", "center224=center:20:16",
                "--eval", "crops10_224=ten_crop:20:16", *_outputs(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["experiment"] == "iabn_table1_imagenet"
    assert [r["eval"] for r in report["results"]] == ["center224", "crops10_224"]
    row = report["results"][0]
    assert row["images"] == 8 and row["train_images"] == 32 and row["world_size"] == 1
    assert 0 <= row["top1_error_pct"] <= 100 and row["top5_error_pct"] <= row["top1_error_pct"]
    assert report["config"]["norm"] == "iabn" and json.loads(report["config"]["model_args"]) == {
        "width": 0.03125}
    epochs = pd.read_csv(tmp_path / "p.epochs.csv")
    assert list(epochs["epoch"]) == [1, 2]
    state = torch.load(tmp_path / "p.pt", weights_only=True)
    assert any(key.endswith("running_mean") for key in state)
    assert not (tmp_path / "work").exists(), "a finished point removes its checkpoint"


def test_preact_point_trains_a_post_activation_densenet(data, tmp_path):
    done = _run("experiments.densenet_fig2_preact", "--dataset", "cifar10", "--data",
                str(data / "cifar10"), "--model-arg", "depth=10", "--model-arg",
                "growth_rate=4", "--model-arg", "preact=false", "--epochs", "1", "--batch",
                "16", "--schedule", "cifar", *_outputs(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "p.json").read_text())
    assert json.loads(report["config"]["model_args"])["preact"] is False
    assert report["results"][0]["eval"] == "test" and report["results"][0]["images"] == 20


def test_parity_point_records_both_loss_curves(data, tmp_path):
    done = _run("experiments.iabn_table1_imagenet", "parity", "--data", str(data / "imagenet"),
                "--model", "resnext101", "--model-arg", "width=0.03125", "--steps", "4",
                "--batch", "4", "--resize", "20", "--crop", "16", "--out",
                str(tmp_path / "parity.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "parity.json").read_text())["results"]
    assert [r["step"] for r in results] == [0, 1, 2, 3]
    assert {"loss_std_bn", "loss_inplace_abn", "loss_control"} <= set(results[0])
    assert parity.keeps_pace(results[0]["steps_within_rounding_inplace_abn"],
                             results[0]["steps_within_rounding_control"])


def test_missing_data_path_is_a_named_error(tmp_path):
    done = _run("experiments.densenet_fig6_imagenet", "--data", str(tmp_path / "nowhere"),
                "--model", "densenet264", "--epochs", "1", "--batch", "8", "--schedule",
                "cosine", *_outputs(tmp_path))
    assert done.returncode == 2
    assert "--data" in done.stderr and "nowhere" in done.stderr
    assert not (tmp_path / "p.json").exists()


# --------------------------------------------------------------------------- claims
def _table1_frame(epochs, train_images, top1_error):
    rows = []
    for point in ("resnext101_bn_256", "resnext101_iabn_512"):
        for ev in training.EVALUATIONS:
            rows.append({"point": point, "eval": ev, "model": "resnext101", "dataset": "imagenet",
                         "model_args": "{}", "epochs": epochs, "train_images": train_images,
                         "batch": 256, "world_size": 8, "params": 83_500_000,
                         "top1_error_pct": top1_error[point], "top5_error_pct": 6.0})
    return pd.DataFrame(rows)


def _claim(claim_id):
    return next(c for c in claims.load_claims(ROOT / "artifacts")
                if c["id"] == claim_id)


def test_table1_claims_need_the_paper_setting():
    claim = _claim("iabn_imagenet_top1")
    smoke = _table1_frame(3, 400, {"resnext101_bn_256": 40.0, "resnext101_iabn_512": 38.0})
    outcome = claims.EVALUATORS[claim["id"]](claim, smoke)
    assert outcome.verdict == claims.NOT_MEASURED and "400 images" in outcome.reason
    full = training_claims.FULL_TRAIN_IMAGES["imagenet"]
    close = _table1_frame(90, full, {"resnext101_bn_256": 100 - 77.1, "resnext101_iabn_512":
                                     100 - 78.0})
    assert claims.EVALUATORS[claim["id"]](claim, close).verdict == claims.REPRODUCED
    far = _table1_frame(90, full, {"resnext101_bn_256": 100 - 77.1, "resnext101_iabn_512":
                                   100 - 76.0})
    assert claims.EVALUATORS[claim["id"]](claim, far).verdict == claims.NOT_REPRODUCED


def test_parity_claim_compares_with_the_rounding_control():
    claim = _claim("iabn_float64_parity")
    steps = training_claims.PARITY_MIN_STEPS

    def frame(inplace_steps, control_steps):
        return pd.DataFrame([{"point": "parity_resnext101", "model": "resnext101", "step": s,
                              "loss_std_bn": 2.0 - s / 100,
                              "steps_within_rounding_inplace_abn": inplace_steps,
                              "max_loss_rel_diff_inplace_abn": 1e-3,
                              "steps_within_rounding_control": control_steps,
                              "max_loss_rel_diff_control": 1e-3} for s in range(steps)])

    evaluate = claims.EVALUATORS[claim["id"]]
    assert evaluate(claim, frame(steps, steps)).verdict == claims.BY_CONSTRUCTION
    assert evaluate(claim, frame(40, 30)).verdict == claims.BY_CONSTRUCTION
    assert evaluate(claim, frame(4, 5)).verdict == claims.BY_CONSTRUCTION
    assert evaluate(claim, frame(3, 30)).verdict == claims.NOT_REPRODUCED
