"""The fork server (:mod:`experiments.records.forkserver`): a job run through it exits, prints and
sees what ``python -m`` would give it; without a server, or with one that cannot serve it, the
client runs ``python -m`` itself; a cancelled job's processes end; the server ends with the
process that started it. The reference is always the same command under plain ``python -m``.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from experiments.records import forkserver
from experiments.train import plan

ROOT = Path(__file__).resolve().parents[1]
TOY = '''\
"""A job for the fork server's tests."""
import os
import sys
import time


def main(argv):
    what = argv[0]
    if what == "report":
        print("cwd", os.getcwd(), "value", os.environ.get("TOY_VALUE"), "argv", sys.argv[1:])
        print("to stderr", file=sys.stderr)
    elif what == "exit":
        sys.exit(int(argv[1]))
    elif what == "message":
        sys.exit("a message for the user")
    elif what == "raise":
        raise RuntimeError("an uncaught error")
    elif what == "parent":
        print(os.getppid())
    elif what == "seed":
        import torch
        print(torch.initial_seed())
    elif what == "sleep":
        Path = __import__("pathlib").Path
        Path(argv[1]).write_text(str(os.getpid()))
        time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1:])
'''


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != forkserver.SOCKET_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return {**env, **extra}


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """A directory holding the toy job module, and a server for it (preloading it)."""
    root = tmp_path_factory.mktemp("jobs")
    (root / "toyjob.py").write_text(TOY)
    socket_path = os.path.join(tempfile.mkdtemp(prefix="fs-"), "socket")
    server = subprocess.Popen(
        [sys.executable, "-m", "experiments.records.forkserver", "serve", "--socket",
         socket_path, "--preload", "toyjob", "experiments.train.launch"],
        cwd=root, env=_env(), stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: os.path.exists(socket_path))
    yield root, socket_path, server
    server.terminate()
    server.wait(timeout=30)
    assert not os.path.exists(socket_path), "the server removes its socket when it stops"


def _client(cwd, socket_path, *argv, **env):
    extra = {} if socket_path is None else {forkserver.SOCKET_ENV: socket_path}
    return subprocess.run(
        [sys.executable, "-m", "experiments.records.forkserver", "run", "toyjob", *argv],
        cwd=cwd, env=_env(**extra, **env), capture_output=True, text=True, timeout=120)


def _python_m(cwd, *argv, **env):
    return subprocess.run([sys.executable, "-m", "toyjob", *argv], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv", [("report", "x", "--flag"), ("exit", "0"), ("exit", "3"),
                                  ("message",), ("raise",)])
def test_a_job_through_the_server_exits_and_prints_as_under_python_m(jobs, argv):
    root, socket_path, server = jobs
    served = _client(root, socket_path, *argv, TOY_VALUE="42")
    fresh = _python_m(root, *argv, TOY_VALUE="42")
    assert served.returncode == fresh.returncode
    assert served.stdout == fresh.stdout
    if argv[0] == "raise":  # the tracebacks' frames differ; the error and status do not
        assert served.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
        assert served.stderr.startswith("Traceback (most recent call last):")
    else:
        assert served.stderr == fresh.stderr
    if argv[0] == "report":
        assert f"cwd {root} value 42 argv ['report', 'x', '--flag']" in served.stdout


def test_a_job_through_the_server_is_its_fork_with_fresh_seeds(jobs):
    root, socket_path, server = jobs
    assert _client(root, socket_path, "parent").stdout.split() == [str(server.pid)]
    seeds = {_client(root, socket_path, "seed").stdout for _ in range(2)}
    assert len(seeds) == 2, "each job draws its own torch seed, as a new process does"


def test_without_a_server_the_client_runs_python_m_itself(jobs):
    root, _, server = jobs
    result = _client(root, None, "parent")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.split() != [str(server.pid)]
    assert _client(root, None, "exit", "5").returncode == 5


def test_an_unreachable_server_or_another_directory_falls_back_with_a_warning(jobs, tmp_path):
    root, socket_path, server = jobs
    missing = _client(root, str(tmp_path / "no_socket"), "exit", "4")
    assert missing.returncode == 4
    assert "is not reachable" in missing.stderr and "fresh process" in missing.stderr
    (tmp_path / "toyjob.py").write_text(TOY)
    elsewhere = _client(tmp_path, socket_path, "parent")
    assert f"runs jobs in {root}" in elsewhere.stderr and "fresh process" in elsewhere.stderr
    assert elsewhere.stdout.split() != [str(server.pid)]


def test_a_job_whose_import_time_variables_differ_runs_in_a_fresh_process(jobs):
    root, socket_path, server = jobs
    result = _client(root, socket_path, "parent", NUMBA_DISABLE_JIT="1")
    assert "NUMBA_DISABLE_JIT" in result.stderr and "fresh process" in result.stderr
    assert result.returncode == 0 and result.stdout.split() != [str(server.pid)]
    threads = _client(root, socket_path, "parent", OMP_NUM_THREADS="1")  # as Snakemake sets
    assert threads.stdout.split() == [str(server.pid)] and threads.stderr == ""


def test_a_client_that_leaves_before_its_refusal_does_not_stop_the_server(jobs, tmp_path):
    root, socket_path, server = jobs
    for _ in range(20):  # a refusal to a closed connection: at the latest a broken pipe
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as leaving:
            leaving.connect(socket_path)
            forkserver._send(leaving, {"module": "toyjob", "argv": ["parent"],
                                       "cwd": str(tmp_path), "env": {}}, (0, 1, 2))
    assert _client(root, socket_path, "parent").stdout.split() == [str(server.pid)]


def test_a_cancelled_job_ends(jobs, tmp_path):
    root, socket_path, _ = jobs
    pid_file = tmp_path / "pid"
    client = subprocess.Popen(
        [sys.executable, "-m", "experiments.records.forkserver", "run", "toyjob", "sleep",
         str(pid_file)], cwd=root, env=_env(**{forkserver.SOCKET_ENV: socket_path}))
    _wait_for(lambda: pid_file.exists() and pid_file.read_text())
    job = int(pid_file.read_text())
    assert _alive(job)
    client.send_signal(signal.SIGKILL)  # Snakemake cancelling the job
    client.wait()
    _wait_for(lambda: not _alive(job), timeout=30)


def test_a_job_whose_server_dies_fails_and_is_not_run_again(tmp_path):
    (tmp_path / "toyjob.py").write_text(TOY)
    socket_path = os.path.join(tempfile.mkdtemp(prefix="fs-"), "socket")
    server = subprocess.Popen([sys.executable, "-m", "experiments.records.forkserver", "serve",
                               "--socket", socket_path], cwd=tmp_path, env=_env(),
                              stderr=subprocess.DEVNULL)
    _wait_for(lambda: os.path.exists(socket_path))
    pid_file, log = tmp_path / "pid", tmp_path / "client.log"
    with open(log, "w") as stderr:  # a file, as a job's log: the job keeps it open
        client = subprocess.Popen(
            [sys.executable, "-m", "experiments.records.forkserver", "run", "toyjob", "sleep",
             str(pid_file)], cwd=tmp_path, env=_env(**{forkserver.SOCKET_ENV: socket_path}),
            stderr=stderr)
    _wait_for(lambda: pid_file.exists() and pid_file.read_text())
    job = int(pid_file.read_text())
    pid_file.unlink()
    server.kill()
    server.wait()
    try:
        assert client.wait(timeout=60) == 1
        assert "ended before the job did" in log.read_text()
        assert not pid_file.exists(), "the job was not started a second time"
    finally:
        os.kill(job, signal.SIGKILL)


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    socket_path = os.path.join(tempfile.mkdtemp(prefix="fs-"), "socket")
    script = (  # start a server, wait for its socket (it has noted its parent), leave
        "import os, subprocess, sys, time\n"
        "server = subprocess.Popen([sys.executable, '-m', 'experiments.records.forkserver',"
        f" 'serve', '--socket', {socket_path!r}], stdout=subprocess.DEVNULL,"
        " stderr=subprocess.DEVNULL)\n"
        f"while not os.path.exists({socket_path!r}):\n"
        "    time.sleep(0.05)\n"
        "print(server.pid)\n")
    starter = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=120, check=True)
    server = int(starter.stdout)
    _wait_for(lambda: not _alive(server), timeout=60)
    assert not os.path.exists(socket_path)


def test_start_names_the_socket_for_the_jobs_and_stops_the_server_at_exit(tmp_path):
    (tmp_path / "toyjob.py").write_text(TOY)
    script = (
        "import os, subprocess, sys\n"
        "from experiments.records import forkserver\n"
        "server = forkserver.start(['toyjob'], 'logs/server.log')\n"
        "job = subprocess.run([sys.executable, '-m', 'experiments.records.forkserver', 'run',"
        " 'toyjob', 'parent'], capture_output=True, text=True)\n"
        "print(server.pid, os.environ[forkserver.SOCKET_ENV], job.stdout.strip())\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    server, socket_path, parent = result.stdout.split()
    assert parent == server, "the job ran as the server's fork"
    _wait_for(lambda: not _alive(int(server)), timeout=30)
    assert not os.path.exists(os.path.dirname(socket_path))
    assert "serving" in (tmp_path / "logs" / "server.log").read_text()


def test_the_client_names_its_usage():
    result = subprocess.run([sys.executable, "-m", "experiments.records.forkserver", "run"],
                            env=_env(), capture_output=True, text=True)
    assert result.returncode == 1 and "usage:" in result.stderr


def test_the_training_commands_start_with_the_client_where_the_profile_asks_for_it():
    python_m = forkserver.command_prefix(True)
    assert forkserver.command_prefix(False) == ("python", "-m") == plan.PYTHON_M
    assert plan.launcher(1, "cpu", python_m) == list(python_m)
    assert plan.launcher(2, "cpu", python_m)[:5] == [*python_m, "experiments.train.launch"]
    assert plan.launcher(2, "cuda", python_m)[0] == "torchrun", "CUDA's ranks stay fresh"
