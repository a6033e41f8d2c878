"""Clear errors from the pipeline: a point artifact that does not read names itself and how to
measure it again and leaves the previous CSV in place; a profile name that is not a profile
lists the real ones; a nested ``--config`` value works as docs/pipeline.md says (``--config
'datasets={...}'``).

Snakemake runs on the repository's Snakefile in a temporary working directory, as in
test_pipeline.py.
"""
import os
from pathlib import Path

import yaml
from snakemake_run import snakemake

ROOT = Path(__file__).resolve().parents[1]


def test_a_truncated_point_is_named_and_the_previous_csv_kept(workdir):
    points = workdir / "artifacts" / "densenet_fig2_contiguous" / "smoke-cpu"
    points.mkdir(parents=True)
    (points / "c4.json").write_text(
        '{"experiment": "densenet_fig2_contiguous", "config": {}, "results": [{"a": 1}], '
        '"environment": {}}')
    (points / "c8.json").write_text('{"experiment": "densenet_fig2_cont')  # cut off
    csv = workdir / "artifacts" / "densenet_fig2_contiguous.smoke-cpu.csv"
    csv.write_bytes(b"experiment,point\nprevious,run\n")
    os.utime(csv, (946684800, 946684800))  # older than the points: aggregation is due
    configfile = workdir / "tiny.yaml"
    configfile.write_text(yaml.safe_dump({"profile": "smoke", "forkserver": False,
                                          "densenet_fig2_contiguous": {
                                              "in_channels": [4, 8], "out_channels": 2,
                                              "batch": 2, "size": 4, "warmup": 0,
                                              "repeats": 1}}))
    done = snakemake(workdir, "artifacts/densenet_fig2_contiguous.smoke-cpu.csv", "--cores",
                     "1", "--configfile", str(configfile))
    assert done.returncode != 0
    assert csv.read_bytes() == b"experiment,point\nprevious,run\n"
    log = (workdir / "artifacts/logs/densenet_fig2_contiguous/smoke-cpu/aggregate.log")
    lines = log.read_text().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert "artifacts/densenet_fig2_contiguous/smoke-cpu/c8.json" in lines[0]
    assert "snakemake --cores all artifacts/densenet_fig2_contiguous/smoke-cpu/c8.json" in \
        lines[0]


def test_the_schema_is_not_a_profile(workdir):
    done = snakemake(workdir, "-n", "--config", "profile=schema")
    assert done.returncode != 0
    assert "profile='schema' is not a profile; available profiles: ['paper', 'smoke']" in \
        done.stdout + done.stderr


def test_a_nested_config_value_merges_over_the_profile_as_yaml_reads_it(workdir):
    """docs/pipeline.md: ``--config key=value`` merges over the profile, and the paper's data roots are
    overridden with ``--config 'datasets={...}'``: a root of the user's with ``generate:
    null`` (YAML's null, not the string 'null')."""
    done = snakemake(workdir, "-n", "-p", "--config",
                     "datasets={imagenet: {root: /my/imagenet, generate: null}}")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "generate_imagenet" not in done.stdout
    assert "--data /my/imagenet" in done.stdout
    assert "generate_cifar10" in done.stdout  # the rest of the section is the profile's
