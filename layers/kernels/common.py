"""Codes and per-element math shared by the CPU and the CUDA kernels.

The scalar functions here are plain Python: ``cpu.py`` compiles them with ``numba.njit`` and
``cuda.py`` with ``numba.cuda.jit(device=True)``, so both backends run literally the same
arithmetic. Their on-disk caches are keyed on this file too (:mod:`layers.kernels.caching`):
editing it recompiles both on the next use.

Canonical views
---------------
Every kernel works on one of two C-contiguous views of an ``(N, C, *)`` tensor, told apart by
their number of dimensions:

* ``(N, C, S)`` (3-D): the contiguous ``NCHW``-like layout, ``S`` = product of spatial sizes;
* ``(M, C)`` (2-D): the channels-last layout, ``M = N * S`` rows of ``C`` channels.

Backward modes
--------------
The backward kernels need, per element, a value ``v`` that the per-channel gradient
``sum(dy * v)`` is taken against:

* ``MODE_Y`` (InPlace-ABN II, Fig. 2(e)): ``v = y = act^-1(z)``;
* ``MODE_XHAT_FROM_Y`` (InPlace-ABN I, Fig. 2(d)): ``v = x_hat = y * p + q`` with
  ``p = 1 / scale``, ``q = -bias / scale``;
* ``MODE_XHAT_FROM_X`` (ABN, the stored input): ``v = x_hat = x * p + q`` with ``p = rstd``,
  ``q = -mean * rstd``.
"""
import math

ACT_IDENTITY = 0
ACT_LEAKY_RELU = 1  # ReLU is leaky ReLU with slope 0 (not invertible: never in MODE_Y*)
ACT_ELU = 2

MODE_Y = 0
MODE_XHAT_FROM_Y = 1
MODE_XHAT_FROM_X = 2


def elu_saturated_y(epsneg):
    """``y`` assigned to ELU outputs at the saturation ``z = -alpha``, for data whose gap below
    1 is ``epsneg`` (see :func:`layers.kernels.codecs.epsneg`).

    There ``1 + z / alpha`` rounded to zero and ``y`` cannot be recovered: it lies below
    ``log(epsneg)`` (about -16.6 in float32, -36.7 in float64, -7.6 in float16, -5.5 in
    bfloat16: the precision ``z`` is stored in is what matters), the value used. Such
    elements have ``dL/dy = 0``, so the gradients stay finite.
    """
    return math.log(epsneg)


# The functions below are type-stable: every branch returns the type of its arguments (a
# float32 kernel computes in float32, and so do 16-bit kernels, see ``codecs``), so they take
# no float literal; ``slope`` and ``floor`` come as scalars of the compute dtype. The
# activation is tested first and the sign in a conditional expression, which LLVM turns into a
# branch-free select inside the kernels' loops.

def act_forward(y, act, slope):
    """``z = act(y)``; ``slope`` is the leaky-ReLU slope or the ELU ``alpha``."""
    if act == ACT_IDENTITY:
        return y
    if act == ACT_LEAKY_RELU:
        return y if y >= 0 else y * slope
    return y if y >= 0 else slope * math.expm1(y)


def act_inverse(z, act, slope, floor):
    """``y = act^-1(z)`` for the invertible activations; ``floor``: see ``elu_saturated_y``.

    ``z > 0`` is the same test as in ``act_grad`` (both branches give 0 at ``z == 0``), so a
    loop that needs both evaluates it once.
    """
    if act == ACT_IDENTITY:
        return z
    if act == ACT_LEAKY_RELU:
        return z if z > 0 else z / slope
    t = z / slope
    if z > 0:
        return z
    return math.log1p(t) if t > -1 else floor


def act_grad(z, dz, act, slope):
    """``dL/dy`` from the output ``z`` and ``dL/dz``, i.e. ``dz * act'(y)`` written in ``z``.

    At ``z == 0`` the negative branch is taken, as PyTorch's own activation backwards do.
    """
    if act == ACT_IDENTITY:
        return dz
    if act == ACT_LEAKY_RELU:
        return dz if z > 0 else dz * slope
    return dz if z > 0 else dz * (z + slope)
