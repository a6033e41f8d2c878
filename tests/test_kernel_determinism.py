"""The CPU kernels give the same bits whatever the state of numba's disk cache, and run safely
from several Python threads under numba's ``workqueue`` threading layer.

Fresh compile against cached: a process that compiles a kernel runs the code of each function
it calls as that function's own library was compiled, while the cache stores the kernel's copy,
optimised again with the kernel (:mod:`layers.kernels.cpu`, "Reproducibility"). With
floating-point contraction allowed, the two copies fused different multiplies and adds, and a
resumed or re-run training diverged from the first run. The layers run in subprocesses sharing
one new cache directory: the first compiles every kernel, the second loads them all.
"""
import os
import subprocess
import sys
import textwrap

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEPS = textwrap.dedent('''
    import sys

    import numba
    import torch

    from layers.abn import InPlaceABN
    from layers.kernels import cpu

    torch.set_num_threads(2)
    results = {}
    # The identity (the BN before a residual sum), whose whole backward step gave another input
    # gradient from the cache, and the default leaky ReLU.
    for name, layer in (("identity", InPlaceABN(8, activation="identity")),
                        ("leaky_relu", InPlaceABN(8))):
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            layer.weight.uniform_(0.5, 1.5, generator=generator)
            layer.bias.uniform_(-0.5, 0.5, generator=generator)
        x = (torch.randn(4, 8, 16, 16, generator=generator) * 2 + 1).requires_grad_(True)
        out = layer(x * 1)
        out.backward(torch.randn(out.shape, generator=generator))
        results.update({f"{name}.out": out.detach(), f"{name}.dx": x.grad,
                        f"{name}.dweight": layer.weight.grad, f"{name}.dbias": layer.bias.grad,
                        f"{name}.running_var": layer.running_var})
    torch.save(results, sys.argv[1])
    # Cache hits and misses of every kernel this process compiled or loaded
    dispatchers = [value for value in vars(cpu).values()
                   if isinstance(value, numba.core.dispatcher.Dispatcher)]
    dispatchers += [kernel for value in vars(cpu).values() if isinstance(value, cpu._Variants)
                    for kernel in value._kernels.values()]
    print(sum(len(d.stats.cache_hits) for d in dispatchers),
          sum(len(d.stats.cache_misses) for d in dispatchers))
''')


def run(script, *args, env=()):
    """``(returncode, stdout, stderr)`` of the Python code ``script`` run with ``args`` in a
    fresh process, with ``env`` added to the environment."""
    completed = subprocess.run([sys.executable, "-c", script, *map(str, args)],
                               env={**os.environ, "PYTHONPATH": ROOT, **dict(env)},
                               capture_output=True, text=True, timeout=300)
    return completed.returncode, completed.stdout, completed.stderr


def test_cached_kernels_give_the_bits_of_a_fresh_compile(tmp_path):
    cache = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    outputs = {}
    for state in ("compiled", "cached"):
        path = tmp_path / f"{state}.pt"
        returncode, stdout, stderr = run(STEPS, path, env=cache)
        assert returncode == 0, stderr[-3000:]
        outputs[state] = torch.load(path)
        hits, misses = map(int, stdout.split())
        if state == "compiled":
            assert hits == 0 and misses > 0, (hits, misses)
        else:
            assert hits > 0 and misses == 0, (hits, misses)  # every kernel from the cache
    differing = [name for name, value in outputs["compiled"].items()
                 if not torch.equal(value, outputs["cached"][name])]
    assert not differing, f"{len(differing)} of {len(outputs['compiled'])} differ: {differing}"


CONCURRENT = textwrap.dedent('''
    import threading

    import numba
    import torch

    from layers.abn import InPlaceABN

    torch.set_num_threads(2)
    layer = InPlaceABN(16)
    x = torch.randn(4, 16, 32, 32, generator=torch.Generator().manual_seed(0))


    def step():
        leaf = x.clone().requires_grad_(True)
        layer(leaf * 1).sum().backward()
        return leaf.grad


    expected = step()  # compiles (or loads) the kernels
    failures = []


    def work():
        for _ in range(100):
            if not torch.equal(step(), expected):
                failures.append(1)


    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(numba.threading_layer(), len(failures))
''')


def test_workqueue_threading_layer_runs_kernels_from_several_threads():
    """numba's ``workqueue`` layer aborts the process when two threads launch parallel loops at
    once; the kernels then run one at a time, each still on all of numba's threads."""
    returncode, stdout, stderr = run(CONCURRENT, env={"NUMBA_THREADING_LAYER": "workqueue"})
    assert returncode == 0, stderr[-3000:]
    assert stdout.split() == ["workqueue", "0"]
