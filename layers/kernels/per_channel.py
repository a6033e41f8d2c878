"""The per-channel arithmetic of a BN + activation layer, written once for two uses.

Around the element-wise kernels a layer computes a few values per channel: the scale from the
weight, the batch's ``rstd``, the running averages, and in backward the coefficients of the
input gradient and the scale's gradient. Each function here takes one channel's values and
uses only arithmetic, comparisons, ``abs`` and ``** 0.5``, so that it works unchanged

* on torch tensors of ``C`` channels, element-wise (:mod:`layers.functional` on the CUDA
  kernels, fake tensors, under ``torch.compile``): a few dozen small torch operators;
* on Python floats inside the loops of ``cpu.py`` over the channels (``numba.njit``, the CPU
  kernels run eagerly): one compiled call for all of them, where the same torch operators cost
  more than the kernels on small tensors.

``abs_mode`` and ``variant_y`` are Python booleans (compile-time branches for numba).
"""


def scale(weight, eps, abs_mode):
    """``gamma``: ``|weight| + eps`` with ``abs_mode`` (always invertible), else ``weight``."""
    return abs(weight) + eps if abs_mode else weight


def scale_derivative(weight, abs_mode):
    """``d gamma / d weight``: ``sign(weight)`` (0 at 0) with ``abs_mode``, else 1."""
    if abs_mode:
        return (weight > 0) * 1.0 - (weight < 0) * 1.0
    return weight * 0.0 + 1.0


def scale_shift(gamma, beta, mean, rstd):
    """``(a, b)`` with ``x * a + b = gamma * (x - mean) * rstd + beta``: the normalization and
    affine step as one scale and shift."""
    a = gamma * rstd
    return a, beta - mean * a


def value_coefficients(gamma, beta, mean, rstd, from_x):
    """``(p, q)`` of the backward's value ``v = u * p + q`` (:mod:`.common`): ``x_hat`` from the
    stored input ``u = x`` (``from_x``: ``p = rstd``, ``q = -mean * rstd``), else from
    ``u = y`` (``p = 1 / gamma``, ``q = -beta / gamma``; used by InPlace-ABN I only)."""
    if from_x:
        return rstd, -mean * rstd
    return 1.0 / gamma, -beta / gamma


def batch_rstd(m2, count, eps):
    """``1 / sqrt(var + eps)`` of the biased batch variance ``m2 / count``."""
    return 1.0 / (m2 / count + eps) ** 0.5


def running_average(running, batch, momentum):
    """A running statistic after one batch, as ``nn.BatchNorm2d`` updates it."""
    return running * (1.0 - momentum) + batch * momentum


def unbiased_variance(m2, count):
    """The batch variance the running variance averages (``count - 1`` in the denominator)."""
    return m2 / max(count - 1, 1)


def scale_gradient(gamma, beta, sum_dy, sum_dy_v, variant_y):
    """``dL/dgamma`` from the backward sums ``sum dy`` and ``sum dy * v``: ``v`` is ``y`` with
    ``variant_y`` (InPlace-ABN II: ``y = gamma x_hat + beta``), else ``x_hat``."""
    return (sum_dy_v - beta * sum_dy) / gamma if variant_y else sum_dy_v


def input_gradient_coefficients(gamma, beta, rstd, count, sum_dy, sum_dy_v, variant_y):
    """``(k0, k1, k2)`` of ``dx = dy * k0 + v * k1 + k2`` in training (batch statistics).

    The sums are over the whole batch (all ranks). In eval the running statistics do not
    depend on ``x``: then ``k0 = gamma * rstd`` and ``k1 = k2 = 0``.
    """
    k0 = gamma * rstd
    if variant_y:
        # dx = [dy - dgamma * y / (gamma m) - (dbeta - beta / gamma * dgamma) / m] gamma rstd.
        # (§3.3 prints "+ beta / gamma"; substituting x_hat = (y - beta) / gamma into the
        # variant-I formula gives "-", which the float64 tests against autograd confirm.)
        dgamma = (sum_dy_v - beta * sum_dy) / gamma  # scale_gradient (numba compiles each
        # function alone: one may not call another)
        return k0, -dgamma * rstd / count, -(sum_dy - beta / gamma * dgamma) / count * k0
    return k0, -sum_dy_v / count * k0, -sum_dy / count * k0
