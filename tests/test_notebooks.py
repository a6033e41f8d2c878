"""Every figure notebook executes top to bottom against a small artifact set and writes its
figure (PNG, PDF) and table (Markdown, LaTeX)."""
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.report import aggregate, render
from experiments.records import paths

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
        for impl in ("naive", "shared") for depth in (10, 16)},
    "densenet_fig5_time": {
        "d10": ["--depth", "10", "--growth-rate", "4", "--batch", "2", "--size", "8"]},
    # fit (the CPU's method) at 1/32 width on 32x32 crops within 8 MiB: 7-10 crops.
    "iabn_table2_capacity": {
        f"resnext101_{norm}_{mode}": ["--body", "resnext101", "--norm", norm, "--mode", mode,
                                      "--width", "0.03125", "--crop", "32", "--batch", "2",
                                      "--budget-mib", "8", "--fit-batches", "2", "3",
                                      "--fit-crops", "16", "24"]
        for norm in ("bn", "iabn") for mode in ("fixed_crop", "fixed_batch")},
}

NOTEBOOKS = sorted(p.stem for p in (ROOT / "figures").glob("*.ipynb"))


@pytest.fixture(scope="module")
def artifact_set(tmp_path_factory):
    """Tiny real points of every experiment (measured in parallel), aggregated per run."""
    root = tmp_path_factory.mktemp("artifacts")
    jobs = []
    for experiment, points in TINY_POINTS.items():
        for name, args in points.items():
            out = Path(paths.point_json(experiment, RUN, name, root))
            jobs.append(subprocess.Popen(
                [sys.executable, "-m", f"experiments.{experiment}", *args, "--warmup", "0",
                 "--repeats", "1", "--out", str(out)],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for job in jobs:
        _, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
    for experiment, points in TINY_POINTS.items():
        aggregate.main([*(paths.point_json(experiment, RUN, p, root) for p in points),
                        "--out", paths.aggregate_csv(experiment, RUN, root)])
    return root


def test_every_notebook_has_a_small_artifact_set():
    assert NOTEBOOKS, "no notebooks in figures/"
    assert set(NOTEBOOKS) <= set(TINY_POINTS), "add tiny points for the new notebook"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_renders_figure_and_table(artifact_set, tmp_path, notebook):
    out = tmp_path / "figures"
    status = render.main([str(ROOT / "figures" / f"{notebook}.ipynb"), "--run", RUN,
                          "--artifacts", str(artifact_set), "--out", str(out)])
    assert status == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(f"{notebook}.{s}" for s in ("md", "pdf", "png", "tex"))
    assert (out / f"{notebook}.png").read_bytes().startswith(b"\x89PNG")
    assert (out / f"{notebook}.pdf").read_bytes().startswith(b"%PDF")
    markdown = (out / f"{notebook}.md").read_text()
    assert "| --- |" not in markdown and "|---|" in markdown
    assert "\\begin{tabular}" in (out / f"{notebook}.tex").read_text()


def test_a_notebook_without_artifacts_fails_with_the_missing_file(tmp_path, capsys):
    status = render.main([str(ROOT / "figures" / f"{NOTEBOOKS[0]}.ipynb"), "--run", "none-cpu",
                          "--artifacts", str(tmp_path), "--out", str(tmp_path / "out")])
    assert status == 1
    assert f"{NOTEBOOKS[0]}.none-cpu.csv does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
