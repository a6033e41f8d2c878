"""The kernels' on-disk cache follows the files they compile (``layers.kernels.caching``).

numba keys its cache on the file that defines a function; the kernels also compile the
activation maths of ``common.py``. A small kernel that inlines a function of another file shows
the mechanism end to end, in fresh processes sharing one cache directory: with a plain
``numba.njit(cache=True)`` an edit of that other file is not seen (stale machine code), with
``caching.jit`` it recompiles. A second test checks that every compiled function of ``cpu.py``
and ``cuda.py`` comes from the module itself or from a file its cache is keyed on.
"""
import inspect
import os
import subprocess
import sys
import textwrap

import numba
import pytest

from layers.kernels import caching, common, cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KERNEL = textwrap.dedent('''
    import sys

    import numba

    sys.path.insert(0, sys.argv[1])
    import helper
    from layers.kernels import caching

    _scale = numba.njit(inline="always")(helper.scale)


    @caching.jit(numba.njit, (helper.__file__,))
    def tracked(x):
        return _scale(x) + 1.0


    @numba.njit(cache=True)
    def plain(x):
        return _scale(x) + 1.0


    print(tracked(1.0), plain(1.0), len(tracked.stats.cache_hits))
''')


def run_script(script, cache_dir, *args):
    """The output of the Python file ``script`` run with ``args`` in a fresh process, with
    numba's disk cache in ``cache_dir``."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, str(script), *map(str, args)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def run_kernel(directory, cache_dir):
    tracked, plain, hits = run_script(directory / "kernel.py", cache_dir, directory).split()
    return float(tracked), float(plain), int(hits)


def test_editing_a_dependency_recompiles_with_no_manual_step(tmp_path):
    (tmp_path / "kernel.py").write_text(KERNEL)
    helper = tmp_path / "helper.py"
    helper.write_text("def scale(x):\n    return x * 2.0\n")
    cache_dir = tmp_path / "cache"
    assert run_kernel(tmp_path, cache_dir) == (3.0, 3.0, 0)  # compiled and cached
    assert run_kernel(tmp_path, cache_dir) == (3.0, 3.0, 1)  # loaded from the cache
    helper.write_text("def scale(x):\n    return x * 3.0\n")  # same size, maybe same mtime
    tracked, plain, hits = run_kernel(tmp_path, cache_dir)
    assert plain == 3.0  # numba alone: the stale machine code of the old helper
    assert (tracked, hits) == (4.0, 0)  # keyed on the helper: recompiled
    assert run_kernel(tmp_path, cache_dir)[::2] == (4.0, 1)  # and cached again


VARIANTS = textwrap.dedent('''
    import sys

    import numba
    import numpy as np

    from layers.kernels import caching, cpu


    @cpu._Variants(caching.jit(numba.njit, ()), (0, 1))
    def full(kind):
        def kernel(x):
            if kind == 0:
                return np.full(2, x)  # float64
            return (np.full(3, x) * 2).astype(np.int32)  # other constants in its environment
        return kernel


    for kind in map(int, sys.argv[1:]):  # compiled or loaded on first use, in this order
        print(full[kind](1.5).tolist())
''')


def test_variants_compiled_by_different_processes_load_side_by_side(tmp_path):
    """Two processes compile one variant each as their first function; a third loads both from
    the disk cache. With one name for all variants (numba's counter is per process) the third
    ran one variant with the other's environment: wrong values, or a crash."""
    script = tmp_path / "variants.py"
    script.write_text(VARIANTS)

    def run(*kinds):
        return run_script(script, tmp_path / "cache", *kinds).split("\n")[:len(kinds)]

    assert run("0") == ["[1.5, 1.5]"]
    assert run("1") == ["[3, 3, 3]"]
    assert run("1", "0") == ["[3, 3, 3]", "[1.5, 1.5]"]
    assert run("0", "1") == ["[1.5, 1.5]", "[3, 3, 3]"]


def numba_functions(module):
    """``(name, dispatcher)`` of the numba functions a kernel module compiles."""
    kinds = (numba.core.dispatcher.Dispatcher,)
    try:
        from numba.cuda.dispatcher import CUDADispatcher
        kinds += (CUDADispatcher,)
    except ImportError:  # the CUDA simulator
        pass
    variants = getattr(module, "_Variants", ())  # kernels compiled per activation (and mode)
    found = []
    for name, value in vars(module).items():
        if isinstance(value, kinds):
            found.append((name, value))
        elif isinstance(value, variants):
            found.extend((name, value[key]) for key in value.keys)
    for name, value in getattr(module, "_LAUNCHERS", {}).items():
        found.append((name.__name__, value))
    return found


def check_kernel_module(module, cached_names):
    own = os.path.abspath(module.__file__)
    allowed = {own} | {os.path.abspath(path) for path in module.DEPENDENCIES}
    assert os.path.abspath(common.__file__) in allowed
    functions = numba_functions(module)
    assert functions
    for name, dispatcher in functions:
        source = os.path.abspath(inspect.getfile(dispatcher.py_func))
        assert source in allowed, f"{name} compiles {source}: add it to DEPENDENCIES"
    for name, dispatcher in functions:
        if name in cached_names:
            assert caching.dependencies_of(dispatcher) == tuple(
                os.path.abspath(path) for path in module.DEPENDENCIES), name
    return functions


def test_cpu_kernels_are_keyed_on_common_py():
    functions = check_kernel_module(cpu, cached_names={n for n, _ in numba_functions(cpu)})
    assert {"_moments_ncs", "_backward_input_mc", "_act_forward"} <= {n for n, _ in functions}


def test_cuda_kernels_are_keyed_on_common_py():
    from layers.kernels import cuda

    if cuda.SIMULATOR:
        pytest.skip("the CUDA simulator has no disk cache")
    launchers = {fn.__name__ for fn, _ in cuda.KERNELS}
    check_kernel_module(cuda, cached_names=launchers)


def test_dependency_digest_follows_the_contents(tmp_path):
    path = tmp_path / "dep.py"
    path.write_text("a = 1\n")
    first = caching.dependency_digest([path])
    path.write_text("a = 2\n")
    assert caching.dependency_digest([path]) != first
    path.write_text("a = 1\n")
    assert caching.dependency_digest([path]) == first
