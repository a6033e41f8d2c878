"""Backend operations written with a backend's own primitives (shared by cpu.py and cuda.py)."""
import torch

from .codecs import compute_dtype


def compose_moments_forward(kernels, x, out, gamma, beta, eps, act, slope, **forward_options):
    """``moments_forward`` as ``kernels.moments`` followed by ``kernels.forward``.

    Returns the ``(2, C)`` float64 ``[mean, M2]`` and writes
    ``out = act(gamma * (x - mean) / sqrt(M2 / count + eps) + beta)``. ``forward_options`` go
    to ``kernels.forward`` (the CUDA backend's ``skip``).
    """
    moments = kernels.moments(x)
    count = x.numel() // x.shape[1 if x.dim() == 3 else -1]
    scale = gamma * torch.rsqrt(moments[1] / count + eps)
    shift = beta - moments[0] * scale
    compute = compute_dtype(x.dtype)
    kernels.forward(x, out, scale.to(compute), shift.to(compute), act, slope, **forward_options)
    return moments
