"""The capacity experiment (InPlace-ABN paper, Table 2 brackets): its search and fit logic on
synthetic memory functions, tiny real points of both methods on the CPU, and its notebook."""
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from experiments.report import aggregate, render
from experiments.records import paths
from experiments.iabn_table2_capacity import (METHODS, MIN_CROPS,
                                              capacity_gain, fit_line, largest_fitting,
                                              parse_args, search_capacity, solve)
from side_by_side import run_modules

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "iabn_table2_capacity"
RUN = "test-cpu"
MIB = 2 ** 20
#: A tiny network, crop and budget: about 7 (STD-BN) and 10 (InPlace-ABN) crops of 32^2.
TINY = ["--body", "resnext101", "--width", "0.03125", "--crop", "32", "--batch", "2",
        "--budget-mib", "8", "--fit-batches", "2", "3", "--fit-crops", "16", "24",
        "--warmup", "0", "--repeats", "1"]


def point_args(norm, mode, method=None):
    return [*TINY, "--norm", norm, "--mode", mode] + ([] if method is None else
                                                      ["--method", method])


#: point name -> arguments: both norms and modes by the CPU's default method (fit), and the
#: search of both norms at a fixed crop.
POINTS = {f"resnext101_{norm}_{mode}": point_args(norm, mode)
          for norm in ("bn", "iabn") for mode in ("fixed_crop", "fixed_batch")}
SEARCHES = {f"search_{norm}": point_args(norm, "fixed_crop", "search") for norm in ("bn", "iabn")}


# --------------------------------------------------------------------------- pure logic
@pytest.mark.parametrize("threshold", [1, 2, 3, 5, 17, 64, 100, 1000])
@pytest.mark.parametrize("start", [2, 7, 64])
def test_largest_fitting_finds_a_monotone_threshold(start, threshold):
    n, probes = largest_fitting(lambda k: k <= threshold, start, 2, 1000)
    assert n == max(threshold, 1)
    assert len(probes) <= 2 * 10 + 2  # doubling then bisecting: logarithmic
    assert all(ok == (k <= threshold) for k, ok in probes)


def test_largest_fitting_stops_at_the_upper_limit_and_checks_start():
    assert largest_fitting(lambda k: True, 3, 2, 40)[0] == 40
    with pytest.raises(ValueError, match="start=1 must lie in"):
        largest_fitting(lambda k: True, 1, 2, 40)


def test_fit_recovers_a_line_and_solve_gives_the_exact_capacity():
    a, b = 1.5e9, 12_000.0  # bytes, bytes per pixel
    pixels = [2 * 64 ** 2, 3 * 64 ** 2, 4 * 64 ** 2]
    fitted_a, fitted_b, residual = fit_line(pixels, [a + b * p for p in pixels])
    assert fitted_a == pytest.approx(a) and fitted_b == pytest.approx(b)
    assert residual < 1e-3
    budget = a + b * 7 * 512 ** 2  # exactly seven crops of 512^2
    assert solve(a, b, budget, "fixed_crop", crop=512)[:2] == (7, 512)
    assert solve(a, b, budget - b, "fixed_crop", crop=512)[:2] == (6, 512)  # a pixel less
    # four crops: 7 * 512^2 / 4 = 677.4^2 pixels each -> 672, a multiple of 8
    crops, crop, capacity = solve(a, b, budget, "fixed_batch", batch=4, crop_step=8)
    assert (crops, crop) == (4, 672) and capacity == pytest.approx(7 * 512 ** 2)
    assert solve(a, b, a / 2, "fixed_crop", crop=512)[:2] == (0, 512)
    with pytest.raises(ValueError, match="b=0.0"):
        solve(a, 0.0, budget, "fixed_crop", crop=512)
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit_line([5, 5], [1, 2])


class FakeStep:
    """A training step whose memory is ``a + b * pixels``; above ``oom_bytes`` it raises
    ``torch.OutOfMemoryError`` as the capped CUDA allocator does."""

    def __init__(self, a, b, oom_bytes):
        self.a, self.b, self.oom_bytes = a, b, oom_bytes
        self.released = 0

    def measure(self, crops, crop, repeats=1):
        memory = self.a + self.b * crops * crop * crop
        if memory > self.oom_bytes:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return {"memory_bytes": memory, "step_s": 0.0}

    def release(self):
        self.released += 1


@pytest.mark.parametrize("mode, expected", [("fixed_crop", (28, 512)), ("fixed_batch", (16, 672))])
def test_search_treats_out_of_memory_as_does_not_fit(tmp_path, mode, expected):
    args = parse_args(["--body", "resnext101", "--norm", "iabn", "--mode", mode, "--crop",
                       "512", "--batch", "16", "--budget-mib", "1", "--out",
                       str(tmp_path / "p.json")])
    # a + b * pixels with room for exactly 28 crops of 512^2 = 16 crops of 677^2
    a, b = 1e9, 1e3
    step = FakeStep(a, b, a + b * 28 * 512 ** 2)
    capacity, measurements = search_capacity(step, args, budget=10 ** 15)
    assert (capacity["crops"], capacity["crop_size"]) == expected
    assert step.released == len(measurements) == capacity["probes"]
    assert any(m["memory_bytes"] is None and not m["fits"] for m in measurements)


def test_capacity_gain_is_the_papers_bracket():
    # the paper's Cityscapes batches (Table 2, top)
    rows = [("resnext101", "fixed_crop", "bn", 16, 512),
            ("resnext101", "fixed_crop", "iabn", 28, 512),
            ("resnext101", "fixed_batch", "bn", 16, 512),
            ("resnext101", "fixed_batch", "iabn", 16, 672),
            ("wideresnet38", "fixed_crop", "bn", 20, 512),
            ("wideresnet38", "fixed_crop", "iabn", 28, 512)]
    frame = pd.DataFrame([{"kind": "capacity", "body": b, "mode": m, "norm": n,
                           "method": "allocation_search", "crops": c, "crop_size": s,
                           "pixels": c * s * s, "capacity_pixels": float("nan")}
                          for b, m, n, c, s in rows]
                         + [{"kind": "measurement", "body": "resnext101", "mode": "fixed_crop",
                             "norm": "iabn", "crops": 99, "crop_size": 8, "pixels": 1}])
    table = capacity_gain(frame)
    gains = table.set_index(["body", "mode", "norm"])["gain_pct"]
    assert gains[("resnext101", "fixed_crop", "iabn")] == pytest.approx(75.0)
    assert gains[("resnext101", "fixed_batch", "iabn")] == pytest.approx(72.265625)
    assert gains[("wideresnet38", "fixed_crop", "iabn")] == pytest.approx(40.0)
    assert gains[("resnext101", "fixed_crop", "bn")] == 0
    assert len(table) == len(rows)
    with pytest.raises(ValueError, match="baseline='gn'"):
        capacity_gain(frame, baseline="gn")


@pytest.mark.parametrize("args, message", [
    (["--batch", "1"], "--batch 1: training-mode BN"),
    (["--crop", "100"], "--crop 100: must be a multiple of --crop-step 8"),
    (["--budget-mib", "0"], "--budget-mib 0.0: must be > 0"),
    (["--width", "0"], "--width 0.0: must be > 0"),
    (["--fit-batches", "2", "2"], "--fit-batches 2 2: needs at least two distinct sizes"),
    (["--fit-crops", "4", "16"], "--fit-crops 4 16: needs at least two distinct sizes >= 8"),
    (["--mode", "fixed_size"], "invalid choice: 'fixed_size'"),
])
def test_bad_arguments_are_refused_by_name(tmp_path, capsys, args, message):
    base = {"--body": "wideresnet38", "--norm": "bn", "--mode": "fixed_crop",
            "--budget-mib": "100"}
    for flag, value in base.items():
        if flag not in args:
            args = [*args, flag, value]
    with pytest.raises(SystemExit) as exit:
        parse_args([*args, "--out", str(tmp_path / "p.json")])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_method_defaults_to_fit_on_the_cpu(tmp_path):
    args = parse_args(["--body", "wideresnet38", "--norm", "bn", "--mode", "fixed_batch",
                       "--budget-mib", "100", "--out", str(tmp_path / "p.json")])
    assert args.method == "fit" and args.fit_crops == [128, 256, 384]


def _point_file(path, body, norm, mode, crops, experiment=EXPERIMENT):
    path.write_text(json.dumps({
        "experiment": experiment, "config": {"body": body, "norm": norm, "mode": mode},
        "results": [{"kind": "capacity", "crops": crops, "crop_size": 128}]}))
    return path


def test_fixed_batch_keeps_the_std_bn_batch_of_its_point(tmp_path, capsys):
    common = ["--norm", "iabn", "--budget-mib", "100", "--out", str(tmp_path / "p.json")]
    std_bn = _point_file(tmp_path / "bn.json", "resnext101", "bn", "fixed_crop", 7)
    args = parse_args(["--body", "resnext101", "--mode", "fixed_batch", "--batch-from",
                       str(std_bn), *common])
    assert args.batch == 7 and args.batch_source == "bn"
    for argv, message in (
            (["--body", "wideresnet38", "--mode", "fixed_batch"], "expected wideresnet38/bn"),
            (["--body", "resnext101", "--mode", "fixed_crop"], "fixed_batch only")):
        with pytest.raises(SystemExit):
            parse_args([*argv, "--batch-from", str(std_bn), *common])
        assert message in capsys.readouterr().err
    other = _point_file(tmp_path / "other.json", "resnext101", "bn", "fixed_crop", 7,
                        experiment="densenet_fig4_memory")
    with pytest.raises(SystemExit):
        parse_args(["--body", "resnext101", "--mode", "fixed_batch", "--batch-from",
                    str(other), *common])
    assert "expected iabn_table2_capacity" in capsys.readouterr().err


# --------------------------------------------------------------------------- real points
@pytest.fixture(scope="module")
def artifact_set(tmp_path_factory):
    """Tiny real points (measured in parallel): both methods, aggregated into one run."""
    root = tmp_path_factory.mktemp("artifacts")
    commands = [[f"experiments.{EXPERIMENT}", *args,
                 "--out", paths.point_json(EXPERIMENT, RUN, name, root)]
                for name, args in {**POINTS, **SEARCHES}.items()]
    for run in run_modules(commands):
        assert run.returncode == 0, run.stderr
    aggregate.main([*(paths.point_json(EXPERIMENT, RUN, p, root) for p in POINTS),
                    "--out", paths.aggregate_csv(EXPERIMENT, RUN, root)])
    return root


def load_point(root, name):
    return json.loads(Path(paths.point_json(EXPERIMENT, RUN, name, root)).read_text())


@pytest.mark.parametrize("name", [*POINTS, *SEARCHES])
def test_a_point_writes_a_complete_artifact(artifact_set, name):
    report = load_point(artifact_set, name)
    config, results = report["config"], report["results"]
    search = name.startswith("search")
    assert config["method"] == METHODS["search" if search else "fit"]
    assert config["memory"] == "cpu_tracked_storages"
    assert config["budget_bytes"] == 8 * MIB
    assert (config["inplace_abn_layers"] > 0) == (config["norm"] == "iabn")
    assert [r["kind"] for r in results] == ["capacity"] + ["measurement"] * (len(results) - 1)
    capacity, measurements = results[0], results[1:]
    assert capacity["pixels"] == capacity["crops"] * capacity["crop_size"] ** 2
    assert capacity["probes"] == len(measurements) >= 2
    for m in measurements:
        assert m["pixels"] == m["crops"] * m["crop_size"] ** 2
        assert m["fits"] == (m["memory_bytes"] <= config["budget_bytes"])
    if search:
        fitting = [m["crops"] for m in measurements if m["fits"]]
        failing = [m["crops"] for m in measurements if not m["fits"]]
        assert capacity["crops"] == max(fitting) == min(failing) - 1
    else:
        assert capacity["bytes_per_pixel"] > 0 and capacity["intercept_bytes"] > 0
        assert all(0 < m["saved_bytes"] < m["memory_bytes"] for m in measurements)
        # memory is affine in the pixels: the fit is exact up to rounding
        assert capacity["fit_max_residual_bytes"] < 1e-3 * capacity["intercept_bytes"]
    assert report["environment"]["device"] == "cpu"


@pytest.mark.parametrize("norm", ["bn", "iabn"])
def test_fit_and_search_agree(artifact_set, norm):
    fit = load_point(artifact_set, f"resnext101_{norm}_fixed_crop")["results"][0]
    search = load_point(artifact_set, f"search_{norm}")["results"][0]
    assert fit["crops"] == search["crops"] >= MIN_CROPS


def test_inplace_abn_fits_more_in_the_same_budget(artifact_set):
    frame = pd.read_csv(paths.aggregate_csv(EXPERIMENT, RUN, artifact_set))
    table = capacity_gain(frame).set_index(["mode", "norm"])
    for mode in ("fixed_crop", "fixed_batch"):
        assert table.loc[(mode, "iabn"), "gain_pct"] > 0, mode
        assert table.loc[(mode, "iabn"), "fit_gain_pct"] > 20, mode
    bytes_per_pixel = frame[frame["kind"] == "capacity"].groupby("norm")["bytes_per_pixel"].mean()
    assert bytes_per_pixel["iabn"] < 0.8 * bytes_per_pixel["bn"]


def test_notebook_renders_figure_and_table(artifact_set, tmp_path):
    out = tmp_path / "figures"
    status = render.main([str(ROOT / "figures" / f"{EXPERIMENT}.ipynb"), "--run", RUN,
                          "--artifacts", str(artifact_set), "--out", str(out)])
    assert status == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{EXPERIMENT}.{s}" for s in ("html", "md", "pdf", "png", "tex"))
    assert (out / f"{EXPERIMENT}.png").read_bytes().startswith(b"\x89PNG")
    assert (out / f"{EXPERIMENT}.pdf").read_bytes().startswith(b"%PDF")
    markdown = (out / f"{EXPERIMENT}.md").read_text()
    assert "| INPLACE-ABN, FIXED CROP |" in markdown and "ResNeXt-101" in markdown
    assert "%]" in markdown  # the bracket
    assert "\\begin{tabular}" in (out / f"{EXPERIMENT}.tex").read_text()
    assert "<table>" in (out / f"{EXPERIMENT}.html").read_text()  # the report's table


def test_notebook_renders_a_data_set_whose_chain_has_fewer_bodies(artifact_set, tmp_path):
    """One data set's chain covers both bodies and another's one (as the smoke profile's
    COCO-Stuff, WideResNet-38 only): every panel plots and labels the bodies it has."""
    frame = pd.read_csv(paths.aggregate_csv(EXPERIMENT, RUN, artifact_set))
    two_bodies = pd.concat([frame, frame.assign(body="wideresnet38")]).assign(dataset="cityscapes")
    one_body = frame.assign(body="wideresnet38", dataset="cocostuff")
    root = tmp_path / "artifacts"
    csv = Path(paths.aggregate_csv(EXPERIMENT, RUN, root))
    csv.parent.mkdir(parents=True)
    pd.concat([two_bodies, one_body]).to_csv(csv, index=False)
    out = tmp_path / "figures"
    status = render.main([str(ROOT / "figures" / f"{EXPERIMENT}.ipynb"), "--run", RUN,
                          "--artifacts", str(root), "--out", str(out)])
    assert status == 0
    assert (out / f"{EXPERIMENT}.png").read_bytes().startswith(b"\x89PNG")
    markdown = (out / f"{EXPERIMENT}.md").read_text()
    assert "COCO-Stuff" in markdown and "Cityscapes" in markdown


def capacity_claim_frame(device):
    """A run with real points (+25%) and simulated paper-scale points (+75%, within the
    claim's +70% to +80% band around the paper's +75%)."""
    rows = []
    for memory, dataset, counts, width, budget in (
            ("cpu_tracked_storages", None, (4, 5), 0.0625, 90),
            ("simulated_meta_device", "cityscapes", (4, 7), 1.0, 12288),
            ("simulated_meta_device", "cocostuff", (2, 2), 1.0, 12288)):
        for norm, crops in zip(("bn", "iabn"), counts):
            rows.append({"kind": "capacity", "memory": memory, "dataset": dataset,
                         "body": "resnext101",
                         "mode": "fixed_crop", "norm": norm, "method": "allocation_search",
                         "crops": crops, "crop_size": 512, "pixels": crops * 512 ** 2,
                         "capacity_pixels": None, "width": width, "budget_mib": budget,
                         "device": device})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("device, verdict, judged", [
    ("cpu", "reproduced", "simulated"), ("cuda", "not reproduced", "real")])
def test_data_increase_claim_is_judged_on_simulated_points_without_a_gpu(device, verdict,
                                                                        judged):
    from experiments.report.claims import load_claims
    from experiments.report.verdicts import EVALUATORS

    claim = next(c for c in load_claims(ROOT / "artifacts")
                 if c["id"] == "iabn_segmentation_data_increase")
    outcome = EVALUATORS[claim["id"]](claim, capacity_claim_frame(device))
    assert outcome.verdict == verdict
    assert f"{judged} points" in outcome.reason
    assert ("simulated tensor memory" in outcome.reason) == (judged == "simulated")
    assert "Cityscapes ResNeXt-101 FIXED CROP: 4 x 512^2 -> 7 x 512^2 (+75%)" in outcome.measured
    assert "4 x 512^2 -> 5 x 512^2 (+25%)" in outcome.measured
    assert "COCO-Stuff ResNeXt-101 FIXED CROP: 2 x 512^2 -> 2 x 512^2 (+0%)" in outcome.measured
