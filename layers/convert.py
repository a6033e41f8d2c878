"""Converting a model's normalization layers to synchronised ones for multi-process training.

``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` converts torch's ``BatchNorm*`` layers only:
the layers of this package are not ``_BatchNorm`` subclasses, so it leaves them untouched (it
used to replace them by a plain ``SyncBatchNorm``, dropping their activation). Their converter
is :func:`convert_sync_batchnorm` here; a model with both kinds calls this one, then torch's.
"""
import torch
import torch.nn as nn

from .abn import ABN, ABNSync, InPlaceABN, InPlaceABNSync

#: torch's batch norms that ``convert_batchnorm=True`` may fuse with a following activation;
#: exact types: a subclass may compute something else.
BATCHNORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
#: Modules whose output a following in-place layer may overwrite: they create a new tensor
#: that their own backward does not read (a convolution's backward reads its input).
FRESH_OUTPUT_TYPES = (nn.modules.conv._ConvNd, nn.Linear)


def convert_sync_batchnorm(module, group=None, convert_batchnorm=False):
    """``module`` with every ABN layer of this package synchronised over ``group``.

    * :class:`~layers.InPlaceABN` (and an existing :class:`~layers.InPlaceABNSync`) becomes an
      :class:`~layers.InPlaceABNSync`;
    * :class:`~layers.ABN` (and an existing :class:`~layers.ABNSync`) becomes an
      :class:`~layers.ABNSync`: it stays out of place. An ``ABN`` is out of place because its
      input is still needed (a DenseNet's first features of a block, a shortcut's input) or
      because its activation (``relu``) cannot be inverted; turning it into an in-place layer
      would overwrite that input or fail, so it never is.

    The new layer keeps the activation, ``activation_param``, ``scale_mode``, ``eps``,
    ``momentum``, ``affine``, ``track_running_stats``, ``variant`` and the training flag, and
    takes over the very parameter and buffer tensors (same values, device, dtype; an optimizer
    built before the conversion still holds them). ``group`` is the process group (default:
    the world); without an initialised process group the converted layers compute what the
    originals did. A subclass of ``ABN`` other than these four may compute something else and
    raises a ``TypeError``.

    With ``convert_batchnorm=True``, torch's batch norms that are followed by an activation
    become in-place layers too, where that computes the same function:

    * an ``nn.BatchNorm1d/2d/3d`` or ``nn.SyncBatchNorm`` (exact type, with a bias if affine,
      every ``|weight| >= eps``) that sits in an ``nn.Sequential`` (or a subclass that keeps
      its ``forward``, e.g. torchvision's ``Conv2dNormActivation``) right after a convolution or
      ``nn.Linear`` (whose output only it reads) and right before an ``nn.LeakyReLU`` (slope
      > 0), ``nn.ELU`` (alpha > 0) or ``nn.Identity`` becomes one ``InPlaceABNSync`` with that
      activation and ``scale_mode="bn"`` (scale ``weight``, as BN); the activation module is
      replaced by ``nn.Identity``, so the state-dict keys do not change.

    Other batch norms (followed by ``nn.ReLU``, first in their ``nn.Sequential``, ...) are left
    as they are: pass the result to ``nn.SyncBatchNorm.convert_sync_batchnorm`` to synchronise
    them as ``SyncBatchNorm``. Neither converter touches
    :class:`layers.residual.BatchNormAct2d`, the STD-BN layer of the ``norm="bn"`` residual
    networks (the paper's unsynchronised baseline): its output may be modified in place by the
    code that follows (the residual sum), which an ABN layer's saved output does not allow;
    build those networks with ``norm="iabn_sync"`` for synchronised statistics. Returns
    ``module`` converted in place, or the new layer if ``module`` itself is converted (as
    torch's converter).
    """
    return _convert(module, group, convert_batchnorm, "")


_ABN_TYPES = {ABN: ABNSync, ABNSync: ABNSync, InPlaceABN: InPlaceABNSync,
              InPlaceABNSync: InPlaceABNSync}


def _convert(module, group, convert_batchnorm, path):
    if isinstance(module, ABN):
        target = _ABN_TYPES.get(type(module))
        if target is None:
            raise TypeError(
                f"{path or 'module'}: cannot convert {type(module).__qualname__}, a subclass of "
                "layers.ABN that may compute something else; convert it by hand"
            )
        options = dict(activation=module.activation, activation_param=module.activation_param,
                       scale_mode=module.scale_mode)
        if issubclass(target, InPlaceABN):
            options["variant"] = module.variant
        return _take_over(module, target(module.num_features, module.eps, module.momentum,
                                         module.affine, module.track_running_stats,
                                         group=group, device="meta", **options))
    for name, child in module.named_children():
        converted = _convert(child, group, convert_batchnorm, f"{path}.{name}" if path else name)
        if converted is not child:
            module.add_module(name, converted)
    if convert_batchnorm and isinstance(module, nn.Sequential) \
            and type(module).forward is nn.Sequential.forward:  # children run in order
        _fuse_batchnorm_activation(module, group)
    return module


def _take_over(old, new):
    """``new`` holding ``old``'s parameter and buffer tensors and training flag."""
    for name in ("weight", "bias"):
        if getattr(old, name) is not None:
            setattr(new, name, getattr(old, name))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        if getattr(old, name) is not None:
            setattr(new, name, getattr(old, name))
    new.train(old.training)
    return new


def _activation_of(module):
    """``(activation, activation_param)`` of an invertible activation module, else ``None``."""
    if type(module) is nn.LeakyReLU and module.negative_slope > 0:
        return "leaky_relu", float(module.negative_slope)
    if type(module) is nn.ELU and module.alpha > 0:
        return "elu", float(module.alpha)
    if type(module) is nn.Identity:
        return "identity", None
    return None


def _fusable(previous, norm, activation):
    """Whether ``previous -> norm -> activation`` may become one in-place layer."""
    if type(norm) not in BATCHNORM_TYPES or not isinstance(previous, FRESH_OUTPUT_TYPES):
        return False
    if _activation_of(activation) is None:
        return False
    if norm.affine:
        if norm.bias is None:  # BatchNorm(bias=False): no bias parameter to carry over
            return False
        if norm.weight.device.type != "meta":
            with torch.no_grad():
                # scale_mode="bn" in place refuses |weight| < eps in training
                if bool((norm.weight.abs() < norm.eps).any()):
                    return False
    return True


def _fuse_batchnorm_activation(sequential, group):
    names = list(sequential._modules)
    for i in range(1, len(names) - 1):
        previous, norm, activation = (sequential._modules[n] for n in names[i - 1:i + 2])
        if not _fusable(previous, norm, activation):
            continue
        act, param = _activation_of(activation)
        fused = InPlaceABNSync(norm.num_features, norm.eps, norm.momentum, norm.affine,
                               norm.track_running_stats, activation=act, activation_param=param,
                               scale_mode="bn", group=group, device="meta")
        sequential.add_module(names[i], _take_over(norm, fused))
        sequential.add_module(names[i + 1], nn.Identity())


__all__ = ["convert_sync_batchnorm", "BATCHNORM_TYPES", "FRESH_OUTPUT_TYPES"]
