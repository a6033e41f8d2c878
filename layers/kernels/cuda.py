"""CUDA backend of the InPlace-ABN kernels, written with ``numba.cuda``.

Implements the same API as ``cpu.py`` (``moments``, ``forward``, ``backward_reduce``,
``backward_input``) on CUDA torch tensors, and on CPU torch tensors under numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``), which the tests use on machines without a GPU.

Launch geometry
---------------
Every kernel runs on a 2-D grid ``(channel blocks, chunks)``: ``blockIdx.y`` picks a contiguous
chunk of the elements of the channel(s) of ``blockIdx.x``, so a channel's parameters are loaded
once per thread and a reduction block only ever sums one channel (or one tile of channels).

* ``(N, C, S)`` view: one block of ``_THREADS`` threads per (channel, chunk). The chunk is a range
  of the channel's flattened ``(n, s)`` index; consecutive threads take consecutive ``s``, so the
  loads are coalesced, and each thread steps its ``(n, s)`` by ``divmod(_THREADS, S)`` without
  dividing per element.
* ``(M, C)`` channels-last view: blocks of ``(_TILE_C, _ROWS)`` threads; ``threadIdx.x`` runs along
  the channels (one warp reads ``_TILE_C`` adjacent channels of a row: coalesced) and
  ``threadIdx.y`` along the rows of the block's chunk of rows.

The number of chunks aims at ``_TARGET_BLOCKS`` blocks in all (enough to fill a large GPU) while
giving every thread at least ``_MIN_ITEMS`` elements; it is at most ``_TARGET_BLOCKS``.

Both views stay correct for any shape, but threads idle where a block has little to do: in the
``(M, C)`` view with ``C`` far from a multiple of 32 (``C = 3`` uses 3 lanes of a warp), and in
the ``(N, C, S)`` view with many channels of few elements each (``S = 1``: better passed as the
identical ``(N, C)`` view).

Reductions (``moments``, ``backward_reduce``) take two launches: the first accumulates float64
sums per thread, reduces them with a shared-memory tree per block and writes one partial per
(channel, chunk) to a ``(2, chunks, C)`` float64 buffer; the second sums the partials of each
channel, one thread per channel. ``forward`` and ``backward_input`` are one launch each.

``moments`` accumulates ``x - k`` with ``k = x[0, c, 0]`` (resp. ``x[0, c]``), a sample of the
channel shared by all its chunks, so the partials add up exactly as plain sums and a channel with
a mean far larger than its spread keeps its variance (no cancellation between ``sum(x^2)`` and
``mean^2``). The first kernel parks ``k`` in the mean row of the result, where the second adds the
mean of the shifted values to it.

Data types
----------
float32 and float64 data compute in their own precision; float16 (a native numba.cuda type)
and bfloat16 (passed as ``uint16`` bits) are loaded into float32 registers and stored back as
16 bits (:mod:`layers.kernels.codecs`), so the per-channel vectors and scalars are float32.
The partial sums of the reductions are float64 in every case.

Launching
---------
Kernels are compiled lazily, once per signature, and cached on disk; importing this module
compiles nothing and needs no GPU. The cache is keyed on this file and on ``common.py``
(:mod:`layers.kernels.caching`), so editing either recompiles on the next use.

On real CUDA tensors every launch runs on torch's current stream of the tensors' device, so it
is ordered with the surrounding torch work without any synchronisation. The first launch of
each signature goes through numba (zero-copy arrays from ``numba.cuda.as_cuda_array``, in the
context of the tensors' device); later ones go straight to the driver with the tensors'
pointers, shapes and strides (:mod:`layers.kernels.cuda_launch`), a few microseconds instead
of tens. The ``(C,)`` and ``(3, C)`` parameter tensors must be contiguous too (another layout
would compile another specialisation, one that ``KERNELS`` does not list, launched through
numba every time). Under the simulator the arrays are the tensors' ``numpy()`` views and the
default stream is used (the simulator copies each array in and writes it back in argument
order, so an ``out`` that aliases an earlier argument still ends up holding the result).

Whole steps
-----------
``forward_step`` and ``backward_step`` run a layer's forward and backward with the per-channel
arithmetic of :mod:`layers.kernels.per_channel` in kernels of one thread per channel
(``_channel_state``, ``_channel_values``, ``_channel_gradients``, which also sum the
reductions' partials): a training forward is 3 launches (moments, per-channel state,
normalise + activate), a backward 3 (variant II) or 4, and no torch operator runs in between.
Through the operators of :mod:`layers.ops` the same step takes dozens of torch operators on
vectors of ``C`` values, each microseconds of host time.

Run ``python -m layers.kernels.cuda --ptx 7.5 8.0 9.0`` to compile every kernel in ``KERNELS`` to
PTX for these compute capabilities (no GPU needed).
"""
import argparse
import contextlib
import functools
import math
import sys
import threading

import numba
import numpy as np
import torch
from numba import cuda

from . import caching, codecs, common, cuda_launch, per_channel
from .common import MODE_XHAT_FROM_X, MODE_XHAT_FROM_Y, MODE_Y
from .compose import compose_moments_forward

#: Source files besides this one whose code the kernels compile (keys of the disk cache).
DEPENDENCIES = (common.__file__, codecs.__file__, per_channel.__file__)

#: Whether numba.cuda is the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` before its import).
SIMULATOR = bool(numba.config.ENABLE_CUDASIM)
#: Element reads and writes: 16-bit data converts to float32 in registers (:mod:`.codecs`).
load, store = codecs.compiled_for_cuda()


def _serialise_simulated_shared_arrays():
    """Make numba's CUDA simulator allocate a block's shared arrays under a lock.

    The simulator runs a block's threads as Python threads, and the first thread to call
    ``cuda.shared.array`` at a line allocates the block's array for that line
    (``FakeCUDAShared.array``: look up, then store, unlocked). Two threads that get there at
    once each allocate an uninitialised array of their own, and :func:`_block_sums` then adds up
    memory no thread wrote (seen once, in a CI run under load: a channel mean of 1e276). This
    replaces the method by the same look-up and store under one lock.
    """
    import traceback

    from numba.cuda.np import numpy_support
    from numba.cuda.simulator import kernelapi

    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory, or refused: as numba
            return original(self, shape, dtype, alignment)
        caller = traceback.extract_stack(sys._getframe())[-2][0:2]  # the kernel's line
        with lock:
            allocated = self._allocations.get(caller)
            if allocated is None:
                if isinstance(dtype, kernelapi.types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                allocated = self._allocations[caller] = np.empty(shape, dtype)
        return allocated

    original = kernelapi.FakeCUDAShared.array
    kernelapi.FakeCUDAShared.array = array


if SIMULATOR:
    _serialise_simulated_shared_arrays()

#: CPython's thread switch interval while the simulator runs a launch (seconds; CPython's default
#: is 0.005). See :func:`_simulated_launch`.
SIMULATOR_SWITCH_INTERVAL_S = 1e-4


@contextlib.contextmanager
def _simulated_launch():
    """Run a simulated launch with a short thread switch interval, and restore it afterwards.

    The simulator runs each thread of a block as a Python thread, and its scheduler
    (``BlockManager.run``) polls them in a busy loop until they have all ended. That loop holds
    the GIL for up to the switch interval before a simulated thread can take it, so at CPython's
    default of 5 ms most of a launch is polling; much shorter intervals cost more in
    switching than they save. 0.1 ms ran the kernel-marked layer tests fastest of the
    intervals tried (``LAYERS_KERNELS=cudasim python -m pytest -m kernels tests/test_abn.py``
    measures it).
    """
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)

#: ``forward``, ``moments_forward`` and ``forward_step`` take ``skip``, a device-side flag that
#: makes them write nothing: :mod:`layers.functional` checks an in-place ``scale_mode="bn"``
#: layer's weight on the device with it, with no host synchronisation, on this backend.
DEVICE_GUARD = True

#: Threads per block of the main kernels: 256 on a GPU. The simulator runs each thread of a block
#: as a Python thread of its own, so it runs the same code with 64, a quarter of the threads to
#: start per block (still two rows per tile of the (M, C) view, and walks of the (N, C, S) view
#: both shorter and longer than a block's step on the tests' shapes).
_THREADS = 64 if SIMULATOR else 256
_TILE_C = 32  # channels per block in the (M, C) view: one warp wide
_ROWS = _THREADS // _TILE_C  # rows per block step in the (M, C) view
_TARGET_BLOCKS = 1024  # ~8 resident 256-thread blocks on each SM of a 132-SM GPU
_MIN_ITEMS = 4  # elements per thread before another chunk is added
_FINISH_THREADS = 32  # threads (one warp) per block of the partial-summing kernels

_device = cuda.jit(device=True, inline="always")
_act_forward = _device(common.act_forward)
_act_inverse = _device(common.act_inverse)
_act_grad = _device(common.act_grad)
_scale = _device(per_channel.scale)
_scale_derivative = _device(per_channel.scale_derivative)
_scale_shift = _device(per_channel.scale_shift)
_batch_rstd = _device(per_channel.batch_rstd)
_running_average = _device(per_channel.running_average)
_unbiased_variance = _device(per_channel.unbiased_variance)
_value_coefficients = _device(per_channel.value_coefficients)
_scale_gradient = _device(per_channel.scale_gradient)
_input_gradient_coefficients = _device(per_channel.input_gradient_coefficients)


# --------------------------------------------------------------------------------------------
# Device helpers


@_device
def _walk_start_3d(length, span, size_s):
    """First position of this thread in its block's chunk of a channel of an ``(N, C, S)`` view.

    Returns ``(j, end, n, s, dn, ds)``: the flattened index ``j = n * S + s``, the chunk end, and
    the ``(n, s)`` step for ``j += _THREADS``.
    """
    start = cuda.blockIdx.y * span
    j = start + cuda.threadIdx.x
    end = min(length, start + span)
    return j, end, j // size_s, j % size_s, _THREADS // size_s, _THREADS % size_s


@_device
def _walk_next_3d(j, n, s, dn, ds, size_s):
    """Advances ``(j, n, s)`` by ``_THREADS`` flattened positions, without a division."""
    s += ds
    n += dn
    if s >= size_s:
        s -= size_s
        n += 1
    return j + _THREADS, n, s


@_device
def _tile_start_2d(rows, span):
    """Channel, first row and chunk end of this thread in an ``(M, C)`` view."""
    start = cuda.blockIdx.y * span
    c = cuda.blockIdx.x * _TILE_C + cuda.threadIdx.x
    return c, start + cuda.threadIdx.y, min(rows, start + span)


@_device
def _block_sums(acc1, acc2, stop):
    """Tree-sums ``acc1``, ``acc2`` over the block's threads ``t, t + stop, t + 2 stop, ...``.

    ``t`` is the linear thread index (``threadIdx.x`` fastest); the sums land in threads
    ``t < stop`` (``stop = 1``: the whole block; ``stop = _TILE_C``: each channel column).
    """
    t = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    sh1 = cuda.shared.array(_THREADS, numba.float64)
    sh2 = cuda.shared.array(_THREADS, numba.float64)
    sh1[t] = acc1
    sh2[t] = acc2
    cuda.syncthreads()
    stride = _THREADS // 2
    while stride >= stop:
        if t < stride:
            sh1[t] += sh1[t + stride]
            sh2[t] += sh2[t + stride]
        cuda.syncthreads()
        stride //= 2
    return sh1[t], sh2[t]


@_device
def _dy_v(z, dz, x, p, q, act, slope, floor, mode):
    """``(dy, v)`` of one element, as defined by the backward ``mode`` (see ``common``)."""
    dy = _act_grad(z, dz, act, slope)
    if mode == MODE_XHAT_FROM_X:
        v = x * p + q
    else:
        v = _act_inverse(z, act, slope, floor)
        if mode == MODE_XHAT_FROM_Y:
            v = v * p + q
    return dy, v


@_device
def _sum_chunks(partials, c):
    """Sums the per-chunk partials of channel ``c``."""
    s1 = 0.0
    s2 = 0.0
    for g in range(partials.shape[1]):
        s1 += partials[0, g, c]
        s2 += partials[1, g, c]
    return s1, s2


@_device
def _moments_of(partials, k, count, c):
    """``(mean, M2)`` of channel ``c`` from its partials of the values shifted by ``k``."""
    s1, s2 = _sum_chunks(partials, c)
    return k + s1 / count, max(s2 - s1 * (s1 / count), 0.0)  # M2 >= 0 up to rounding


# --------------------------------------------------------------------------------------------
# Kernels: (N, C, S) view


def _moments_3d(x, span, out, partials):
    """Partials of ``sum(x - k)``, ``sum((x - k)^2)``; parks ``k = x[0, c, 0]`` in ``out[0, c]``."""
    c = cuda.blockIdx.x
    k = float(load(x[0, c, 0]))
    acc1 = 0.0
    acc2 = 0.0
    j, end, n, s, dn, ds = _walk_start_3d(x.shape[0] * x.shape[2], span, x.shape[2])
    while j < end:
        d = float(load(x[n, c, s])) - k
        acc1 += d
        acc2 += d * d
        j, n, s = _walk_next_3d(j, n, s, dn, ds, x.shape[2])
    s1, s2 = _block_sums(acc1, acc2, 1)
    if cuda.threadIdx.x == 0:
        partials[0, cuda.blockIdx.y, c] = s1
        partials[1, cuda.blockIdx.y, c] = s2
        if cuda.blockIdx.y == 0:
            out[0, c] = k


def _grad_sums_3d(z, dz, x, p, q, act, slope, floor, mode, span, partials):
    """Partials of ``sum(dy)``, ``sum(dy * v)``."""
    c = cuda.blockIdx.x
    pc = p[c]
    qc = q[c]
    acc1 = 0.0
    acc2 = 0.0
    j, end, n, s, dn, ds = _walk_start_3d(z.shape[0] * z.shape[2], span, z.shape[2])
    while j < end:
        zv = load(z[n, c, s])
        xv = load(x[n, c, s]) if mode == MODE_XHAT_FROM_X else zv
        dy, v = _dy_v(zv, load(dz[n, c, s]), xv, pc, qc, act, slope, floor, mode)
        acc1 += dy
        acc2 += float(dy) * v
        j, n, s = _walk_next_3d(j, n, s, dn, ds, z.shape[2])
    s1, s2 = _block_sums(acc1, acc2, 1)
    if cuda.threadIdx.x == 0:
        partials[0, cuda.blockIdx.y, c] = s1
        partials[1, cuda.blockIdx.y, c] = s2


def _forward_3d(x, out, a, b, act, slope, span, skip):
    """``out = act(x * a[c] + b[c])``; writes nothing if ``skip[0]`` is non-zero."""
    if skip[0] != 0:
        return
    c = cuda.blockIdx.x
    ac = a[c]
    bc = b[c]
    j, end, n, s, dn, ds = _walk_start_3d(x.shape[0] * x.shape[2], span, x.shape[2])
    while j < end:
        out[n, c, s] = store(_act_forward(load(x[n, c, s]) * ac + bc, act, slope), out)
        j, n, s = _walk_next_3d(j, n, s, dn, ds, x.shape[2])


def _grad_input_3d(z, dz, x, p, q, coef, act, slope, floor, mode, span, out):
    """``out = dy * coef[0, c] + v * coef[1, c] + coef[2, c]``."""
    c = cuda.blockIdx.x
    pc = p[c]
    qc = q[c]
    c0 = coef[0, c]
    c1 = coef[1, c]
    c2 = coef[2, c]
    j, end, n, s, dn, ds = _walk_start_3d(z.shape[0] * z.shape[2], span, z.shape[2])
    while j < end:
        zv = load(z[n, c, s])
        xv = load(x[n, c, s]) if mode == MODE_XHAT_FROM_X else zv
        dy, v = _dy_v(zv, load(dz[n, c, s]), xv, pc, qc, act, slope, floor, mode)
        out[n, c, s] = store(dy * c0 + v * c1 + c2, out)
        j, n, s = _walk_next_3d(j, n, s, dn, ds, z.shape[2])


# --------------------------------------------------------------------------------------------
# Kernels: (M, C) channels-last view


def _moments_2d(x, span, out, partials):
    """Partials of ``sum(x - k)``, ``sum((x - k)^2)``; parks ``k = x[0, c]`` in ``out[0, c]``."""
    c, m, end = _tile_start_2d(x.shape[0], span)
    acc1 = 0.0
    acc2 = 0.0
    if c < x.shape[1]:
        k = float(load(x[0, c]))
        while m < end:
            d = float(load(x[m, c])) - k
            acc1 += d
            acc2 += d * d
            m += _ROWS
    s1, s2 = _block_sums(acc1, acc2, _TILE_C)
    if cuda.threadIdx.y == 0 and c < x.shape[1]:
        partials[0, cuda.blockIdx.y, c] = s1
        partials[1, cuda.blockIdx.y, c] = s2
        if cuda.blockIdx.y == 0:
            out[0, c] = float(load(x[0, c]))


def _grad_sums_2d(z, dz, x, p, q, act, slope, floor, mode, span, partials):
    """Partials of ``sum(dy)``, ``sum(dy * v)``."""
    c, m, end = _tile_start_2d(z.shape[0], span)
    acc1 = 0.0
    acc2 = 0.0
    if c < z.shape[1]:
        pc = p[c]
        qc = q[c]
        while m < end:
            zv = load(z[m, c])
            xv = load(x[m, c]) if mode == MODE_XHAT_FROM_X else zv
            dy, v = _dy_v(zv, load(dz[m, c]), xv, pc, qc, act, slope, floor, mode)
            acc1 += dy
            acc2 += float(dy) * v
            m += _ROWS
    s1, s2 = _block_sums(acc1, acc2, _TILE_C)
    if cuda.threadIdx.y == 0 and c < z.shape[1]:
        partials[0, cuda.blockIdx.y, c] = s1
        partials[1, cuda.blockIdx.y, c] = s2


def _forward_2d(x, out, a, b, act, slope, span, skip):
    """``out = act(x * a[c] + b[c])``; writes nothing if ``skip[0]`` is non-zero."""
    if skip[0] != 0:
        return
    c, m, end = _tile_start_2d(x.shape[0], span)
    if c < x.shape[1]:
        ac = a[c]
        bc = b[c]
        while m < end:
            out[m, c] = store(_act_forward(load(x[m, c]) * ac + bc, act, slope), out)
            m += _ROWS


def _grad_input_2d(z, dz, x, p, q, coef, act, slope, floor, mode, span, out):
    """``out = dy * coef[0, c] + v * coef[1, c] + coef[2, c]``."""
    c, m, end = _tile_start_2d(z.shape[0], span)
    if c < z.shape[1]:
        pc = p[c]
        qc = q[c]
        c0 = coef[0, c]
        c1 = coef[1, c]
        c2 = coef[2, c]
        while m < end:
            zv = load(z[m, c])
            xv = load(x[m, c]) if mode == MODE_XHAT_FROM_X else zv
            dy, v = _dy_v(zv, load(dz[m, c]), xv, pc, qc, act, slope, floor, mode)
            out[m, c] = store(dy * c0 + v * c1 + c2, out)
            m += _ROWS


# --------------------------------------------------------------------------------------------
# Kernels: combining the partials, one thread per channel


def _finish_moments(partials, count, out):
    """``out[0] = k + sum(x - k) / count`` (``out[0]`` holds ``k``), ``out[1] = M2``."""
    c = cuda.grid(1)
    if c < out.shape[1]:
        out[0, c], out[1, c] = _moments_of(partials, out[0, c], count, c)


def _finish_sums(partials, out):
    """``out[:, c]`` = the sums of the partials of channel ``c``."""
    c = cuda.grid(1)
    if c < out.shape[1]:
        s1, s2 = _sum_chunks(partials, c)
        out[0, c] = s1
        out[1, c] = s2


# --------------------------------------------------------------------------------------------
# Kernels: the per-channel arithmetic of the whole steps (:mod:`.per_channel`), one thread per
# channel. ``vectors`` holds which of the optional per-channel tensors were given (bits
# ``_WEIGHT``, ``_BIAS``, ``_RUNNING``); an absent one is a placeholder never read.

_WEIGHT, _BIAS, _RUNNING = 1, 2, 4
_INPUT_GRAD = 8  # bit of ``_channel_gradients``'s ``outputs`` (``_WEIGHT``, ``_BIAS`` as above)


def _channel_state(partials, moments, training, count, eps, momentum, abs_mode, weight, bias,
                   running_mean, running_var, vectors, skip, state, ab):
    """Rows ``gamma, beta, dgamma_dweight, mean, rstd, count`` of ``state`` and the forward's
    ``ab = [a, b]`` (``act(x * a + b)``), from the batch's statistics (``training``: the
    partials of :func:`_moments_3d` / ``_2d``, ``k`` parked in ``moments[0]``) or the running
    ones; in training the running statistics, if given, are updated as ``nn.BatchNorm2d`` does,
    unless ``skip[0]`` is set."""
    c = cuda.grid(1)
    if c >= state.shape[1]:
        return
    gamma, dgamma_dweight = 1.0, 0.0
    if vectors & _WEIGHT:
        gamma = _scale(float(weight[c]), eps, abs_mode)
        dgamma_dweight = _scale_derivative(float(weight[c]), abs_mode)
    beta = float(bias[c]) if vectors & _BIAS else 0.0
    if training:
        mean, m2 = _moments_of(partials, moments[0, c], count, c)
        rstd = _batch_rstd(m2, count, eps)
        if vectors & _RUNNING and skip[0] == 0:
            running_mean[c] = _running_average(float(running_mean[c]), mean, momentum)
            running_var[c] = _running_average(float(running_var[c]),
                                              _unbiased_variance(m2, count), momentum)
    else:
        mean = float(running_mean[c])
        rstd = _batch_rstd(float(running_var[c]), 1.0, eps)
    state[0, c] = gamma
    state[1, c] = beta
    state[2, c] = dgamma_dweight
    state[3, c] = mean
    state[4, c] = rstd
    state[5, c] = count
    ab[0, c], ab[1, c] = _scale_shift(gamma, beta, mean, rstd)


def _channel_values(state, from_x, pq):
    """``pq = [p, q]`` of the backward's value ``v`` (:mod:`.common`) from ``state``."""
    c = cuda.grid(1)
    if c < state.shape[1]:
        pq[0, c], pq[1, c] = _value_coefficients(state[0, c], state[1, c], state[3, c],
                                                 state[4, c], from_x)


def _channel_gradients(partials, state, training, variant_y, poison, outputs, coef, dweight,
                       dbias):
    """The backward's per-channel results from the partials of :func:`_grad_sums_3d` /
    ``_2d``: ``coef`` (``k0, k1, k2`` of the input gradient), ``dweight`` and ``dbias``, each
    written where its bit of ``outputs`` is set; all NaN where ``poison[0]`` is set."""
    c = cuda.grid(1)
    if c >= state.shape[1]:
        return
    sum_dy, sum_dy_v = _sum_chunks(partials, c)
    if poison[0] != 0:
        sum_dy, sum_dy_v = math.nan, math.nan
    gamma, beta, rstd, count = state[0, c], state[1, c], state[4, c], state[5, c]
    if outputs & _INPUT_GRAD:
        if training:
            k0, k1, k2 = _input_gradient_coefficients(gamma, beta, rstd, count, sum_dy,
                                                      sum_dy_v, variant_y)
        else:  # running statistics do not depend on x
            k0, k1, k2 = gamma * rstd, 0.0, 0.0
        if poison[0] != 0:
            k0, k1, k2 = math.nan, math.nan, math.nan
        coef[0, c] = k0
        coef[1, c] = k1
        coef[2, c] = k2
    if outputs & _WEIGHT:
        dweight[c] = _scale_gradient(gamma, beta, sum_dy, sum_dy_v, variant_y) * state[2, c]
    if outputs & _BIAS:
        dbias[c] = sum_dy


# --------------------------------------------------------------------------------------------
# The kernel list: one place for the launchers, the PTX command line and the tests


#: ``(array element, compute)`` types of the kernels' signatures, one per tensor dtype
#: (float32, float64, float16, bfloat16 as its bits: see :mod:`.codecs`).
_DATA_TYPES = (("float32", "float32"), ("float64", "float64"), ("float16", "float32"),
               ("uint16", "float32"))


def _signatures(args, ndim):
    """``void(...)`` signatures of a kernel for every data type of ``_DATA_TYPES``.

    ``args`` spells the arguments with ``{a}`` (a data array of ``ndim`` dimensions), ``{v}`` (a
    ``(C,)`` vector), ``{m}`` (a small 2-D matrix) and ``{t}`` (a scalar); vectors, matrices
    and scalars are in the compute type. The scalar types match what the launchers pass
    (python ints are int64).
    """
    data = "{s}[:, :, ::1]" if ndim == 3 else "{s}[:, ::1]"
    template = args.format(a=data, v="{t}[::1]", m="{t}[:, ::1]", t="{t}")
    return tuple(f"void({template.format(s=s, t=t)})" for s, t in _DATA_TYPES)


_MOMENTS = "{a}, int64, float64[:, ::1], float64[:, :, ::1]"
_GRAD_SUMS = "{a}, {a}, {a}, {v}, {v}, int64, {t}, {t}, int64, int64, float64[:, :, ::1]"
_FORWARD = "{a}, {a}, {v}, {v}, int64, {t}, int64, uint8[::1]"
_GRAD_INPUT = "{a}, {a}, {a}, {v}, {v}, {m}, int64, {t}, {t}, int64, int64, {a}"
#: Per-channel kernels: ``{w}`` the dtype of the layer's per-channel tensors, ``{t}`` the
#: compute dtype.
_CHANNEL_STATE = ("float64[:, :, ::1], float64[:, ::1], int64, float64, float64, float64, "
                  "int64, {w}[::1], {w}[::1], {w}[::1], {w}[::1], int64, uint8[::1], "
                  "float64[:, ::1], {t}[:, ::1]")
_CHANNEL_VALUES = "float64[:, ::1], int64, {t}[:, ::1]"
_CHANNEL_GRADIENTS = ("float64[:, :, ::1], float64[:, ::1], int64, int64, uint8[::1], int64, "
                      "{t}[:, ::1], {w}[::1], {w}[::1]")


def _channel_signatures(args):
    """``void(...)`` signatures of a per-channel kernel for each parameter dtype (float32,
    float64; ``{w}``) and compute dtype (``{t}``)."""
    return tuple(f"void({args.format(w=w, t=t)})" for w in ("float32", "float64")
                 for t in ("float32", "float64"))

#: ``(python kernel, signatures)`` of every kernel, the signatures being those launched.
KERNELS = (
    (_moments_3d, _signatures(_MOMENTS, 3)),
    (_grad_sums_3d, _signatures(_GRAD_SUMS, 3)),
    (_forward_3d, _signatures(_FORWARD, 3)),
    (_grad_input_3d, _signatures(_GRAD_INPUT, 3)),
    (_moments_2d, _signatures(_MOMENTS, 2)),
    (_grad_sums_2d, _signatures(_GRAD_SUMS, 2)),
    (_forward_2d, _signatures(_FORWARD, 2)),
    (_grad_input_2d, _signatures(_GRAD_INPUT, 2)),
    (_finish_moments, ("void(float64[:, :, ::1], float64, float64[:, ::1])",)),
    (_finish_sums, ("void(float64[:, :, ::1], float64[:, ::1])",)),
    (_channel_state, _channel_signatures(_CHANNEL_STATE)),
    (_channel_values, tuple(dict.fromkeys(_channel_signatures(_CHANNEL_VALUES)))),
    (_channel_gradients, _channel_signatures(_CHANNEL_GRADIENTS)),
)

_LAUNCHERS = {fn: caching.jit(cuda.jit, DEPENDENCIES)(fn) for fn, _ in KERNELS}


# --------------------------------------------------------------------------------------------
# Host side


@functools.lru_cache(maxsize=256)
def _geometry(shape):
    """``(grid, block, span)`` of the main kernels for a canonical view of ``shape``.

    ``span`` is the chunk length along the channel's elements (``(N, C, S)``) or rows (``(M, C)``).
    """
    if len(shape) == 3:
        length, channel_blocks, block = shape[0] * shape[2], shape[1], (_THREADS,)
    else:
        length, channel_blocks, block = shape[0], _ceil_div(shape[1], _TILE_C), (_TILE_C, _ROWS)
    per_block = _MIN_ITEMS * block[-1]  # a block steps _THREADS elements, or _ROWS rows
    chunks = min(_ceil_div(_TARGET_BLOCKS, channel_blocks), _ceil_div(length, per_block))
    span = _ceil_div(length, chunks)
    return (channel_blocks, _ceil_div(length, span)), block, span


def _ceil_div(a, b):
    return -(-a // b)


@functools.lru_cache(maxsize=64)
def _external_stream(handle):
    """numba's wrapper of the torch stream ``handle``."""
    return cuda.external_stream(handle)


def _array(t):
    """The zero-copy array a kernel takes for tensor ``t`` (see the module docstring; 16-bit
    data as :mod:`.codecs` says)."""
    if SIMULATOR:
        return codecs.simulator_array(t)
    return cuda.as_cuda_array(codecs.cuda_tensor(t), sync=False)


def _launch(kernel, grid, block, device, *args):
    """Launches ``kernel`` on torch's current stream of ``device`` (:mod:`.cuda_launch` once
    numba has launched the signature; tensors become numba arrays on numba's path)."""
    dispatcher = _LAUNCHERS[kernel]
    if not SIMULATOR and _FAST.launch(dispatcher, grid, block, device.index, args):
        return
    arrays = [_array(a) if isinstance(a, torch.Tensor) else a for a in args]
    if SIMULATOR:
        with _simulated_launch():
            dispatcher[grid, block](*arrays)
        return
    with cuda.gpus[device.index]:
        stream = _external_stream(torch.cuda.current_stream(device).cuda_stream)
        dispatcher[grid, block, stream](*arrays)
    _FAST.register(dispatcher, device.index, args, arrays)


_FAST = cuda_launch.FastLauncher()


def _scalar(t, value):
    """``value`` as a scalar of the compute type of ``t``'s data, as the signatures expect."""
    return float(value) if t.dtype == torch.float64 else np.float32(value)


def _floor(t):
    """The ELU saturation ``y`` for ``t``'s dtype (``common.elu_saturated_y``)."""
    return _scalar(t, common.elu_saturated_y(codecs.epsneg(t.dtype)))


def _finish_grid(channels):
    return (_ceil_div(channels, _FINISH_THREADS),), (_FINISH_THREADS,)


def _reduction_setup(x):
    """Geometry, float64 ``(2, C)`` result and ``(2, chunks, C)`` partials of a reduction."""
    grid, block, span = _geometry(tuple(x.shape))
    out = torch.empty(2, x.shape[1], dtype=torch.float64, device=x.device)
    partials = torch.empty(2, grid[1], x.shape[1], dtype=torch.float64, device=x.device)
    return grid, block, span, out, partials


def moments(x):
    """float64 ``(2, C)``: per-channel mean and ``M2 = sum((x - mean)^2)`` of ``x``."""
    if x.numel() == 0:
        return torch.full((2, x.shape[1]), math.nan, dtype=torch.float64, device=x.device)
    grid, block, span, out, partials = _reduction_setup(x)
    kernel = _moments_3d if x.dim() == 3 else _moments_2d
    _launch(kernel, grid, block, x.device, x, span, out, partials)
    count = float(x.numel() // x.shape[1])
    _launch(_finish_moments, *_finish_grid(x.shape[1]), x.device, partials, count, out)
    return out


def moments_forward(x, out, gamma, beta, eps, act, slope, skip=None):
    """``moments(x)`` then the normalized, activated ``out`` (3 launches; see ``cpu.py``).

    ``skip``: as in :func:`forward` (the moments are computed either way).
    """
    return compose_moments_forward(sys.modules[__name__], x, out, gamma, beta, eps, act, slope,
                                   skip=skip)


def forward(x, out, a, b, act, slope, skip=None):
    """``out[.., c, ..] = act(x * a[c] + b[c])``; ``out`` may be ``x`` itself.

    ``skip``: ``None`` or a ``(1,)`` bool tensor on ``x``'s device; where it holds ``True`` when
    the kernel runs, nothing is written. The host never reads it (see :data:`DEVICE_GUARD`).
    """
    if x.numel() == 0:
        return
    grid, block, span = _geometry(tuple(x.shape))
    kernel = _forward_3d if x.dim() == 3 else _forward_2d
    _launch(kernel, grid, block, x.device, x, out, a, b, int(act), _scalar(x, slope), span,
            _flag(skip, x.device))


@functools.lru_cache(maxsize=None)
def _never(device):
    """A ``(1,)`` uint8 zero on ``device``: the ``skip`` of unguarded launches (only read)."""
    return torch.zeros(1, dtype=torch.uint8, device=device)


def _flag(flag, device):
    """A ``(1,)`` bool device flag as the kernels take it (``None``: never set)."""
    return _never(device) if flag is None else flag.view(torch.uint8)


def backward_reduce(z, dz, x, p, q, act, slope, mode):
    """float64 ``(2, C)``: per-channel ``sum(dy)`` and ``sum(dy * v)`` (see ``common``)."""
    if z.numel() == 0:
        return torch.zeros(2, z.shape[1], dtype=torch.float64, device=z.device)
    grid, block, span, out, partials = _reduction_setup(z)
    kernel = _grad_sums_3d if z.dim() == 3 else _grad_sums_2d
    args = (z, dz, x, p, q, int(act), _scalar(z, slope), _floor(z), int(mode), span, partials)
    _launch(kernel, grid, block, z.device, *args)
    _launch(_finish_sums, *_finish_grid(z.shape[1]), z.device, partials, out)
    return out


def backward_input(z, dz, x, p, q, coef, act, slope, mode, out):
    """``out = dy * coef[0, c] + v * coef[1, c] + coef[2, c]``; ``out`` may be ``dz`` (each
    thread reads an element of ``dz`` before it writes the same element of ``out``)."""
    if z.numel() == 0:
        return
    grid, block, span = _geometry(tuple(z.shape))
    kernel = _grad_input_3d if z.dim() == 3 else _grad_input_2d
    args = (z, dz, x, p, q, coef, int(act), _scalar(z, slope), _floor(z), int(mode), span, out)
    _launch(kernel, grid, block, z.device, *args)


# --------------------------------------------------------------------------------------------
# Whole steps: a layer's forward in 2 or 3 launches and its backward in 3 or 4, the per-channel
# arithmetic in kernels of its own, no torch operator in between (as ``cpu.forward_step`` and
# ``cpu.backward_step``, whose API these share, plus the device flags ``skip`` and ``poison``)


def _vector_dtype(*vectors):
    """The dtype of the given per-channel tensors (all of one dtype; float32 if none)."""
    for vector in vectors:
        if vector is not None:
            return vector.dtype
    return torch.float32


@functools.lru_cache(maxsize=None)
def _placeholder(device, dtype, dim=1):
    """A ``(1,)`` (or ``(1, 1)``) tensor passed for an absent per-channel argument, never
    read or written."""
    return torch.zeros((1,) * dim, dtype=dtype, device=device)


def _vectors_present(weight, bias, running_mean):
    return ((_WEIGHT if weight is not None else 0) | (_BIAS if bias is not None else 0)
            | (_RUNNING if running_mean is not None else 0))


def forward_step(x, out, weight, bias, running_mean, running_var, training, momentum, eps, act,
                 slope, abs_mode, skip=None):
    """The forward of BN + activation on canonical views: ``out = act(gamma * x_hat + beta)``
    (``out`` may be ``x``), with the batch statistics in ``training`` (the running statistics,
    if given, updated as ``nn.BatchNorm2d`` does), else the running ones.

    Returns the (6, C) float64 per-channel state (rows ``gamma, beta, dgamma_dweight, mean,
    rstd, count``) on the device. ``weight``, ``bias``, ``running_mean``, ``running_var``:
    ``None`` or tensors of one dtype, float32 or float64; ``abs_mode``: the scale is
    ``|weight| + eps``, else ``weight``. ``skip``: as in :func:`forward`; where set, neither
    ``out`` nor the running statistics are written. Training needs more than one value per
    channel (the caller checks).
    """
    channels, device = x.shape[1], x.device
    count = x.numel() // channels
    dtype = _vector_dtype(weight, bias, running_mean, running_var)
    state = torch.empty(6, channels, dtype=torch.float64, device=device)
    ab = torch.empty(2, channels, dtype=codecs.compute_dtype(x.dtype), device=device)
    if training:
        grid, block, span, moments, partials = _reduction_setup(x)
        kernel = _moments_3d if x.dim() == 3 else _moments_2d
        _launch(kernel, grid, block, device, x, span, moments, partials)
    else:
        moments = _placeholder(device, torch.float64, 2)
        partials = _placeholder(device, torch.float64, 3)
    placeholder = _placeholder(device, dtype)
    vectors = [placeholder if v is None else v
               for v in (weight, bias, running_mean, running_var)]
    skip = _flag(skip, device)
    _launch(_channel_state, *_finish_grid(channels), device, partials, moments, int(training),
            float(count), float(eps), float(momentum), int(abs_mode), *vectors,
            _vectors_present(weight, bias, running_mean), skip, state, ab)
    if count:
        grid, block, span = _geometry(tuple(x.shape))
        kernel = _forward_3d if x.dim() == 3 else _forward_2d
        _launch(kernel, grid, block, device, x, out, ab[0], ab[1], int(act), _scalar(x, slope),
                span, skip)
    return state


def backward_step(z, dz, x, state, act, slope, mode, training, input_grad, param_dtype,
                  has_weight, has_bias, poison=None, out=None):
    """The backward of BN + activation on canonical views, given the forward's ``state``.

    Writes the input gradient if ``input_grad``: into ``out``, a view shaped like ``dz`` that
    does not overlap it, or over ``dz`` where ``out`` is None (each thread reads an element of
    ``dz`` before it writes the same element of the output, so either is one pass); returns
    ``(dweight, dbias)``,
    tensors of ``param_dtype`` (float32 or float64; ``None`` where ``has_weight`` /
    ``has_bias`` is false). ``x`` is only read in ``MODE_XHAT_FROM_X`` (``None`` otherwise:
    ``v`` is recovered from ``z``); ``training``: whether the forward used batch statistics;
    ``poison``: ``None`` or a ``(1,)`` bool device flag, where set every gradient is NaN.
    """
    channels, device = z.shape[1], z.device
    compute = codecs.compute_dtype(z.dtype)
    x = z if x is None else x
    pq = torch.empty(2, channels, dtype=compute, device=device)
    if mode != MODE_Y:  # variant II reads neither p nor q
        _launch(_channel_values, *_finish_grid(channels), device, state,
                int(mode == MODE_XHAT_FROM_X), pq)
    floor = _floor(z)
    if z.numel():
        grid, block, span = _geometry(tuple(z.shape))
        partials = torch.empty(2, grid[1], channels, dtype=torch.float64, device=device)
        kernel = _grad_sums_3d if z.dim() == 3 else _grad_sums_2d
        _launch(kernel, grid, block, device, z, dz, x, pq[0], pq[1], int(act),
                _scalar(z, slope), floor, int(mode), span, partials)
    else:
        partials = torch.empty(2, 0, channels, dtype=torch.float64, device=device)
    placeholder = _placeholder(device, param_dtype)
    coef = (torch.empty(3, channels, dtype=compute, device=device) if input_grad
            else _placeholder(device, compute, 2))
    dweight = torch.empty(channels, dtype=param_dtype, device=device) if has_weight else None
    dbias = torch.empty(channels, dtype=param_dtype, device=device) if has_bias else None
    outputs = ((_INPUT_GRAD if input_grad else 0) | (_WEIGHT if has_weight else 0)
               | (_BIAS if has_bias else 0))
    _launch(_channel_gradients, *_finish_grid(channels), device, partials, state,
            int(training), int(mode == MODE_Y), _flag(poison, device), outputs, coef,
            placeholder if dweight is None else dweight,
            placeholder if dbias is None else dbias)
    if input_grad and z.numel():
        _launch(_grad_input_3d if z.dim() == 3 else _grad_input_2d, grid, block, device, z, dz,
                x, pq[0], pq[1], coef, int(act), _scalar(z, slope), floor, int(mode), span,
                dz if out is None else out)
    return dweight, dbias


# --------------------------------------------------------------------------------------------
# Command line


def compile_all_ptx(cc):
    """Compiles every signature of ``KERNELS`` to PTX for compute capability ``cc`` (a tuple).

    Yields ``(kernel name, signature, PTX size in bytes or the exception raised)``; a
    ``CCSupportError`` (``cc`` unsupported by the installed toolkit), ``NvvmSupportError`` or
    ``NvrtcSupportError`` (no libNVVM or NVRTC) is raised instead, as it concerns the toolkit
    rather than a kernel.
    """
    from numba.cuda.cudadrv.error import CCSupportError, NvrtcSupportError, NvvmSupportError
    from numba.cuda.cudadrv.nvrtc import find_closest_arch

    find_closest_arch(cc)  # what compile_ptx checks too, raising before any kernel is typed
    for fn, signatures in KERNELS:
        for sig in signatures:
            try:
                ptx, _ = cuda.compile_ptx(fn, sig, cc=cc)
            except (CCSupportError, NvrtcSupportError, NvvmSupportError):
                raise
            except Exception as error:  # a kernel that does not compile is reported, not fatal
                yield fn.__name__, sig, error
            else:
                yield fn.__name__, sig, len(ptx)


def _ptx_main(ccs):
    """Prints one line per (kernel, signature, cc); returns the number of failures.

    A compute capability the installed NVVM cannot target is reported and skipped; it counts as
    a failure only when no requested capability could be compiled at all.
    """
    from numba.cuda.cudadrv.error import CCSupportError

    failures, compiled = 0, 0
    for text in ccs:
        cc = tuple(int(part) for part in text.split("."))
        try:
            for name, sig, result in compile_all_ptx(cc):
                ok = isinstance(result, int)
                failures += not ok
                compiled += ok
                outcome = f"{result} bytes" if ok else f"FAILED {result!r}"
                print(f"{name} {sig} cc={text}: {outcome}")
        except CCSupportError as error:
            print(f"cc={text}: SKIPPED, {error}", file=sys.stderr)
    return failures + (compiled == 0)


def main(argv=None):
    """``python -m layers.kernels.cuda --ptx CC [CC ...]``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m layers.kernels.cuda",
                                     description="Compiles every CUDA kernel to PTX.")
    parser.add_argument("--ptx", nargs="+", metavar="CC", required=True,
                        help="compute capabilities, e.g. 7.5 8.0 9.0")
    return 1 if _ptx_main(parser.parse_args(argv).ptx) else 0


if __name__ == "__main__":
    sys.exit(main())
