"""CPU kernels (``numba.njit(parallel=True)``) for the ABN family.

Implements the backend API shared with :mod:`layers.kernels.cuda` (see
:mod:`layers.kernels` for the contract): per-channel ``moments``, the fused ``forward``
``act(x * a + b)``, and the two backward passes ``backward_reduce`` and ``backward_input``.
Each takes torch CPU tensors in one of the canonical views of :mod:`layers.kernels.common`
(3-D ``(N, C, S)`` or 2-D channels-last ``(M, C)``) and works on them zero-copy through
``Tensor.numpy()``.

Every element-wise loop reads and writes memory once: the forward costs one read for the
statistics and one read plus one write for the output, the backward two reads for the
reductions and two reads plus one write for the input gradient. Reductions accumulate in
float64; the statistics subtract a per-channel sample value first (shifted sums), so a large
mean does not cancel the variance in float32.

All functions compile lazily on first use and are cached on disk (``cache=True``).
"""
import numba
import numpy as np
import torch

from . import common

_jit_scalar = numba.njit(inline="always", cache=True)
_act_forward = _jit_scalar(common.act_forward)
_act_inverse = _jit_scalar(common.act_inverse)
_act_grad = _jit_scalar(common.act_grad)

_parallel = numba.njit(parallel=True, cache=True)
# Reassociation lets LLVM vectorise float64 sums; nothing else about IEEE semantics changes.
_parallel_reduction = numba.njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})


@_jit_scalar
def _backward_value(z, x, p, q, act, slope, mode):
    """The value ``v`` that ``sum(dy * v)`` is taken against (see ``common`` for the modes)."""
    if mode == common.MODE_XHAT_FROM_X:
        return x * p + q
    y = _act_inverse(z, act, slope)
    if mode == common.MODE_XHAT_FROM_Y:
        return y * p + q
    return y


# --------------------------------------------------------------------------- moments
@_parallel_reduction
def _moments_ncs(x):
    n, c, s = x.shape
    shift = np.empty(c, np.float64)
    for j in range(c):
        shift[j] = x[0, j, 0]
    partial = np.zeros((2, n, c), np.float64)
    for row in numba.prange(n * c):
        i, j = row // c, row % c
        k = shift[j]
        s1 = 0.0
        s2 = 0.0
        for t in range(s):
            d = x[i, j, t] - k
            s1 += d
            s2 += d * d
        partial[0, i, j] = s1
        partial[1, i, j] = s2
    return _finish_moments(partial, shift, n * s)


@_parallel_reduction
def _moments_mc(x, chunks):
    m, c = x.shape
    shift = np.empty(c, np.float64)
    for j in range(c):
        shift[j] = x[0, j]
    partial = np.zeros((2, chunks, c), np.float64)
    for b in numba.prange(chunks):
        for r in range(b * m // chunks, (b + 1) * m // chunks):
            for j in range(c):
                d = x[r, j] - shift[j]
                partial[0, b, j] += d
                partial[1, b, j] += d * d
    return _finish_moments(partial, shift, m)


@numba.njit(cache=True)
def _finish_moments(partial, shift, count):
    """Combine shifted partial sums (2, blocks, C) into ``[mean, M2]`` per channel."""
    s1 = partial[0].sum(axis=0)
    s2 = partial[1].sum(axis=0)
    out = np.empty((2, shift.shape[0]), np.float64)
    out[0] = shift + s1 / count
    out[1] = np.maximum(s2 - s1 * s1 / count, 0.0)
    return out


# --------------------------------------------------------------------------- forward
@_parallel
def _forward_ncs(x, out, a, b, act, slope):
    n, c, s = x.shape
    for row in numba.prange(n * c):
        i, j = row // c, row % c
        aj, bj = a[j], b[j]
        for t in range(s):
            out[i, j, t] = _act_forward(x[i, j, t] * aj + bj, act, slope)


@_parallel
def _forward_mc(x, out, a, b, act, slope):
    m, c = x.shape
    for r in numba.prange(m):
        for j in range(c):
            out[r, j] = _act_forward(x[r, j] * a[j] + b[j], act, slope)


# --------------------------------------------------------------------------- backward
@_parallel_reduction
def _backward_reduce_ncs(z, dz, x, p, q, act, slope, mode):
    n, c, s = z.shape
    partial = np.zeros((2, n, c), np.float64)
    for row in numba.prange(n * c):
        i, j = row // c, row % c
        pj, qj = p[j], q[j]
        s0 = 0.0
        s1 = 0.0
        for t in range(s):
            zt = z[i, j, t]
            dy = _act_grad(zt, dz[i, j, t], act, slope)
            s0 += dy
            s1 += dy * _backward_value(zt, x[i, j, t], pj, qj, act, slope, mode)
        partial[0, i, j] = s0
        partial[1, i, j] = s1
    return partial.sum(axis=1)


@_parallel_reduction
def _backward_reduce_mc(z, dz, x, p, q, act, slope, mode, chunks):
    m, c = z.shape
    partial = np.zeros((2, chunks, c), np.float64)
    for b in numba.prange(chunks):
        for r in range(b * m // chunks, (b + 1) * m // chunks):
            for j in range(c):
                zt = z[r, j]
                dy = _act_grad(zt, dz[r, j], act, slope)
                partial[0, b, j] += dy
                partial[1, b, j] += dy * _backward_value(zt, x[r, j], p[j], q[j], act, slope, mode)
    return partial.sum(axis=1)


@_parallel
def _backward_input_ncs(z, dz, x, p, q, coef, act, slope, mode, out):
    n, c, s = z.shape
    for row in numba.prange(n * c):
        i, j = row // c, row % c
        pj, qj = p[j], q[j]
        k0, k1, k2 = coef[0, j], coef[1, j], coef[2, j]
        for t in range(s):
            zt = z[i, j, t]
            dy = _act_grad(zt, dz[i, j, t], act, slope)
            v = _backward_value(zt, x[i, j, t], pj, qj, act, slope, mode)
            out[i, j, t] = dy * k0 + v * k1 + k2


@_parallel
def _backward_input_mc(z, dz, x, p, q, coef, act, slope, mode, out):
    m, c = z.shape
    for r in numba.prange(m):
        for j in range(c):
            zt = z[r, j]
            dy = _act_grad(zt, dz[r, j], act, slope)
            v = _backward_value(zt, x[r, j], p[j], q[j], act, slope, mode)
            out[r, j] = dy * coef[0, j] + v * coef[1, j] + coef[2, j]


# --------------------------------------------------------------------------- API
def _np(t):
    """Zero-copy numpy view of a CPU tensor."""
    return t.detach().numpy()


def _chunks(rows):
    """Row blocks a channels-last reduction is split into: a few per thread."""
    return max(1, min(rows, 4 * numba.get_num_threads()))


def _scalar(value, like):
    """``value`` as a numpy scalar of ``like``'s dtype, so float32 loops stay in float32."""
    return like.dtype.type(value)


def moments(x):
    """Per-channel ``[mean, M2]`` (float64, shape ``(2, C)``) of a canonical view."""
    if x.dim() == 3:
        return torch.from_numpy(_moments_ncs(_np(x)))
    return torch.from_numpy(_moments_mc(_np(x), _chunks(x.shape[0])))


def forward(x, out, a, b, act, slope):
    """``out = act(x * a + b)`` per channel; ``out`` may be ``x`` itself."""
    kernel = _forward_ncs if x.dim() == 3 else _forward_mc
    xa = _np(x)
    kernel(xa, _np(out), _np(a), _np(b), act, _scalar(slope, xa))


def backward_reduce(z, dz, x, p, q, act, slope, mode):
    """``[sum(dy), sum(dy * v)]`` per channel (float64, shape ``(2, C)``)."""
    za = _np(z)
    args = (za, _np(dz), _np(x), _np(p), _np(q), act, _scalar(slope, za), mode)
    if z.dim() == 3:
        return torch.from_numpy(_backward_reduce_ncs(*args))
    return torch.from_numpy(_backward_reduce_mc(*args, _chunks(z.shape[0])))


def backward_input(z, dz, x, p, q, coef, act, slope, mode, out):
    """``out = dy * coef[0] + v * coef[1] + coef[2]`` per channel."""
    kernel = _backward_input_ncs if z.dim() == 3 else _backward_input_mc
    za = _np(z)
    kernel(za, _np(dz), _np(x), _np(p), _np(q), _np(coef), act, _scalar(slope, za), mode, _np(out))
