""""InPlace-ABN trains on par with STD-BN", in its exact form: the same network with standard
BN + leaky ReLU and with InPlace-ABN in ``scale_mode="bn"`` (the scale is the weight itself, as
BN's), from the same initial weights, on the same batches in the same order, in float64,
trained side by side with the same optimizer.

InPlace-ABN computes the same function as BN followed by the activation and, by inverting the
activation, the same gradients; only the order of floating-point operations differs. So the
two loss curves must agree to rounding, step after step, and :func:`train_side_by_side`
records both curves and their largest relative difference. The InPlace-ABN paper's §4.1 makes
the weaker claim of equal accuracy after 90 epochs of ImageNet (Table 1); this is what can be
checked exactly on any machine.
"""
import itertools

import torch
import torch.nn.functional as F
from tqdm import tqdm

import layers

from .models import build_model

#: The activation the paper uses everywhere (Sec. 4): leaky ReLU, slope 0.01.
ACTIVATION = "leaky_relu"


def twin_models(name, model_args, num_classes, dtype=torch.float64):
    """``(standard, inplace)``: ``name`` with ``norm="bn"`` + leaky ReLU and with
    ``norm="iabn"`` in ``scale_mode="bn"``, the second loaded with the first's weights."""
    standard = build_model(name, norm="bn", num_classes=num_classes, activation=ACTIVATION,
                           **model_args).to(dtype)
    inplace = build_model(name, norm="iabn", num_classes=num_classes, activation=ACTIVATION,
                          **model_args).to(dtype)
    for module in inplace.modules():
        if isinstance(module, layers.ABN):
            module.scale_mode = "bn"
    inplace.load_state_dict(standard.state_dict())
    return standard, inplace


def _optimizer(model, lr):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True,
                           weight_decay=1e-4)


def train_side_by_side(standard, inplace, batches, steps, lr, desc="parity"):
    """Train both models on the same ``batches`` (an iterable of ``(input, target)``, cycled)
    for ``steps`` SGD steps; return one record per step with both losses."""
    optimizers = [_optimizer(standard, lr), _optimizer(inplace, lr)]
    standard.train()
    inplace.train()
    records = []
    source = itertools.islice(itertools.cycle(batches), steps)
    for step, (x, target) in enumerate(tqdm(source, total=steps, desc=desc, leave=False)):
        losses = []
        for model, optimizer in zip((standard, inplace), optimizers):
            optimizer.zero_grad(set_to_none=True)
            # The in-place network overwrites activations of its own graph, never the input:
            # its first layer is a convolution. Each model still gets its own copy.
            loss = F.cross_entropy(model(x.clone()), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        records.append({"step": step, "loss_std_bn": losses[0], "loss_inplace_abn": losses[1]})
    return records


def relative_difference(records):
    """Largest ``|loss_inplace - loss_std| / |loss_std|`` over the steps."""
    return max(abs(r["loss_inplace_abn"] - r["loss_std_bn"]) / abs(r["loss_std_bn"])
               for r in records)


def max_parameter_difference(standard, inplace):
    """Largest relative difference between the two models' parameters after training."""
    pairs = zip(standard.state_dict().values(), inplace.state_dict().values())
    return max(((a - b).abs().max() / a.abs().max().clamp_min(1e-300)).item()
               for a, b in pairs if a.is_floating_point() and a.numel())


__all__ = ["ACTIVATION", "twin_models", "train_side_by_side", "relative_difference",
           "max_parameter_difference"]
