"""The Snakemake pipeline: both profiles plan every experiment, a bad configuration stops the
run before any job with an error naming the culprit, and a run resumes where it stopped.

Every test runs Snakemake on the repository's Snakefile in a temporary working directory
(holding a copy of ``artifacts/paper``), so the repository's own artifacts are never touched.
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ("smoke", "paper")
#: experiment id -> its point names, from its section of a profile
EXPERIMENT_POINTS = {
    "densenet_fig2_contiguous": lambda section: [f"c{c}" for c in section["in_channels"]],
    "iabn_table1_timing": lambda section: list(section["modules"]),
    "densenet_fig4_memory": lambda section: [f"{impl}_d{depth}" for impl in section["impls"]
                                             for depth in section["depths"]],
    "densenet_fig5_time": lambda section: [f"d{depth}" for depth in section["depths"]],
    "iabn_table2_capacity": lambda section: [f"{body}_{norm}_{mode}" for body in section["bodies"]
                                             for norm in ("bn", "iabn")
                                             for mode in section["modes"]],
}



@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(ROOT / "artifacts" / "paper", tmp_path / "artifacts" / "paper")
    return tmp_path


def snakemake(workdir, *args):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir),
         "--nolock", *args], capture_output=True, text=True, timeout=300)


def job_counts(output):
    """``{rule: count}`` from Snakemake's "Job stats" table."""
    table = output.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def profile(name):
    return yaml.safe_load((ROOT / "experiments" / "config" / f"{name}.yaml").read_text())


# --------------------------------------------------------------------------- planning
@pytest.mark.parametrize("name", PROFILES)
def test_dry_run_plans_every_experiment(workdir, name):
    result = snakemake(workdir, "-n", "--config", f"profile={name}")
    assert result.returncode == 0, result.stderr
    counts = job_counts(result.stdout)
    config = profile(name)
    run = f"{name}-{config['device']}"
    for experiment, points_of in EXPERIMENT_POINTS.items():
        points = points_of(config[experiment])
        assert counts[f"{experiment}_point"] == len(points), experiment
        for point in points:
            assert f"artifacts/{experiment}/{run}/{point}.json" in result.stdout
        assert f"artifacts/{experiment}.{run}.csv" in result.stdout
        for suffix in ("png", "pdf", "md", "tex"):
            assert f"figures/{run}/{experiment}.{suffix}" in result.stdout
    assert counts["aggregate"] == counts["render"] == len(EXPERIMENT_POINTS)
    assert counts["claims"] == counts["bench_kernels"] == counts["all"] == 1
    assert f"artifacts/bench_kernels/{config['device']}.json" in result.stdout


@pytest.mark.parametrize("experiment", EXPERIMENT_POINTS)
def test_experiment_target_plans_only_its_own_jobs(workdir, experiment):
    result = snakemake(workdir, "-n", experiment)
    assert result.returncode == 0, result.stderr
    points = EXPERIMENT_POINTS[experiment](profile("smoke")[experiment])
    assert job_counts(result.stdout) == {f"{experiment}_point": len(points),
                                         "aggregate": 1, "render": 1, experiment: 1}


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("config, message", [
    ({"bogus": 1}, "'bogus' was unexpected"),
    ({"iabn_table1_timing": {"batch": 1}}, "['iabn_table1_timing']['batch']"),
    ({"densenet_fig2_contiguous": {"in_chanels": [16]}}, "'in_chanels' was unexpected"),
    ({"device": "gpu"}, "'gpu' is not one of ['cpu', 'cuda']"),
    ({"profile": "huge"}, "profile='huge'"),
    ({"densenet_fig4_memory": {"depths": [40, 44]}}, "[44] are not of DenseNet-BC's form 6n + 4"),
    ({"densenet_fig4_memory": {"memory_budget_gib": 0}},
     "['densenet_fig4_memory']['memory_budget_gib']"),
    ({"densenet_fig5_time": {"impls": ["shared", "checkpoint"]}}, "{'const': 'naive'}"),
])
def test_bad_config_stops_before_any_job(workdir, config, message):
    configfile = workdir / "bad.yaml"
    configfile.write_text(yaml.safe_dump({"profile": "smoke", **config}))
    result = snakemake(workdir, "--cores", "1", "--configfile", str(configfile))
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert sorted(p.name for p in (workdir / "artifacts").iterdir()) == ["paper"]


# --------------------------------------------------------------------------- running
TINY = {"profile": "smoke", "densenet_fig2_contiguous": {
    "in_channels": [4, 8], "out_channels": 2, "batch": 2, "size": 4, "warmup": 0, "repeats": 1}}


def test_run_writes_points_and_csv_and_resumes_where_it_stopped(workdir):
    configfile = workdir / "tiny.yaml"
    configfile.write_text(yaml.safe_dump(TINY))
    target = "artifacts/densenet_fig2_contiguous.smoke-cpu.csv"
    first = snakemake(workdir, target, "--cores", "2", "--configfile", str(configfile))
    assert first.returncode == 0, first.stderr
    points = sorted((workdir / "artifacts/densenet_fig2_contiguous/smoke-cpu").iterdir())
    assert [p.name for p in points] == ["c4.json", "c8.json"]
    csv = (workdir / target).read_text().splitlines()
    assert len(csv) == 1 + 2 * 4  # header + 2 points x (2 layouts x 2 passes)
    for point in ("c4", "c8"):
        assert (workdir / f"artifacts/logs/densenet_fig2_contiguous/smoke-cpu/{point}.log").exists()
        assert (workdir / f"artifacts/benchmarks/densenet_fig2_contiguous/smoke-cpu/{point}.tsv").exists()

    # As a run interrupted while measuring c8 leaves it (atomic writes: no c8.json, no CSV),
    # the next run measures c8 alone and aggregates.
    (workdir / "artifacts/densenet_fig2_contiguous/smoke-cpu/c8.json").unlink()
    (workdir / target).unlink()
    second = snakemake(workdir, target, "--cores", "2", "--configfile", str(configfile))
    assert second.returncode == 0, second.stderr
    assert job_counts(second.stdout + second.stderr) == {"densenet_fig2_contiguous_point": 1,
                                                          "aggregate": 1}
