"""The pipeline on a cluster: every measuring job asks for its profile section's resources, and
one target is built through Snakemake's SLURM executor with the one-node profile
(experiments/config/slurm-local/), checked to have run as a SLURM job.

The SLURM run needs a cluster that answers `sinfo` on this machine and the executor plugin
(`pip install -e '.[cluster]'`); `experiments/config/slurm-local/cluster_up.sh` starts such a
cluster (root, Debian). Where either is missing (CI, laptops) it is skipped, with the reason.
Snakemake runs in a temporary working directory, so the repository's artifacts/ is not touched.
"""
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "experiments" / "config" / "slurm-local"
#: what the test builds (one smoke point, seconds of work) and the rule that builds it
TARGET = "artifacts/densenet_fig2_contiguous/smoke-cpu/c16.json"
RULE = "densenet_fig2_contiguous_point"
#: the whole snakemake run; the executor's first status check comes after 10 s
TIMEOUT_S = 300


# --------------------------------------------------------------------------- resources
@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(ROOT / "artifacts" / "paper", tmp_path / "artifacts" / "paper")
    return tmp_path


def snakemake(workdir, *args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir),
         "--nolock", *args], capture_output=True, text=True, timeout=timeout)


def planned_resources(output):
    """``[(rule, {resource: value})]`` of every job a dry run plans."""
    jobs = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    resources: (.*)$", output, re.M)
    return [(rule, dict(kv.split("=", 1) for kv in resources.split(", ")))
            for rule, resources in jobs]


@pytest.mark.parametrize("name", ["smoke", "paper"])
def test_measuring_jobs_ask_for_their_sections_cluster_resources(workdir, name):
    profile = yaml.safe_load((ROOT / "experiments" / "config" / f"{name}.yaml").read_text())
    # --cores above every profile's threads, so the dry run plans each job's own threads.
    result = snakemake(workdir, "-n", "--cores", "64", "--config", f"profile={name}")
    assert result.returncode == 0, result.stderr
    # A job of rule <section>_point (or bench_kernels) takes the resources of <section>.
    measuring = [(rule, res) for rule, res in planned_resources(result.stdout)
                 if "cluster" in profile.get(rule.removesuffix("_point"), {})]
    assert {rule for rule, _ in measuring} >= {
        "bench_kernels", "densenet_fig2_contiguous_point", "iabn_table1_timing_point",
        "densenet_fig4_memory_point", "densenet_fig5_time_point", "iabn_table2_capacity_point"}
    for rule, resources in measuring:
        section = profile[rule.removesuffix("_point")]
        assert resources["gpu"] == ("1" if profile["device"] == "cuda" else "0"), rule
        assert resources["cpus_per_task"] == str(section["threads"]), rule
        assert resources["mem_mb"] == str(section["cluster"]["mem_mb"]), rule
        assert resources["runtime"] == str(section["cluster"]["runtime_min"]), rule


@pytest.mark.parametrize("cluster, message", [
    ({"mem_mb": 2000, "runtime_min": 10, "gpus": 1}, "'gpus' was unexpected"),
    ({"mem_mb": 0}, "['densenet_fig2_contiguous']['cluster']['mem_mb']"),
    ({"runtime_min": "1h"}, "['densenet_fig2_contiguous']['cluster']['runtime_min']"),
])
def test_bad_cluster_block_stops_before_any_job(workdir, cluster, message):
    configfile = workdir / "bad.yaml"
    configfile.write_text(yaml.safe_dump(
        {"profile": "smoke", "densenet_fig2_contiguous": {"cluster": cluster}}))
    result = snakemake(workdir, "-n", "--configfile", str(configfile))
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


# --------------------------------------------------------------------------- SLURM
def slurm_missing():
    """Why SLURM cannot be used here, or None."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "snakemake-executor-plugin-slurm is not installed (pip install -e '.[cluster]')"
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return ("SLURM is not installed (no sinfo/sbatch); "
                "experiments/config/slurm-local/cluster_up.sh starts a one-node cluster")
    try:
        answer = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                                timeout=30)
    except subprocess.TimeoutExpired:
        return "SLURM does not answer: sinfo timed out after 30 s"
    states = answer.stdout.split()
    if answer.returncode != 0 or not {"idle", "mix", "alloc", "comp"} & set(states):
        return (f"SLURM is not running or has no usable node: sinfo exited "
                f"{answer.returncode} ({(answer.stderr or ' '.join(states)).strip()!r}); "
                "experiments/config/slurm-local/cluster_up.sh starts it")
    return None


@pytest.fixture
def slurm():
    reason = slurm_missing()
    if reason:
        pytest.skip(reason)


def squeue(jobid, fields):
    """``squeue``'s record of ``jobid`` (finished jobs stay listed for MinJobAge, 300 s)."""
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", jobid, "-o", fields],
                          capture_output=True, text=True, timeout=30).stdout.strip()


def test_target_runs_as_a_slurm_job(slurm, tmp_path):
    shutil.copytree(ROOT / "artifacts" / "paper", tmp_path / "artifacts" / "paper")
    slurm_logs = tmp_path / ".snakemake" / "slurm_logs"
    start = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path),
             "--profile", str(PROFILE), TARGET],
            capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # Leave no job of ours behind: each has a log named by its SLURM job id.
        jobids = [log.stem for log in slurm_logs.rglob("*.log")]
        if jobids:
            subprocess.run(["scancel", *jobids], timeout=30)
        pytest.fail(f"snakemake did not finish in {TIMEOUT_S} s; SLURM jobs {jobids} cancelled")
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]

    # It went through SLURM: sbatch ran the rule's job, whose log (kept by the profile) is named
    # by its SLURM job id, and SLURM records that job, with the rule in its comment, as done.
    logs = list(slurm_logs.glob(f"rule_{RULE}/**/*.log"))
    assert len(logs) == 1, f"expected one SLURM log of {RULE}, found {logs}\n{output[-4000:]}"
    jobid = logs[0].stem
    assert f"submitted with SLURM jobid {jobid}" in output
    state, comment = squeue(jobid, "%T %k").split(maxsplit=1)
    assert state == "COMPLETED"
    assert comment.startswith(f"rule_{RULE}")
    assert f"Finished jobid: 0 (Rule: {RULE})" in logs[0].read_text()

    # ... and wrote a complete point.
    point = json.loads((tmp_path / TARGET).read_text())
    assert {"experiment", "config", "results", "environment"} <= set(point)
    assert point["results"]
    print(f"SLURM job {jobid} built {TARGET} in {elapsed:.0f} s")
