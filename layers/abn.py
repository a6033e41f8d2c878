"""Modules ``ABN``, ``InPlaceABN``, ``ABNSync`` and ``InPlaceABNSync``: batch normalization fused
with an activation, drop-in replacements for ``nn.BatchNorm2d`` + activation.

They take ``(N, C, *)`` inputs of any rank >= 2, the ``nn.BatchNorm2d`` arguments (``eps``,
``momentum`` including ``None`` for a cumulative average, ``affine``, ``track_running_stats``)
and have its parameters, buffers and state-dict keys (``weight``, ``bias``, ``running_mean``,
``running_var``, ``num_batches_tracked``), so a BN checkpoint loads into them. See
:mod:`layers.functional` for the scale parametrization (``scale_mode``) and the two backward
variants.

They are plain ``nn.Module``s (:class:`NormBase`), not subclasses of torch's ``_BatchNorm``:
PyTorch utilities that walk a model for ``_BatchNorm`` modules and rebuild them
(``nn.SyncBatchNorm.convert_sync_batchnorm``, BN folding, ``torch.func``'s
``replace_all_batch_norm_modules_``) would otherwise replace them by a plain BatchNorm and
silently drop the activation, the ``|weight| + eps`` scale and the in-place computation. Code
that selects normalization layers by type (weight-decay exclusion, custom initialization) should
test ``isinstance(module, layers.NORM_TYPES)``; :func:`layers.convert_sync_batchnorm` is the
converter to synchronised layers.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from . import functional


def registered(module, members, name):
    """``module.<name>``, read from ``members`` (the module's ``_parameters`` or ``_buffers``)
    where it is registered there, else as an attribute (a parametrization, for one, turns a
    parameter into a property).

    A normalization layer reads six of them per forward, and an attribute lookup of a parameter
    or buffer goes through ``nn.Module.__getattr__``, several times slower than a dictionary
    lookup: on small tensors that adds up to a visible part of a step."""
    return members[name] if name in members else getattr(module, name)


def batch_norm_arguments(module, count=True):
    """``(training, running_mean, running_var, momentum)`` for one forward of ``module``.

    ``module`` is any ``nn.BatchNorm*``-like module (:class:`NormBase` included). As
    ``nn.BatchNorm2d.forward`` does, this counts the batch in ``num_batches_tracked`` and turns
    ``momentum=None`` into the cumulative-average factor ``1 / num_batches_tracked``. With
    ``count=False`` the batch is not counted yet (the factor is that of the count after it):
    the caller counts it with :func:`count_batch` once the forward is accepted, so that a
    refused forward leaves ``num_batches_tracked`` as it was.
    """
    buffers = module._buffers
    running_mean = registered(module, buffers, "running_mean")
    running_var = registered(module, buffers, "running_var")
    factor = 0.0 if module.momentum is None else module.momentum
    tracked = _tracked_count(module)
    if tracked is not None:
        if count:
            tracked.add_(1)
        if module.momentum is None:
            factor = 1.0 / (float(tracked) + (0 if count else 1))
    training = module.training or (running_mean is None and running_var is None)
    if module.training and not module.track_running_stats:
        running_mean = running_var = None
    return training, running_mean, running_var, factor


def _tracked_count(module):
    """``module``'s ``num_batches_tracked`` where this forward counts a batch, else ``None``."""
    if not (module.training and module.track_running_stats):
        return None
    return registered(module, module._buffers, "num_batches_tracked")


def count_batch(module, accepted=None):
    """Count one batch in ``module``'s ``num_batches_tracked`` where a training forward counts
    it (the second half of :func:`batch_norm_arguments` with ``count=False``).

    ``accepted``: ``None`` (the forward was accepted), or a 0-d bool tensor that is ``True``
    where it is, from a check that runs on the device or in a compiled graph: the count adds
    it, so that a refusal leaves the count as it was whenever the write runs."""
    tracked = _tracked_count(module)
    if tracked is not None:
        tracked.add_(1 if accepted is None else accepted)


class NormBase(nn.Module):
    """The parameters, buffers and state-dict conventions of ``nn.BatchNorm2d``, in a module
    that is not a ``torch.nn.modules.batchnorm._BatchNorm``.

    Mirrors torch's ``_NormBase``: ``weight`` (ones) and ``bias`` (zeros) when ``affine``;
    ``running_mean`` (zeros), ``running_var`` (ones) and ``num_batches_tracked`` (a long
    scalar) when ``track_running_stats``, else these attributes are ``None``; the same
    state-dict keys and version (2), so that a checkpoint without ``num_batches_tracked``
    (saved before PyTorch 0.4.1, or torchvision's released DenseNets) loads with it set to 0,
    as into ``nn.BatchNorm2d``; ``reset_running_stats``, ``reset_parameters``.
    """

    _version = 2
    __constants__ = ["track_running_stats", "momentum", "eps", "num_features", "affine"]

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__()
        if isinstance(num_features, bool) or not isinstance(num_features, int) \
                or num_features < 1:
            raise ValueError(f"num_features={num_features!r} must be an integer >= 1")
        options = {"device": device, "dtype": dtype}
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = nn.Parameter(torch.empty(num_features, **options))
            self.bias = nn.Parameter(torch.empty(num_features, **options))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features, **options))
            self.register_buffer("running_var", torch.ones(num_features, **options))
            self.register_buffer("num_batches_tracked",
                                 torch.tensor(0, dtype=torch.long, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self):
        """Running mean 0, running variance 1, no batch counted (as ``nn.BatchNorm2d``)."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self):
        """The running statistics reset, weight 1 and bias 0 (as ``nn.BatchNorm2d``)."""
        self.reset_running_stats()
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected an (N, C, *) input, got shape {tuple(input.shape)}")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # As torch's _NormBase: num_batches_tracked appeared in version 2 of the BN state
        # dict; an older checkpoint (no version, or < 2) without it loads with a count of 0
        # (or the current count, as PyTorch does, when the buffer is materialised).
        version = local_metadata.get("version", None)
        if (version is None or version < 2) and self.track_running_stats:
            key = prefix + "num_batches_tracked"
            if key not in state_dict:
                count = self.num_batches_tracked
                state_dict[key] = (count if count is not None
                                   and count.device != torch.device("meta")
                                   else torch.tensor(0, dtype=torch.long))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class ABN(NormBase):
    """Batch normalization followed by an activation, out of place.

    ``activation`` is ``leaky_relu`` (default; ``activation_param`` is the slope, default
    0.01), ``elu`` (``activation_param`` is alpha, default 1), ``identity`` or ``relu``.
    Saves its input and output for backward, as standard BN + activation does.
    """

    inplace = False

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, activation="leaky_relu", activation_param=None,
                 scale_mode="abs", device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        _, param = functional.check_activation(activation, activation_param, self.inplace)
        functional.check_choice("scale_mode", scale_mode, functional.SCALE_MODES)
        self.activation = activation
        self.activation_param = param
        self.scale_mode = scale_mode

    def _group(self):
        """The process group to synchronise over; ``None`` (no synchronisation) here."""
        return None

    def _common_arguments(self, input):
        """The positional arguments of :func:`functional.abn` (and the first of
        :func:`functional.inplace_abn`) for one forward on ``input``. The batch is not counted
        here but by :meth:`_count_batch`, once the functional has accepted the call."""
        self._check_input_dim(input)
        training, running_mean, running_var, momentum = batch_norm_arguments(self, count=False)
        parameters = self._parameters
        return (input, registered(self, parameters, "weight"),
                registered(self, parameters, "bias"), running_mean,
                running_var, training, momentum, self.eps, self.activation,
                self.activation_param, self.scale_mode, self._group())

    def forward(self, input):
        if exporting():
            return self.inference_forward(input)
        return self._kernel_forward(input)

    @torch.jit.unused
    def _kernel_forward(self, input):
        return functional.abn(*self._common_arguments(input), on_accept=self._count_batch)

    def _count_batch(self, accepted):
        """Count this forward's batch, once :mod:`layers.functional` has accepted it
        (``accepted`` as in :func:`count_batch`)."""
        count_batch(self, accepted)

    def inference_forward(self, input):
        """The eval-mode layer in standard PyTorch ops: ``act(scale * x_hat + bias)`` with the
        running statistics (paper §3.1: at inference BN + activation is a per-channel scale, a
        shift and an activation).

        What ``torch.jit.script``, ``torch.jit.trace`` and ``torch.onnx.export`` record, so the
        exported model runs without this package (the numba kernels are neither scriptable nor
        exportable). Equal to the layer's own eval forward up to rounding; not in place.
        """
        if self.training or self.running_mean is None or self.running_var is None:
            raise RuntimeError(
                "scripting, tracing and ONNX export of ABN layers need eval mode with running "
                "statistics: call model.eval() first (training runs on the numba kernels only)")
        weight = self.weight
        if weight is not None and self.scale_mode == "abs":
            weight = weight.abs() + self.eps
        y = F.batch_norm(input, self.running_mean, self.running_var, weight, self.bias,
                         False, 0.0, self.eps)
        if self.activation == "leaky_relu":
            return F.leaky_relu(y, self.activation_param)
        if self.activation == "elu":
            return F.elu(y, self.activation_param)
        if self.activation == "relu":
            return F.relu(y)
        return y

    def extra_repr(self):
        return (f"{super().extra_repr()}, activation={self.activation}, "
                f"activation_param={self.activation_param}, scale_mode={self.scale_mode}")


class InPlaceABN(ABN):
    """In-Place Activated Batch Normalization (Rota Bulò et al., 2018).

    Writes its output into the input's storage and returns it; saves only that output and
    per-channel vectors for backward. ``activation`` must be invertible: ``leaky_relu`` with a
    positive slope (default 0.01), ``elu`` or ``identity``. ``variant`` picks the backward pass:
    ``"I"`` recovers ``x_hat`` from the output (Fig. 2(d)), ``"II"`` writes the gradients in
    terms of ``y`` (Fig. 2(e)).

    The input must not be a leaf that requires grad nor the output of another in-place layer
    (use ``.clone()``): both would lose data that backward needs, and are refused. With
    ``scale_mode="bn"`` a differentiable forward where some ``|weight| < eps`` is refused too,
    leaving the input as it was: at once on the CPU, at the latest in backward on the CUDA
    kernels, which check on the device (:func:`layers.functional.check_pending`).
    """

    inplace = True

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, activation="leaky_relu", activation_param=None,
                 scale_mode="abs", variant="II", device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, activation,
                         activation_param, scale_mode, device, dtype)
        functional.check_choice("variant", variant, functional.VARIANTS)
        self.variant = variant

    @torch.jit.unused
    def _kernel_forward(self, input):
        *arguments, group = self._common_arguments(input)
        return functional.inplace_abn(*arguments, self.variant, group,
                                      on_accept=self._count_batch)

    def extra_repr(self):
        return f"{super().extra_repr()}, variant={self.variant}"


def exporting():
    """Whether the forward is being captured as a graph of standard ops: scripted or traced
    (``torch.jit``), exported (``torch.onnx.export``, ``torch.export``) or symbolically traced
    (``torch.fx``, as :func:`layers.fuse_abn` does). The layers then record standard PyTorch
    ops (``inference_forward``), and the DenseNets their plain concatenation.

    ``torch.onnx.export`` is covered by the tracing and export tests: its default exporter
    runs ``torch.export`` (``is_exporting()``), the TorchScript one traces (``is_tracing()``),
    as ``tests/test_export.py`` checks for both exporters. ``torch.onnx.is_in_onnx_export()``
    is not asked: it imports two modules on every call, more than the other checks together
    cost (the function runs in every layer's forward)."""
    if torch.jit.is_scripting():
        return True
    return (torch.jit.is_tracing() or torch.compiler.is_exporting()
            or torch.fx._symbolic_trace.is_fx_symbolic_tracing())


def _sync_group(group):
    """The group a synchronised layer reduces over now: ``None`` without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.group.WORLD if group is None else group


class ABNSync(ABN):
    """:class:`ABN` (out of place, any activation) with statistics synchronised across the
    ranks of a process group, as :class:`InPlaceABNSync` does in place.

    For the places where a layer must not overwrite its input (a DenseNet's concatenated
    features, a block input that a shortcut still reads) and for ``relu``. ``group``: the
    process group (default: the world); without an initialised process group it behaves as
    :class:`ABN`.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, activation="leaky_relu", activation_param=None,
                 scale_mode="abs", group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, activation,
                         activation_param, scale_mode, device, dtype)
        self.group = group

    def _group(self):
        return _sync_group(self.group)


class InPlaceABNSync(InPlaceABN):
    """InPlace-ABN with statistics synchronised across the ranks of a process group.

    In training, the batch statistics and the two backward reductions are combined over
    ``group`` (default: the world), weighted by each rank's element count, so the result equals
    one process on the concatenated batch. Works with gloo (CPU) and NCCL (GPU); without an
    initialised process group it behaves as :class:`InPlaceABN`.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, activation="leaky_relu", activation_param=None,
                 scale_mode="abs", variant="II", group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, activation,
                         activation_param, scale_mode, variant, device, dtype)
        self.group = group

    def _group(self):
        return _sync_group(self.group)


#: Module types that hold batch-normalization parameters and statistics: torch's
#: ``BatchNorm1d/2d/3d`` and ``SyncBatchNorm`` (``_BatchNorm``) and every normalization of this
#: package (:class:`NormBase`: the ABN layers and ``layers.residual.BatchNormAct2d``). Use
#: ``isinstance(module, NORM_TYPES)`` where code selected norms with ``_BatchNorm``, e.g. to
#: exclude their parameters from weight decay.
NORM_TYPES = (_BatchNorm, NormBase)

__all__ = ["NormBase", "ABN", "InPlaceABN", "ABNSync", "InPlaceABNSync", "NORM_TYPES",
           "batch_norm_arguments", "count_batch", "exporting"]
