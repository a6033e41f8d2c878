"""Experiment commands of a test fixture, run side by side as subprocesses."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_modules(commands):
    """Runs ``python -m <command>`` in the repository root for each command, as many at a time
    as there are cores, each on one thread (a dozen processes with a thread per core each
    mostly wait for one another); returns the completed processes, in order."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}

    def run(command):
        return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=600)

    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        return list(pool.map(run, commands))
