"""Every figure notebook executes top to bottom against a small artifact set and writes its
figure (PNG, PDF) and table (Markdown, LaTeX)."""
import itertools
import shutil
from pathlib import Path

import pytest

from experiments.report import aggregate, render
from experiments.records import paths
from experiments.train.data import generate_cifar, generate_cityscapes, generate_imagenet
from side_by_side import run_modules

ROOT = Path(__file__).resolve().parents[1]
RUN = "test-cpu"
#: experiment -> {point: arguments of one tiny point}
TINY_POINTS = {
    "densenet_fig2_contiguous": {
        f"c{c}": ["--in-channels", str(c), "--out-channels", "2", "--batch", "2", "--size", "4"]
        for c in (4, 8)},
    "iabn_table1_timing": {
        module: ["--module", module, "--batch", "2", "--max-size", "2"]
        for module in ("conv3", "conv4")},
    # Peak memory (a subprocess) measured at one point only: measured and missing peaks plot.
    "densenet_fig4_memory": {
        f"{impl}_d{depth}": ["--impl", impl, "--depth", str(depth), "--growth-rate", "4",
                             "--batch", "2", "--size", "8",
                             *([] if (impl, depth) == ("naive", 10) else ["--no-peak"])]
        for impl in ("naive", "shared") for depth in (10, 16)}
    | {f"simulated_{impl}": ["--simulate", "--impl", impl, "--depths", "10", "16",
                             "--max-depth", "40", "--growth-rate", "4", "--batch", "2",
                             "--size", "8", "--budget-gib", str(0.3 / 1024)]
       for impl in ("naive", "shared")},
    "densenet_fig5_time": {
        "d10": ["--depth", "10", "--growth-rate", "4", "--batch", "2", "--size", "8"]},
    # A network without and one with implementations (DenseNet's shared, shared_inplace).
    "whole_step": {
        network: ["--network", network, "--width", "0.03125", "--batch", "2", "--size", "32",
                  "--classes", "3", "--variants", "II"]
        for network in ("resnext101", "densenet264")},
    # fit (the CPU's method) at 1/32 width on 32x32 crops within 8 MiB: 7-10 crops.
    "iabn_table2_capacity": {
        f"resnext101_{norm}_{mode}": ["--body", "resnext101", "--norm", norm, "--mode", mode,
                                      "--width", "0.03125", "--crop", "32", "--batch", "2",
                                      "--budget-mib", "8", "--fit-batches", "2", "3",
                                      "--fit-crops", "16", "24"]
        for norm in ("bn", "iabn") for mode in ("fixed_crop", "fixed_batch")}
    | {f"simulated_cityscapes_resnext101_{norm}_fixed_crop": [
        "--simulate", "--dataset", "cityscapes", "--body", "resnext101", "--norm", norm,
        "--mode", "fixed_crop",
        "--width", "0.03125", "--crop", "32", "--batch", "2", "--budget-mib", "8"]
       for norm in ("bn", "iabn")},
    # Two seeds (the spread needs two), one epoch of the narrowest network.
    "iabn_digits_on_par": {
        f"seed{seed}": ["--seed", str(seed), "--epochs", "1", "--width", "4"] for seed in (0, 1)},
}

#: The experiments of TINY_POINTS that time nothing (no --warmup, --repeats).
UNTIMED = ("iabn_digits_on_par",)

#: The notebook of the kernel benchmark (its artifact is a JSON file, not points) and the
#: arguments of a tiny benchmark.
BENCH_NOTEBOOK = "bench_kernels"
TINY_BENCH = ["--shapes", "2", "4", "4", "4", "2", "8", "4", "4", "--dtypes", "float32",
              "bfloat16", "--threads", "1", "--warmup", "0", "--repeats", "1", "--run", RUN]

NOTEBOOKS = sorted(p.stem for p in (ROOT / "figures").glob("*.ipynb"))


#: experiment -> {point: arguments of one tiny training point}; ``{data}`` is the generated
#: data sets' root.
TINY_TRAINING = {
    "densenet_fig2_preact": {
        f"cifar10_{order}": ["--dataset", "cifar10", "--data", "{data}/cifar10", "--model-arg",
                             "depth=10", "--model-arg", "growth_rate=4", "--model-arg",
                             f"preact={order == 'preact'}", "--epochs", "2", "--batch", "16",
                             "--schedule", "cifar"]
        for order in ("preact", "postact")},
    "densenet_fig6_imagenet": {
        f"densenet264_k{k}_{schedule}": [
            "--data", "{data}/imagenet", "--model", "densenet264", "--model-arg",
            f"growth_rate={k}", "--epochs", "1",
            "--batch", "8", "--schedule", schedule, "--resize", "36", "--crop", "32",
            "--eval", "center224=center:36:32"]
        for k, schedule in ((2, "step"), (3, "cosine"))},
    "iabn_table1_imagenet": {
        **{f"resnext101_{norm}_{batch}": [
            "--data", "{data}/imagenet", "--model", "resnext101", "--model-arg",
            "width=0.03125", "--norm", norm, "--epochs", "1", "--batch", "8", "--schedule",
            "step", "--resize", "20", "--crop", "16", "--eval", "center224=center:20:16",
            "--eval", "crops10_224=ten_crop:20:16", "--eval", "center320=center:24:24"]
           for norm, batch in (("bn", 256), ("iabn", 512))},
        "parity_resnext101": ["parity", "--data", "{data}/imagenet", "--model", "resnext101",
                              "--model-arg", "width=0.03125", "--steps", "3", "--batch", "4",
                              "--resize", "20", "--crop", "16"]},
    # Two Table 2 top cells (a bracket) and a bottom row with the 5 scales + flipping
    # evaluation, from scratch at 1/32 width on a generated Cityscapes set.
    "iabn_table2_segmentation": {
        point: ["--dataset", "cityscapes", "--data", "{data}/cityscapes", "--body", body,
                "--model-arg", "width=0.03125", "--norm", norm, "--crops", "2", "--crop", crop,
                "--epochs", "2", *extra]
        for point, body, norm, crop, extra in (
            ("resnext101_cityscapes_bn_fixed_crop", "resnext101", "bn", "32", []),
            ("resnext101_cityscapes_iabn_fixed_batch", "resnext101", "iabn", "48", []),
            ("bottom_cityscapes_cus", "wideresnet38", "iabn_sync", "32",
             ["--class-uniform", "--eval", "single=1:noflip", "--eval",
              "ms_flip=1,1.25,1.5,1.75,2:flip"]))},
}


def _command(experiment, name, args, root, data):
    """The command line of one tiny point writing under ``root``."""
    out = paths.point_json(experiment, RUN, name, root)
    if experiment in UNTIMED:
        return [*args, "--out", out]
    if experiment not in TINY_TRAINING:
        return [*args, "--warmup", "0", "--repeats", "1", "--out", out]
    args = [a.format(data=data) for a in args]
    if args[0] == "parity":
        return [*args, "--out", out]
    return [*args, "--out", out, "--epochs-csv", paths.epochs_csv(experiment, RUN, name, root),
            "--weights", paths.weights(experiment, RUN, name, root),
            "--work-dir", paths.work_dir(experiment, RUN, name, root)]


def _commands(root, data):
    """The command lines of the tiny benchmark and of every tiny point, writing under ``root``.

    The points of one experiment compile the same numba kernels: one point of every experiment
    comes before the second point of any, so that (run side by side, from an empty disk cache)
    a second point starts once its experiment's first has compiled them, and loads them."""
    commands = [["experiments.bench_kernels", *TINY_BENCH,
                 "--out", paths.bench_kernels_json(RUN, root)]]
    per_experiment = [[[f"experiments.{experiment}", *_command(experiment, name, args, root, data)]
                       for name, args in points.items()]
                      for experiment, points in {**TINY_POINTS, **TINY_TRAINING}.items()]
    for points in itertools.zip_longest(*per_experiment):
        commands.extend(command for command in points if command is not None)
    return commands


@pytest.fixture(scope="module")
def artifact_set(tmp_path_factory):
    """Tiny real points of every experiment (measured in parallel, the training ones on
    generated data sets), aggregated per run, a tiny kernel benchmark, and the papers' numbers
    the notebooks show."""
    root = tmp_path_factory.mktemp("artifacts")
    data = tmp_path_factory.mktemp("data")
    generate_cifar(data / "cifar10", "cifar10", train_per_class=4, test_per_class=2)
    generate_imagenet(data / "imagenet", classes=4, train_per_class=4, val_per_class=2)
    generate_cityscapes(data / "cityscapes", train_images=4, val_images=2, size=(64, 32))
    shutil.copytree(ROOT / "artifacts" / "paper", root / "paper")
    for run in run_modules(_commands(root, data)):
        assert run.returncode == 0, run.stderr
    for experiment, points in {**TINY_POINTS, **TINY_TRAINING}.items():
        aggregate.main([*(paths.point_json(experiment, RUN, p, root) for p in points),
                        "--out", paths.aggregate_csv(experiment, RUN, root)])
    return root


def test_every_notebook_has_a_small_artifact_set():
    assert NOTEBOOKS, "no notebooks in figures/"
    assert set(NOTEBOOKS) <= {*TINY_POINTS, *TINY_TRAINING, BENCH_NOTEBOOK}, \
        "add tiny points for the notebook"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_renders_figure_and_table(artifact_set, tmp_path, notebook):
    out = tmp_path / "figures"
    status = render.main([str(ROOT / "figures" / f"{notebook}.ipynb"), "--run", RUN,
                          "--artifacts", str(artifact_set), "--out", str(out)])
    assert status == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(f"{notebook}.{s}" for s in ("html", "md", "pdf", "png", "tex"))
    assert "<table>" in (out / f"{notebook}.html").read_text()
    assert (out / f"{notebook}.png").read_bytes().startswith(b"\x89PNG")
    assert (out / f"{notebook}.pdf").read_bytes().startswith(b"%PDF")
    markdown = (out / f"{notebook}.md").read_text()
    assert "| --- |" not in markdown and "|---|" in markdown
    assert "\\begin{tabular}" in (out / f"{notebook}.tex").read_text()


@pytest.mark.parametrize("notebook, missing", [
    ("densenet_fig2_contiguous", "densenet_fig2_contiguous.none-cpu.csv"),
    (BENCH_NOTEBOOK, "bench_kernels/none-cpu.json")])
def test_a_notebook_without_artifacts_fails_with_the_missing_file(tmp_path, capsys, notebook,
                                                                   missing):
    status = render.main([str(ROOT / "figures" / f"{notebook}.ipynb"), "--run", "none-cpu",
                          "--artifacts", str(tmp_path), "--out", str(tmp_path / "out")])
    assert status == 1
    assert f"{missing} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_notebook_reads_the_artifacts_of_the_checkout_it_lies_in(tmp_path, monkeypatch):
    """In Jupyter the kernel starts in the notebook's directory: the default locations follow
    that checkout, not the one the package was installed from; the variables still win."""
    clone = tmp_path / "clone"
    (clone / "artifacts").mkdir(parents=True)
    (clone / "figures").mkdir()
    (clone / "Snakefile").write_text("")
    for name in ("ARTIFACTS_DIR", "ARTIFACTS_RUN", "FIGURES_DIR"):
        monkeypatch.delenv(name, raising=False)

    monkeypatch.chdir(clone / "figures")
    assert paths.checkout_root() == clone.resolve()
    assert paths.artifacts_dir() == clone.resolve() / "artifacts"
    assert paths.figures_dir(RUN) == clone.resolve() / "figures" / RUN
    Path(paths.aggregate_csv("densenet_fig5_time", RUN, clone / "artifacts")).write_text("a\n1\n")
    assert paths.current_run("densenet_fig5_time") == RUN

    monkeypatch.setenv("ARTIFACTS_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("FIGURES_DIR", str(tmp_path / "out"))
    assert paths.artifacts_dir() == tmp_path / "elsewhere"
    assert paths.figures_dir(RUN) == tmp_path / "out"

    # Outside any checkout: the one the package was installed from.
    outside = tmp_path / "notebooks"
    outside.mkdir()
    monkeypatch.chdir(outside)
    assert paths.checkout_root() == paths.REPO_ROOT
