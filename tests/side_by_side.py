"""Experiment commands of a test fixture, run side by side in forked children of one process
that has imported them.

A command ``[module, *argv]`` is what ``python -m module argv`` runs: the module's
``main(argv)``. A fresh ``python -m`` per command would import torch and the experiment each
time (about 7 s of CPU here, more than a tiny point's measurement); instead one runner process
(this file as a script) imports each module once and forks a child per command, as many at a
time as there are cores, each on one thread. The runner only imports before it forks (no
parallel work, no CUDA), so every child starts from the state a fresh process would have after
its imports.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The longest the runner may take for all of a fixture's commands.
TIMEOUT_S = 1200


def run_modules(commands):
    """Runs each command (``[module, *argv]``) in the repository root as :mod:`side_by_side`'s
    runner does; returns one ``subprocess.CompletedProcess`` per command, in order, with its
    exit status and standard error (standard output is discarded)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    runner = subprocess.run([sys.executable, __file__], input=json.dumps(commands), cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if runner.returncode != 0:
        raise RuntimeError(f"the runner failed ({runner.returncode}):\n{runner.stderr[-5000:]}")
    return [subprocess.CompletedProcess(command, status, None, stderr)
            for command, (status, stderr) in zip(
                commands, json.loads(runner.stdout.splitlines()[-1]))]  # the last line


def _child(module, argv, stderr_path):
    """In a forked child: the command as ``python -m module argv`` would run it
    (:func:`experiments.records.forkserver.run_command`), standard error to ``stderr_path``;
    never returns."""
    status = 1
    try:
        with open(os.devnull, "w") as null, open(stderr_path, "w") as err:
            os.dup2(null.fileno(), 1)
            os.dup2(err.fileno(), 2)
        status = run_command(module, argv)
    finally:
        os._exit(status)


def _run(commands):
    """Import the commands' modules, fork a child per command (at most one per core at a
    time); ``[(exit status, standard error), ...]`` in order."""
    import importlib

    for module in dict.fromkeys(command[0] for command in commands):
        importlib.import_module(module)
    statuses = [None] * len(commands)
    running = {}
    with tempfile.TemporaryDirectory() as logs:
        def reap():
            pid, wait_status = os.wait()
            statuses[running.pop(pid)] = os.waitstatus_to_exitcode(wait_status)

        for index, (module, *argv) in enumerate(commands):
            while len(running) >= (os.cpu_count() or 1):
                reap()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(module, argv, os.path.join(logs, f"{index}.err"))
            running[pid] = index
        while running:
            reap()
        return [(status, Path(logs, f"{index}.err").read_text())
                for index, status in enumerate(statuses)]


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # the checkout's modules, as ``python -m`` in ROOT finds them
    from experiments.records.forkserver import run_command

    print(json.dumps(_run(json.load(sys.stdin))))
