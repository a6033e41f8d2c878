"""The Snakemake pipeline: both profiles plan every experiment, a bad configuration stops the
run before any job with an error naming the culprit, a run resumes where it stopped, and a
rerun measures exactly the points that are missing or whose code changed.

Every test runs Snakemake on the repository's Snakefile in a temporary working directory
(holding a copy of ``artifacts/paper``), or on a temporary copy of the code (the rerun tests edit
it), so the repository's own artifacts and code are never touched.
"""
import re
import shlex
from pathlib import Path

import pytest
import yaml

from experiments.records import run_record, sources
from snakemake_run import copy_checkout, snakemake, snakemake_in, touch_outputs

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ("smoke", "paper")
#: experiment id -> its point names, from its section of a profile
EXPERIMENT_POINTS = {
    "densenet_fig2_contiguous": lambda section: [f"c{c}" for c in section["in_channels"]],
    "iabn_table1_timing": lambda section: list(section["modules"]),
    "densenet_fig4_memory": lambda section: [f"{impl}_d{depth}" for impl in section["impls"]
                                             for depth in section["depths"]],
    "densenet_fig5_time": lambda section: [f"d{depth}" for depth in section["depths"]],
    "iabn_table2_capacity": lambda section: [
        f"{dataset}_{body}_{norm}_{mode}" for dataset, spec in section["datasets"].items()
        for body in spec["crops"] for norm in ("bn", "iabn") for mode in section["modes"]],
    "whole_step": lambda section: list(section["networks"]),
    "iabn_digits_on_par": lambda section: [f"seed{seed}" for seed in section["seeds"]],
}
#: experiment -> its points simulated on the meta device (rule ``<experiment>_simulated_point``)
SIMULATED_POINTS = {
    "densenet_fig4_memory": lambda section: [f"simulated_{impl}"
                                             for impl in section["simulated"]["impls"]],
    "iabn_table2_capacity": lambda section: [
        f"simulated_{dataset}_{body}_{norm}_{mode}"
        for dataset, spec in section["simulated"]["datasets"].items() for body in spec["crops"]
        for norm in ("bn", "iabn") for mode in section["modes"]],
}


def simulated_jobs(experiment, section):
    """The planned job count of ``experiment``'s simulated points, by rule (none: empty)."""
    if experiment not in SIMULATED_POINTS:
        return {}
    return {f"{experiment}_simulated_point": len(SIMULATED_POINTS[experiment](section))}



def job_counts(output):
    """``{rule: count}`` from Snakemake's "Job stats" table."""
    table = output.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def profile(name):
    return yaml.safe_load((ROOT / "experiments" / "config" / f"{name}.yaml").read_text())


# --------------------------------------------------------------------------- planning
def test_the_workflow_profile_rate_limits_no_more_than_snakemakes_default():
    """``profiles/default`` lengthens the timespan of Snakemake's job rate limiter, so that its
    scheduler re-evaluates the ready jobs less often, at no lower a rate than Snakemake's
    default and with at most a few seconds' wait at the end of a run."""
    from snakemake.cli import get_argument_parser
    from snakemake.settings.types import MaxJobsPerTimespan

    setting = yaml.safe_load((ROOT / "profiles" / "default" / "config.yaml").read_text())
    ours = MaxJobsPerTimespan.parse_choice(setting["max-jobs-per-timespan"])
    default = MaxJobsPerTimespan.parse_choice(
        get_argument_parser().get_default("max_jobs_per_timespan"))
    assert ours.max_jobs / ours.timespan >= default.max_jobs / default.timespan
    assert default.timespan < ours.timespan <= 5


@pytest.mark.parametrize("name", PROFILES)
def test_dry_run_plans_every_experiment(workdir, name):
    result = snakemake(workdir, "-n", "--config", f"profile={name}")
    assert result.returncode == 0, result.stderr
    assert "profiles/default" in result.stdout + result.stderr  # the workflow profile is read
    counts = job_counts(result.stdout)
    config = profile(name)
    run = f"{name}-{config['device']}"
    for experiment, points_of in EXPERIMENT_POINTS.items():
        points = points_of(config[experiment])
        assert counts[f"{experiment}_point"] == len(points), experiment
        for rule, count in simulated_jobs(experiment, config[experiment]).items():
            assert counts[rule] == count, rule
            points = points + SIMULATED_POINTS[experiment](config[experiment])
        for point in points:
            assert f"artifacts/{experiment}/{run}/{point}.json" in result.stdout
        assert f"artifacts/{experiment}.{run}.csv" in result.stdout
        for suffix in ("png", "pdf", "md", "tex"):
            assert f"figures/{run}/{experiment}.{suffix}" in result.stdout
    # One CSV and one notebook per experiment: these and the training experiments; and the
    # kernel benchmark's notebook.
    planned_csvs = set(re.findall(rf"artifacts/(\w+)\.{run}\.csv", result.stdout))
    assert set(EXPERIMENT_POINTS) <= planned_csvs
    assert counts["aggregate"] == counts["render"] - 1 == len(planned_csvs)
    assert counts["claims"] == counts["bench_kernels"] == counts["all"] == 1
    assert f"artifacts/bench_kernels/{run}.json" in result.stdout
    for suffix in ("png", "pdf", "md", "tex"):
        assert f"figures/{run}/bench_kernels.{suffix}" in result.stdout


@pytest.mark.parametrize("experiment", EXPERIMENT_POINTS)
def test_experiment_target_plans_only_its_own_jobs(workdir, experiment):
    result = snakemake(workdir, "-n", experiment)
    assert result.returncode == 0, result.stderr
    points = EXPERIMENT_POINTS[experiment](profile("smoke")[experiment])
    assert job_counts(result.stdout) == {f"{experiment}_point": len(points),
                                         **simulated_jobs(experiment, profile("smoke")[experiment]),
                                         "aggregate": 1, "render": 1, experiment: 1}


#: InPlace-ABN Table 2 top, the paper's FIXED CROP cells: data set -> (classes, crop size per
#: body). Cityscapes 16 / 20 x 512^2 (19 classes); COCO-Stuff 16 x 480^2 (ResNeXt-101) and
#: 20 x 496^2 (WideResNet-38), 91 stuff classes (Sec. 4.2).
PAPER_TABLE2_CELLS = {"cityscapes": (19, {"resnext101": 512, "wideresnet38": 512}),
                      "cocostuff": (91, {"resnext101": 480, "wideresnet38": 496})}


def shell_options(command):
    """``{option: value}`` of a planned command's ``--name value`` pairs (flags: ``None``)."""
    words = command.split(" > ")[0].split()
    return {word: (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--")
                   else None)
            for i, word in enumerate(words) if word.startswith("--")}


def planned_commands(output, module):
    """The options (:func:`shell_options`) of each planned shell command running ``module``."""
    return [shell_options(line) for line in re.findall(r"^Shell command: (.*)$", output, re.M)
            if f" -m {module} " in line]


def test_paper_table2_points_take_the_capacity_chain_of_their_own_data_set(workdir):
    """Each Table 2 top point of the paper profile reads its crops and crop size from a
    capacity point of its own data set and body, searched at that data set's classes and the
    paper's FIXED CROP crop of its column; FIXED BATCH points keep the batch of the same data
    set's STD-BN point."""
    result = snakemake(workdir, "-n", "-p", "iabn_table2_segmentation", "--config",
                       "profile=paper")
    assert result.returncode == 0, result.stderr
    capacity = {Path(options["--out"]).stem: options for options in
                planned_commands(result.stdout, "experiments.iabn_table2_capacity")}
    top = [options for options in
           planned_commands(result.stdout, "experiments.iabn_table2_segmentation")
           if "--capacity" in options]
    assert sorted((o["--dataset"], o["--body"]) for o in top) == sorted(
        (dataset, body) for dataset, (_, crops) in PAPER_TABLE2_CELLS.items()
        for body in crops for _config in range(4))
    for point in top:
        dataset, body = point["--dataset"], point["--body"]
        classes, crops = PAPER_TABLE2_CELLS[dataset]
        chain = capacity[Path(point["--capacity"]).stem]
        assert (chain["--dataset"], chain["--body"]) == (dataset, body), point["--capacity"]
        assert (chain["--classes"], chain["--crop"]) == (str(classes), str(crops[body]))
        if chain["--mode"] == "fixed_batch":
            std_bn = capacity[Path(chain["--batch-from"]).stem]
            assert (std_bn["--dataset"], std_bn["--body"], std_bn["--norm"],
                    std_bn["--mode"]) == (dataset, body, "bn", "fixed_crop")
            assert std_bn["--crop"] == str(crops[body])


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
    # Every job's benchmark file, as Snakemake wrote it, read by the run record per rule.
    times = run_record.rule_times(workdir / "artifacts" / "benchmarks", "smoke-cpu")
    assert {rule: t["jobs"] for rule, t in times.items()} == {
        "densenet_fig2_contiguous_point": 2, "aggregate": 1}
    assert all(t["wall_s"] > 0 for t in times.values())

    # As a run interrupted while measuring c8 leaves it (atomic writes: no c8.json, no CSV),
    # the next run measures c8 alone and aggregates.
    (workdir / "artifacts/densenet_fig2_contiguous/smoke-cpu/c8.json").unlink()
    (workdir / target).unlink()
    second = snakemake(workdir, target, "--cores", "2", "--configfile", str(configfile))
    assert second.returncode == 0, second.stderr
    assert job_counts(second.stdout + second.stderr) == {"densenet_fig2_contiguous_point": 1,
                                                          "aggregate": 1}


# --------------------------------------------------------------------------- rerunning
#: Two experiments, one that imports layers/ and one that does not.
RERUN_TARGETS = ("densenet_fig2_contiguous", "densenet_fig4_memory")


def test_module_sources_follow_imports_subprocesses_and_import_module():
    fig4 = sources.module_sources("experiments.densenet_fig4_memory", root=ROOT, relative_to=ROOT)
    for path in ("experiments/__init__.py", "experiments/densenet_fig4_memory.py",
                 "experiments/records/__init__.py", "experiments/records/point.py",
                 "experiments/measure/step.py", "layers/__init__.py", "layers/densenet.py",
                 "experiments/measure/__main__.py",  # python -m experiments.measure
                 "layers/kernels/cpu.py", "layers/kernels/cuda.py"):  # import_module(".cpu")
        assert path in fig4, path
    assert fig4 == sorted(fig4) and not any("iabn_table1" in p for p in fig4)
    fig2 = sources.module_sources("experiments.densenet_fig2_contiguous", root=ROOT,
                                  relative_to=ROOT)
    assert "experiments/densenet_fig2_contiguous.py" in fig2
    assert not any(p.startswith("layers/") for p in fig2)  # it runs torch's convolution only
    notebook = sources.notebook_sources(ROOT / "figures" / "densenet_fig4_memory.ipynb",
                                        root=ROOT, relative_to=ROOT)
    assert {"experiments/report/figure_io.py", "experiments/report/analysis.py"} <= set(notebook)
    with pytest.raises(ValueError, match="experiments.no_such_experiment"):
        sources.module_sources("experiments.no_such_experiment", root=ROOT)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the code (Snakefile, experiments/, layers/, the notebooks, artifacts/paper)
    whose targets ``RERUN_TARGETS`` are built, as fake empty files that Snakemake marked up to
    date (``--touch``, which also records their inputs' checksums). Tests leave it so."""
    root = copy_checkout(tmp_path_factory.mktemp("checkout"))
    touch_outputs(root, *RERUN_TARGETS)
    return root


def touch(checkout, *args):
    """Mark the outputs of ``RERUN_TARGETS`` up to date without running anything."""
    result = snakemake_in(checkout, "--cores", "1", "--touch", *args, *RERUN_TARGETS)
    assert result.returncode == 0, result.stderr


def planned(checkout, *args):
    """``{rule: count}`` of a dry run, ``{}`` when there is nothing to do."""
    result = snakemake_in(checkout, "-n", *args)
    assert result.returncode == 0, result.stderr
    if "Nothing to be done" in result.stdout + result.stderr:
        return {}
    return job_counts(result.stdout)


def edit(path, text="\n# edited\n"):
    """Append ``text`` to ``path``; return a function that restores its content."""
    original = path.read_text()
    path.write_text(original + text)
    return lambda: path.write_text(original)


def point_count(experiment):
    return len(EXPERIMENT_POINTS[experiment](profile("smoke")[experiment]))


def test_a_deleted_point_is_measured_again_and_only_it(checkout):
    point = EXPERIMENT_POINTS["densenet_fig4_memory"](profile("smoke")["densenet_fig4_memory"])[1]
    path = checkout / f"artifacts/densenet_fig4_memory/smoke-cpu/{point}.json"
    path.unlink()
    # `snakemake` (rule all; the other experiments are not built in this checkout) ...
    counts = planned(checkout)
    assert counts["densenet_fig4_memory_point"] == 1
    assert "densenet_fig2_contiguous_point" not in counts
    # ... and `snakemake densenet_fig4_memory`.
    assert planned(checkout, "densenet_fig4_memory") == {
        "densenet_fig4_memory_point": 1, "aggregate": 1, "render": 1, "densenet_fig4_memory": 1}
    path.touch()
    touch(checkout)


def test_editing_code_reruns_exactly_the_points_that_run_it(checkout):
    fig4, fig2 = point_count("densenet_fig4_memory"), point_count("densenet_fig2_contiguous")

    def points_planned():
        counts = planned(checkout, *RERUN_TARGETS)
        return (counts.get("densenet_fig4_memory_point", 0),
                counts.get("densenet_fig2_contiguous_point", 0))

    # Touched but unchanged (a checkout, an editor's save): its checksum is the recorded one.
    (checkout / "experiments/densenet_fig4_memory.py").touch()
    assert planned(checkout, *RERUN_TARGETS) == {}

    for module, expected in (("experiments/densenet_fig4_memory.py", (fig4, 0)),  # experiment
                             ("layers/densenet.py", (fig4, 0)),  # library, Fig. 4's only
                             ("experiments/records/point.py", (fig4, fig2))):  # shared
        restore = edit(checkout / module)
        assert points_planned() == expected, module
        restore()  # back to the content the points were measured with

    restore = edit(checkout / "experiments/report/figure_io.py")  # the notebooks' helpers
    assert planned(checkout, *RERUN_TARGETS) == {"render": 2, **{t: 1 for t in RERUN_TARGETS}}
    restore()
    assert planned(checkout, *RERUN_TARGETS) == {}


def documented_commands(pattern):
    """The words of every command line of the README and docs/ that matches ``pattern``."""
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [shlex.split(line.split("#")[0])
            for document in documents
            for line in re.findall(pattern, document.read_text(), re.M)]


def test_the_documented_commands_measure_one_experiment_anew(checkout):
    """Every `snakemake <id> --forcerun <id>_point` in the README and docs/ remeasures every
    point of <id> (built here for Fig. 4), re-aggregates and re-renders it, and runs nothing
    else."""
    commands = documented_commands(r"^snakemake .*--forcerun.*$")
    assert "densenet_fig4_memory" in {args[3] for args in commands}
    for args in commands:
        assert args[:3] == ["snakemake", "--cores", "2"] and args[4] == "--forcerun", args
        experiment = args[3]
        assert planned(checkout, *args[1:]) == {f"{experiment}_point": point_count(experiment),
                                                "aggregate": 1, "render": 1, experiment: 1}, args


def test_the_documented_one_point_commands_plan_that_point_alone(workdir):
    """Every `snakemake --cores 2 artifacts/<id>/<run>/<point>.json` in the README and docs/
    names a point of the default profile, and measures it and nothing else."""
    commands = documented_commands(r"^snakemake [^#\n]*artifacts/\S+\.json.*$")
    assert commands
    for args in commands:
        assert args[:3] == ["snakemake", "--cores", "2"] and len(args) == 4, args
        experiment, run, point = Path(args[3]).with_suffix("").parts[1:]
        assert run == "smoke-cpu", args
        assert point in EXPERIMENT_POINTS[experiment](profile("smoke")[experiment]), args
        result = snakemake(workdir, "-n", *args[1:])
        assert result.returncode == 0, result.stderr
        assert job_counts(result.stdout) == {f"{experiment}_point": 1}, args
