"""Kernel backends of the ABN layers, chosen by the tensor's device.

Two modules implement one API on the canonical views of :mod:`layers.kernels.common`:
:mod:`layers.kernels.cpu` (``numba.njit``, parallel) and :mod:`layers.kernels.cuda`
(``numba.cuda``, zero-copy on torch's current stream)::

    moments(x) -> (2, C) float64                      # per-channel [mean, M2]
    forward(x, out, a, b, act, slope)                 # out = act(x * a + b), out may be x
    moments_forward(x, out, gamma, beta, eps, act, slope) -> (2, C)  # both, batch statistics
    backward_reduce(z, dz, x, p, q, act, slope, mode) -> (2, C) float64  # [sum dy, sum dy*v]
    backward_input(z, dz, x, p, q, coef, act, slope, mode, out)  # out = dy*k0 + v*k1 + k2

Data arrays may hold float64, float32, float16 or bfloat16; per-channel vectors and scalars are
in the compute dtype (float32 for 16-bit data, see :mod:`layers.kernels.codecs`).

Both backends also run a layer's whole forward and whole backward as one call each::

    forward_step(x, out, weight, bias, running_mean, running_var, training, momentum, eps,
                 act, slope, abs_mode) -> (6, C) float64 per-channel state
    backward_step(z, dz, x, state, act, slope, mode, training, input_grad, param_dtype,
                  has_weight, has_bias, out=None) -> (dweight, dbias)
                  # input gradient into out (dz left as it was), or over dz where out is None

the kernels above and the per-channel arithmetic around them (:mod:`layers.kernels.per_channel`)
back to back: compiled loops over the channels on the CPU, kernels of one thread per channel on
CUDA. :mod:`layers.functional` uses them where the kernels run eagerly; elsewhere the same
formulas run as torch operators between calls of the kernels above. The CPU kernels take
their per-channel vectors as torch tensors or as numpy arrays (the rows those loops write).

The CUDA backend's ``forward``, ``moments_forward`` and ``forward_step`` also take ``skip``, a
``(1,)`` bool tensor on the device: while it holds ``True`` they write nothing
(``DEVICE_GUARD``), which lets :mod:`layers.functional` refuse an in-place forward on the device
without a host synchronisation; its ``backward_step`` takes ``poison``, a flag of the same kind
that makes every gradient NaN.

CUDA tensors always run the CUDA kernels. CPU tensors run the CPU kernels, unless the
environment variable ``LAYERS_KERNELS=cudasim`` is set when :mod:`layers` is imported: then they
run the CUDA kernels under numba's CUDA simulator, which tests the CUDA code end to end on a
machine without a GPU (slowly: use small tensors).
"""
import functools
import importlib
import os

import torch

#: Values of ``LAYERS_KERNELS``: ``cpu`` (default) or ``cudasim``.
CPU_CHOICES = ("cpu", "cudasim")

_cpu_choice = os.environ.get("LAYERS_KERNELS", "cpu")
if _cpu_choice not in CPU_CHOICES:
    raise ValueError(
        f"LAYERS_KERNELS={_cpu_choice!r} is not supported: use one of {', '.join(CPU_CHOICES)}"
    )
if _cpu_choice == "cudasim":
    # numba reads this when numba.cuda is first imported, so it is set before anything is.
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


#: Dtypes of the per-channel tensors (weight, bias, running statistics) the whole steps take.
STEP_VECTOR_DTYPES = (torch.float32, torch.float64)


def step_vector_dtype(vectors):
    """The dtype the whole steps read the per-channel ``vectors`` as (weight, bias, running
    statistics; ``None`` where absent): their one dtype, float32 or float64 (float64 where none
    is given), or ``None`` where they are of several dtypes or of another one, which the whole
    steps do not take (the backends' ``forward_step`` and ``backward_step``, above)."""
    dtype = None
    for vector in vectors:  # a loop, not all() over a generator: called twice per step
        if vector is not None:
            if dtype is None:
                dtype = vector.dtype
            elif vector.dtype is not dtype:  # torch dtypes are singletons
                return None
    if dtype is None:
        return torch.float64
    return dtype if dtype in STEP_VECTOR_DTYPES else None


def backend(tensor):
    """The kernel module for ``tensor``'s device (imported, and so compiled, on first use)."""
    if tensor.is_cpu and _cpu_choice == "cpu":  # the common case first: called per kernel
        return _cpu()
    if tensor.is_cuda or _cpu_choice == "cudasim":
        module = _cuda()
        if not tensor.is_cuda and not module.SIMULATOR:
            raise RuntimeError(
                "LAYERS_KERNELS=cudasim needs numba's CUDA simulator, but numba.cuda was imported "
                "before layers without it: set LAYERS_KERNELS before importing numba"
            )
        return module
    if tensor.device.type != "cpu":
        raise ValueError(f"input: tensors on {tensor.device.type} are not supported (cpu, cuda)")
    return _cpu()


# Each backend is imported once, not looked up per kernel call; the literal module names let
# the pipeline's source tracking (experiments.records.sources) follow these imports.
@functools.lru_cache(maxsize=None)
def _cpu():
    return importlib.import_module(".cpu", __name__)


@functools.lru_cache(maxsize=None)
def _cuda():
    return importlib.import_module(".cuda", __name__)
