"""Folding eval-mode batch normalization into the convolution that feeds it, for inference.

At inference a BN layer is a per-channel affine map (InPlace-ABN paper §3.1: BN + activation
is a scale, a shift and an activation), so after a convolution it can be folded into the
convolution's weights and bias exactly: with ``s = gamma / sqrt(running_var + eps)``,

    act(s * (W * x + b - running_mean) + beta) = act((s W) * x + (s (b - running_mean) + beta)),

where ``gamma`` is the layer's scale (``|weight| + eps`` with ``scale_mode="abs"``, ``weight``
with ``"bn"``). Only the activation is left. :func:`fuse_abn` does this for every ``conv -> BN``
pair of a model (post-activation layouts: torchvision's ResNeXt bottleneck, the stems). A BN
*before* a convolution (pre-activation layouts: the DenseNets' dense layers, WideResNet-38's
blocks) is not folded: folding it into the following convolution is not exact at the borders,
where the convolution's zero padding would be shifted by the BN too.
"""
import copy

import torch
import torch.fx as fx
import torch.nn as nn

from .abn import ABN, NORM_TYPES

#: Convolutions a norm can be folded into.
_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


class _Tracer(fx.Tracer):
    """Keeps every normalization module as one node, so that it can be matched and replaced."""

    def is_leaf_module(self, module, qualified_name):
        return isinstance(module, NORM_TYPES) or super().is_leaf_module(module, qualified_name)


def _activation_module(norm):
    """The activation that is left of ``norm`` once its affine map is folded away."""
    activation = getattr(norm, "activation", "identity")
    param = getattr(norm, "activation_param", None)
    if activation == "leaky_relu":
        return nn.LeakyReLU(param)
    if activation == "elu":
        return nn.ELU(param)
    if activation == "relu":
        return nn.ReLU()
    return nn.Identity()


def _scale(norm):
    """The per-channel scale ``gamma`` of ``norm`` (float64)."""
    if norm.weight is None:
        return torch.ones(norm.num_features, dtype=torch.float64,
                          device=norm.running_mean.device)
    weight = norm.weight.detach().double()
    if isinstance(norm, ABN) and norm.scale_mode == "abs":
        return weight.abs() + norm.eps
    return weight


def _fold(conv, norm):
    """A copy of ``conv`` with ``norm``'s eval-mode affine map folded in (computed in float64,
    stored in the convolution's dtype)."""
    factor = _scale(norm) * torch.rsqrt(norm.running_var.double() + norm.eps)
    shift = torch.zeros_like(factor) if norm.bias is None else norm.bias.detach().double()
    conv_bias = (torch.zeros_like(factor) if conv.bias is None
                 else conv.bias.detach().double())
    fused = copy.deepcopy(conv)
    weight = conv.weight.detach().double() * factor.view(-1, *[1] * (conv.weight.dim() - 1))
    bias = (conv_bias - norm.running_mean.double()) * factor + shift
    fused.weight = nn.Parameter(weight.to(conv.weight.dtype), conv.weight.requires_grad)
    fused.bias = nn.Parameter(bias.to(conv.weight.dtype), conv.weight.requires_grad)
    return fused


def _foldable(norm):
    """Whether ``norm`` computes a fixed affine map + activation (eval mode, running stats)."""
    return (isinstance(norm, NORM_TYPES) and not norm.training and norm.running_mean is not None
            and norm.running_var is not None)


def fuse_abn(model):
    """An eval-mode copy of ``model`` with every ``conv -> BN`` pair folded into the conv.

    A pair is folded when a normalization module (``ABN``, ``InPlaceABN``, their synchronised
    versions, ``layers.residual.BatchNormAct2d`` or a torch ``BatchNorm*d``) reads the output
    of a convolution module that nothing else reads, the two modules being called only
    there (a norm also applied elsewhere, to an input no convolution folded it into, stays a
    norm everywhere, unfused): the
    convolution gets the BN's scale and shift (see the module docstring) and the norm becomes
    its bare activation (``nn.LeakyReLU``, ``nn.ELU``, ``nn.ReLU`` or ``nn.Identity``). Other
    norms stay as they are. ``model`` itself is not changed.

    Returns a ``torch.fx.GraphModule`` (the model traced with ``torch.fx``, the norms kept as
    modules) with ``fused_pairs``: the ``(convolution, norm)`` names that were folded. It runs,
    traces and exports to ONNX as the model does. Raises a ``ValueError`` naming the model if
    ``torch.fx`` cannot trace it (data-dependent control flow in its ``forward``).
    """
    model = copy.deepcopy(model).eval()
    try:
        graph_module = fx.GraphModule(model, _Tracer().trace(model))
    except Exception as error:  # fx raises several types; the cause is kept
        raise ValueError(
            f"fuse_abn: torch.fx cannot trace {type(model).__name__} ({error}); fuse_abn needs "
            "a forward without data-dependent control flow") from error
    modules = dict(graph_module.named_modules())
    calls = {}
    for node in graph_module.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    fused_pairs = []
    for node in list(graph_module.graph.nodes):
        if node.op != "call_module" or not _foldable(modules[node.target]):
            continue
        source = node.args[0] if node.args else None
        if not (isinstance(source, fx.Node) and source.op == "call_module"
                and isinstance(modules[source.target], _CONVOLUTIONS)
                and len(source.users) == 1 and calls[source.target] == 1
                and calls[node.target] == 1):
            continue
        conv, norm = modules[source.target], modules[node.target]
        _replace(graph_module, source.target, _fold(conv, norm))
        _replace(graph_module, node.target, _activation_module(norm))
        fused_pairs.append((source.target, node.target))
    graph_module.recompile()
    graph_module.fused_pairs = fused_pairs
    return graph_module


def _replace(root, name, module):
    """Put ``module`` at the dotted ``name`` under ``root``."""
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


__all__ = ["fuse_abn"]
