"""The run record (experiments/records/run_record.py): each rule's job times summed from
fabricated Snakemake benchmark files, clear errors for files that are none, the run's CPU time
read from a process tree, and the JSON, Markdown and HTML files it writes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.records import forkserver, paths, run_record

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time"


def benchmark(artifacts, rule, run, job, *rows):
    """Write the benchmark file of a job where the Snakefile has Snakemake write it
    (:func:`paths.job_benchmark` under ``artifacts``) as Snakemake does: the header, then one
    row per repeat of ``(s, max_rss, cpu_time)`` (``"NA"`` where Snakemake could not sample)."""
    path = Path(paths.job_benchmark(rule, run, job, root=artifacts))
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [HEADER] + [f"{s}\t0:00:00\t{rss}\t1\t1\t1\t0\t0\t0\t{cpu}" for s, rss, cpu in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_rule_times_sum_each_rules_jobs_of_the_run(tmp_path):
    benchmark(tmp_path, "render", "smoke-cpu", "fig4", (2.5, 300.0, 2.0))
    benchmark(tmp_path, "render", "smoke-cpu", "fig5", (4.0, 250.5, 3.5))
    # A job benchmarked with repeat(): one row per repeat, each counted.
    benchmark(tmp_path, "aggregate", "smoke-cpu", "fig4", (1.0, 90.0, 0.5), (1.5, 95.0, 0.75))
    # A job that ended before Snakemake sampled it: no CPU time, so the rule's sum is unknown.
    benchmark(tmp_path, "claims", "smoke-cpu", "claims", (0.25, "NA", "NA"))
    benchmark(tmp_path, "render", "paper-cuda", "fig4", (100.0, 1.0, 1.0))  # another run

    benchmarks = tmp_path / "benchmarks"
    times = run_record.rule_times(benchmarks, "smoke-cpu")

    assert list(times) == ["aggregate", "claims", "render"]
    assert times["render"] == {"jobs": 2, "wall_s": 6.5, "wall_s_max": 4.0, "cpu_s": 5.5,
                               "max_rss_mb": 300.0}
    assert times["aggregate"] == {"jobs": 1, "wall_s": 2.5, "wall_s_max": 1.5, "cpu_s": 1.25,
                                  "max_rss_mb": 95.0}
    assert times["claims"] == {"jobs": 1, "wall_s": 0.25, "wall_s_max": 0.25, "cpu_s": None,
                               "max_rss_mb": None}
    assert run_record.rule_times(benchmarks, "paper-cuda")["render"]["wall_s"] == 100.0
    assert run_record.rule_times(benchmarks, "none-cpu") == {}


@pytest.mark.parametrize("text, message", [
    ("s\tcpu_time\n1.0\t0.5\n", r"no column\(s\) \['max_rss'\]"),
    ("", r"no column\(s\) \['s', 'cpu_time', 'max_rss'\]"),
    (HEADER + "\n", "without a row"),
    (HEADER + "\nabc\t0:00:00\t1\t1\t1\t1\t0\t0\t0\t1\n", r":2: column 's' is 'abc', not a"),
    (HEADER + "\nNA\t0:00:00\t1\t1\t1\t1\t0\t0\t0\t1\n", r":2: column 's' is 'NA', not a number"),
    (HEADER + "\n1\t0:00:00\t1\t1\t1\t1\t0\t0\t0\t-2\n", r":2: column 'cpu_time' is '-2', not a"),
    (HEADER + "\n1\t0:00:00\tnan\t1\t1\t1\t0\t0\t0\t1\n", r":2: column 'max_rss' is 'nan', not a"),
])
def test_a_file_that_is_no_benchmark_is_refused_naming_it(tmp_path, text, message):
    path = tmp_path / "render" / "smoke-cpu" / "fig4.tsv"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        run_record.rule_times(tmp_path, "smoke-cpu")
    assert str(path) in str(error.value)


def test_a_missing_benchmarks_folder_is_refused(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        run_record.rule_times(tmp_path / "none", "smoke-cpu")
    with pytest.raises(SystemExit) as exit_:
        run_record.main(["--run", "smoke-cpu", "--profile", "smoke", "--device", "cpu",
                         "--benchmarks", str(tmp_path / "none")])
    assert exit_.value.code == 2
    assert "no such directory" in capsys.readouterr().err


def test_the_run_cpu_time_counts_the_processes_it_started():
    """A finished child's CPU time is added to its parent's: a child that spins for 0.4 s of
    CPU raises the parent's count by at least that much."""
    before = run_record.invocation_times(os.getpid())
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    after = run_record.invocation_times(os.getpid())
    assert after["cpu_s"] - before["cpu_s"] >= 0.4
    assert after["wall_s"] >= before["wall_s"] > 0
    assert run_record.invocation_times(None) is None
    finished = subprocess.Popen([sys.executable, "-c", ""])
    finished.wait()
    assert run_record.invocation_times(finished.pid) is None


@pytest.mark.parametrize("fork_server", [False, True])
def test_the_record_is_written_as_json_markdown_and_html(tmp_path, monkeypatch, fork_server):
    monkeypatch.delenv(forkserver.SOCKET_ENV, raising=False)
    if fork_server:  # as in a job the fork server ran
        monkeypatch.setenv(forkserver.SOCKET_ENV, str(tmp_path / "socket"))
    benchmark(tmp_path, "render", "smoke-cpu", "fig4", (2.5, 300.0, 2.0))
    out = tmp_path / "run_record" / "smoke-cpu.json"
    status = run_record.main(["--run", "smoke-cpu", "--profile", "smoke", "--device", "cpu",
                              "--benchmarks", str(tmp_path / "benchmarks"), "--snakemake-pid",
                              str(os.getpid()), "--out", str(out)])
    assert status == 0
    record = json.loads(out.read_text())
    assert record["rules"] == {"render": {"jobs": 1, "wall_s": 2.5, "wall_s_max": 2.5,
                                          "cpu_s": 2.0, "max_rss_mb": 300.0}}
    env = record["environment"]
    assert env["cpu_count"] == os.cpu_count() and env["host"]
    assert env["memory_gib"] > 0 and isinstance(env["gpus"], list)
    assert isinstance(env["git_dirty"], bool) and env["snakemake"]
    assert record["invocation"]["wall_s"] > 0
    markdown = out.with_suffix(".md").read_text()
    assert "| render | 1 | 2.5 | 2.5 | 2.0 | 300.0 |" in markdown
    assert record["fork_server"] is fork_server
    assert ("the CPU and memory columns are the clients'" in markdown) is fork_server
    page = out.with_suffix(".html").read_text()
    assert "<td>render</td>" in page and "<title>Run record smoke-cpu</title>" in page
