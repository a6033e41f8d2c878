"""Modules ``ABN``, ``InPlaceABN`` and ``InPlaceABNSync``: batch normalization fused with an
activation, drop-in replacements for ``nn.BatchNorm2d`` + activation.

They take ``(N, C, *)`` inputs of any rank >= 2, the ``nn.BatchNorm2d`` arguments (``eps``,
``momentum`` including ``None`` for a cumulative average, ``affine``, ``track_running_stats``)
and have its state-dict keys (``weight``, ``bias``, ``running_mean``, ``running_var``,
``num_batches_tracked``), so a BN checkpoint loads into them. See :mod:`layers.functional` for
the scale parametrization (``scale_mode``) and the two backward variants.
"""
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from . import functional


def batch_norm_arguments(module):
    """``(training, running_mean, running_var, momentum)`` for one forward of ``module``.

    ``module`` is any ``nn.BatchNorm*``-like module (``ABN`` and its subclasses included). As
    ``nn.BatchNorm2d.forward`` does, this counts the batch in ``num_batches_tracked`` and turns
    ``momentum=None`` into the cumulative-average factor ``1 / num_batches_tracked``.
    """
    factor = 0.0 if module.momentum is None else module.momentum
    if module.training and module.track_running_stats and module.num_batches_tracked is not None:
        module.num_batches_tracked.add_(1)
        if module.momentum is None:
            factor = 1.0 / float(module.num_batches_tracked)
    training = module.training or (module.running_mean is None and module.running_var is None)
    keep = not module.training or module.track_running_stats
    running_mean = module.running_mean if keep else None
    running_var = module.running_var if keep else None
    return training, running_mean, running_var, factor


class ABN(_BatchNorm):
    """Batch normalization followed by an activation, out of place.

    ``activation`` is ``leaky_relu`` (default; ``activation_param`` is the slope, default
    0.01), ``elu`` (``activation_param`` is alpha, default 1), ``identity`` or ``relu``.
    Saves its input and output for backward,
    as standard BN + activation does.
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

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected an (N, C, *) input, got shape {tuple(input.shape)}")

    def _common_arguments(self, input):
        self._check_input_dim(input)
        training, running_mean, running_var, momentum = batch_norm_arguments(self)
        return dict(input=input, weight=self.weight, bias=self.bias, running_mean=running_mean,
                    running_var=running_var, training=training, momentum=momentum,
                    eps=self.eps, activation=self.activation,
                    activation_param=self.activation_param, scale_mode=self.scale_mode)

    def forward(self, input):
        return functional.abn(**self._common_arguments(input))

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
    (use ``.clone()``): both would lose data that backward needs, and are refused.
    """

    inplace = True

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, activation="leaky_relu", activation_param=None,
                 scale_mode="abs", variant="II", device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, activation,
                         activation_param, scale_mode, device, dtype)
        functional.check_choice("variant", variant, functional.VARIANTS)
        self.variant = variant

    def _group(self):
        """The process group to synchronise over; ``None`` (no synchronisation) here."""
        return None

    def forward(self, input):
        return functional.inplace_abn(**self._common_arguments(input), variant=self.variant,
                                      group=self._group())

    def extra_repr(self):
        return f"{super().extra_repr()}, variant={self.variant}"


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
        if not (dist.is_available() and dist.is_initialized()):
            return None
        return dist.group.WORLD if self.group is None else self.group
