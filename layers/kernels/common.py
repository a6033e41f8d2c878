"""Codes and per-element math shared by the CPU and the CUDA kernels.

The scalar functions here are plain Python: ``cpu.py`` compiles them with ``numba.njit`` and
``cuda.py`` with ``numba.cuda.jit(device=True)``, so both backends run literally the same
arithmetic.

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
ACT_LEAKY_RELU = 1
ACT_ELU = 2
ACT_RELU = 3

MODE_Y = 0
MODE_XHAT_FROM_Y = 1
MODE_XHAT_FROM_X = 2

#: ``y`` assigned to ELU outputs that sit exactly at the saturation ``z = -alpha``, where
#: ``exp(y)`` fell below float32's resolution and ``y`` cannot be recovered: ``log(2**-24)``,
#: the largest ``y`` whose ``exp`` rounds away in float32.
ELU_SATURATED_Y = math.log(2.0 ** -24)


def act_forward(y, act, slope):
    """``z = act(y)``; ``slope`` is the leaky-ReLU slope or the ELU ``alpha``."""
    if act == ACT_IDENTITY or y >= 0:
        return y
    if act == ACT_LEAKY_RELU:
        return y * slope
    if act == ACT_ELU:
        return slope * math.expm1(y)
    return y * 0  # ACT_RELU, keeps the dtype of y


def act_inverse(z, act, slope):
    """``y = act^-1(z)`` for the invertible activations (identity, leaky ReLU, ELU)."""
    if act == ACT_IDENTITY or z >= 0:
        return z
    if act == ACT_LEAKY_RELU:
        return z / slope
    t = z / slope  # ELU
    if t <= -1:
        return ELU_SATURATED_Y + z * 0
    return math.log1p(t)


def act_grad(z, dz, act, slope):
    """``dL/dy`` from the output ``z`` and ``dL/dz``, i.e. ``dz * act'(y)`` written in ``z``.

    At ``z == 0`` the negative branch is taken, as PyTorch's own activation backwards do.
    """
    if act == ACT_IDENTITY or z > 0:
        return dz
    if act == ACT_LEAKY_RELU:
        return dz * slope
    if act == ACT_ELU:
        return dz * (z + slope)
    return dz * 0  # ACT_RELU at z <= 0
