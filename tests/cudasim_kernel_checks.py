"""Checks ``layers.kernels.cuda`` under numba's CUDA simulator against naive torch references.

Run by ``tests/test_cuda_kernels.py`` in a subprocess, because the simulator must be chosen
(``NUMBA_ENABLE_CUDASIM=1``) before ``numba.cuda`` is first imported::

    NUMBA_ENABLE_CUDASIM=1 python tests/cudasim_kernel_checks.py 3d float32

checks one layout (``3d``: ``(N, C, S)``, ``2d``: ``(M, C)``) and dtype, prints every mismatch
and exits with status 1 if there was any. The references below are written from the paper's
definitions with torch ops in float64; they share nothing with ``layers.kernels``.
"""
import os
import sys

import torch

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    sys.exit("run with NUMBA_ENABLE_CUDASIM=1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from layers.kernels import common  # noqa: E402
from layers.kernels import cuda as kernels  # noqa: E402

#: ``(act, slope)`` of every invertible activation, and ReLU, only usable with the stored input.
INVERTIBLE = [(common.ACT_IDENTITY, 0.0), (common.ACT_LEAKY_RELU, 0.01),
              (common.ACT_LEAKY_RELU, 0.2), (common.ACT_ELU, 1.0)]
RELU = (common.ACT_LEAKY_RELU, 0.0)  # ReLU: leaky ReLU of slope 0
MODES = [common.MODE_Y, common.MODE_XHAT_FROM_Y, common.MODE_XHAT_FROM_X]
BACKWARD_CASES = ([(act, slope, mode) for act, slope in INVERTIBLE for mode in MODES]
                  + [(*RELU, common.MODE_XHAT_FROM_X)])

#: Tiny shapes for the full activation x mode sweep, and shapes that exercise the kernels'
#: walking and tiling paths: several chunks with ``S`` not dividing a block's step of
#: ``cuda._THREADS`` threads (64 under the simulator, 256 on a GPU: both), ``S == 1``, several
#: chunks with ``S`` above the step; several row chunks, 2 channel tiles (the simulator runs
#: ~0.05 s a block).
SMALL = {"3d": (2, 3, 5), "2d": (7, 3)}
GEOMETRY = {"3d": [(14, 1, 77), (300, 1, 1), (2, 1, 700)], "2d": [(40, 3), (9, 40)]}

failures = []


def check(name, got, want, dtype, exact_input=False):
    """Records a failure unless ``got`` matches the float64 reference ``want``.

    The tolerance is relative to the largest ``|want|``: float32 rounding of the per-element
    math, unless ``exact_input`` (float64 math on exactly representable inputs: moments).
    """
    rtol = 1e-5 if dtype == torch.float32 and not exact_input else 1e-11
    got, want = got.double(), want.double()
    if not torch.allclose(got, want, rtol=rtol, atol=rtol * max(1.0, want.abs().max().item())):
        failures.append(f"{name}: max |diff| {(got - want).abs().max().item():.3e}\n"
                        f"  got  {got.flatten()[:8].tolist()}\n"
                        f"  want {want.flatten()[:8].tolist()}")


def per_channel(t, like):
    """Broadcasts a ``(C,)`` tensor against a canonical view ``like``."""
    return t.view(1, -1, 1) if like.dim() == 3 else t.view(1, -1)


def channel_sum(t):
    return t.sum(dim=(0, 2) if t.dim() == 3 else 0)


def act_ref(y, act, slope):
    if act == common.ACT_IDENTITY:
        return y
    if act == common.ACT_LEAKY_RELU:
        return torch.where(y >= 0, y, y * slope)
    return torch.where(y >= 0, y, slope * torch.expm1(y))  # ELU


def inverse_ref(z, act, slope):
    if act == common.ACT_IDENTITY:
        return z
    if act == common.ACT_LEAKY_RELU:
        return torch.where(z >= 0, z, z / slope)
    return torch.where(z >= 0, z, torch.log1p(z / slope))  # ELU


def grad_ref(z, dz, act, slope):
    """``dL/dy``; the negative branch at ``z == 0``, as PyTorch's activation backwards."""
    if act == common.ACT_IDENTITY:
        return dz
    if act == common.ACT_LEAKY_RELU:
        return torch.where(z > 0, dz, dz * slope)
    return torch.where(z > 0, dz, dz * (z + slope))  # ELU


def dy_v_ref(z, dz, x, p, q, act, slope, mode):
    z, dz, x, p, q = (t.double() for t in (z, dz, x, p, q))
    dy = grad_ref(z, dz, act, slope)
    if mode == common.MODE_XHAT_FROM_X:
        return dy, x * per_channel(p, x) + per_channel(q, x)
    y = inverse_ref(z, act, slope)
    return dy, y if mode == common.MODE_Y else y * per_channel(p, y) + per_channel(q, y)


def backward_inputs(shape, dtype, act, slope, gen):
    """``z = act(y)`` (so that it lies in the activation's range, with one exact zero), ``dz``,
    ``x``, ``p``, ``q`` and ``coef``."""
    y = torch.randn(shape, generator=gen, dtype=torch.float64) * 2
    y.view(-1)[0] = 0.0
    z = act_ref(y, act, slope).to(dtype)
    channels = shape[1]
    dz, x = (torch.randn(shape, generator=gen, dtype=dtype) for _ in range(2))
    p, q = (torch.randn(channels, generator=gen, dtype=dtype) for _ in range(2))
    coef = torch.randn(3, channels, generator=gen, dtype=dtype)
    return z, dz, x, p, q, coef


def check_moments(shape, dtype, gen, mean=0.0):
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + mean).to(dtype)
    var, mu = torch.var_mean(x.double(), dim=(0, 2) if x.dim() == 3 else 0, correction=0)
    got = kernels.moments(x)
    tag = f"moments {tuple(shape)} {dtype} mean={mean}"
    check(tag + " mean", got[0], mu, dtype, exact_input=True)
    check(tag + " M2", got[1], var * (x.numel() // shape[1]), dtype, exact_input=True)
    if got.dtype != torch.float64 or got.shape != (2, shape[1]):
        failures.append(f"{tag}: result {got.dtype} {tuple(got.shape)}, want float64 (2, C)")


def check_forward(shape, dtype, act, slope, gen, in_place=False):
    x = torch.randn(shape, generator=gen, dtype=dtype) * 2
    a, b = (torch.randn(shape[1], generator=gen, dtype=dtype) for _ in range(2))
    want = act_ref(x.double() * per_channel(a, x).double() + per_channel(b, x).double(), act, slope)
    out = x if in_place else torch.empty_like(x)
    kernels.forward(x, out, a, b, act, slope)
    check(f"forward {tuple(shape)} {dtype} act={act} slope={slope} in_place={in_place}", out, want,
          dtype)


def check_skip(shape, dtype, gen):
    """``skip``: a set flag makes ``forward`` and ``moments_forward`` write nothing (the moments
    are still returned); a clear one changes nothing."""
    x = torch.randn(shape, generator=gen, dtype=dtype) * 2 + 1
    a, b = (torch.randn(shape[1], generator=gen, dtype=dtype) for _ in range(2))
    gamma, beta = a.double(), b.double()
    tag = f"{tuple(shape)} {dtype}"
    for flag in (True, False):
        out = torch.full_like(x, 7.0)
        kernels.forward(x, out, a, b, common.ACT_ELU, 1.0, skip=torch.tensor([flag]))
        want = torch.full_like(x, 7.0) if flag else torch.empty_like(x)
        if not flag:
            kernels.forward(x, want, a, b, common.ACT_ELU, 1.0)
        if not torch.equal(out, want):
            failures.append(f"forward skip={flag} {tag}: output differs")
        inplace = x.clone()
        got = kernels.moments_forward(inplace, inplace, gamma, beta, 1e-5, common.ACT_LEAKY_RELU,
                                      0.1, skip=torch.tensor([flag]))
        check(f"moments_forward skip={flag} {tag} moments", got, kernels.moments(x), dtype,
              exact_input=True)
        if flag != torch.equal(inplace, x):
            failures.append(f"moments_forward skip={flag} {tag}: input "
                            + ("written" if flag else "not written"))


def check_backward(shape, dtype, act, slope, mode, gen):
    z, dz, x, p, q, coef = backward_inputs(shape, dtype, act, slope, gen)
    if mode != common.MODE_XHAT_FROM_X:
        x = z  # the callers' convention: x is only read with the stored input
    dy, v = dy_v_ref(z, dz, x, p, q, act, slope, mode)
    tag = f"{tuple(shape)} {dtype} act={act} slope={slope} mode={mode}"
    sums = kernels.backward_reduce(z, dz, x, p, q, act, slope, mode)
    check("backward_reduce " + tag, sums, torch.stack([channel_sum(dy), channel_sum(dy * v)]),
          dtype)
    out = torch.empty_like(z)
    kernels.backward_input(z, dz, x, p, q, coef, act, slope, mode, out)
    c0, c1, c2 = (per_channel(row, z).double() for row in coef)
    check("backward_input " + tag, out, dy * c0 + v * c1 + c2, dtype)


def main(layout, dtype_name):
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    small = SMALL[layout]
    check_moments(small, dtype, gen)
    for act, slope in INVERTIBLE + [RELU]:
        check_forward(small, dtype, act, slope, gen)
    check_forward(small, dtype, common.ACT_LEAKY_RELU, 0.2, gen, in_place=True)
    check_skip(small, dtype, gen)
    for act, slope, mode in BACKWARD_CASES:
        check_backward(small, dtype, act, slope, mode, gen)
    for shape in GEOMETRY[layout]:
        check_moments(shape, dtype, gen)
        check_forward(shape, dtype, common.ACT_ELU, 1.0, gen)
        check_backward(shape, dtype, common.ACT_LEAKY_RELU, 0.2, common.MODE_XHAT_FROM_Y, gen)
    if dtype == torch.float32:  # mean 1e4, std 3: a naive float32 sum(x^2) - n mean^2 fails
        check_moments(GEOMETRY[layout][0], dtype, gen, mean=1e4)
    print("\n".join(failures) or f"{layout} {dtype_name}: all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
