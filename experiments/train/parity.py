""""InPlace-ABN trains on par with STD-BN", in its exact form: the same network with standard
BN + leaky ReLU and with InPlace-ABN in ``scale_mode="bn"`` (the scale is the weight itself, as
BN's), from the same initial weights, on the same batches in the same order, in float64,
trained side by side with the same optimizer.

InPlace-ABN computes the same function as BN followed by the activation and, by inverting the
activation, the same gradients; only the order of floating-point operations differs (and
recovering ``x_hat = (y - beta) / gamma`` scales rounding errors by ``1 / |gamma|``). So the two
loss curves agree to rounding for as long as the training itself does not amplify rounding
errors. Deep networks trained at useful learning rates often do: once BN weights swing close
to zero, two runs of the *same* STD-BN network whose weights differ by one rounding error drift
apart within tens of steps. :func:`train_side_by_side` therefore trains a third network, the
**rounding control**: STD-BN again, from the initial weights perturbed by a relative
:data:`CONTROL_PERTURBATION` (a few units in the last place). InPlace-ABN trains on par with
STD-BN when its loss curve stays as close to STD-BN's as the control's does: it agrees to
rounding (:data:`ROUNDING`) for as many steps as the control (:func:`keeps_pace`; where errors
grow by orders of magnitude per step, the step at which one crosses the threshold is uncertain
by about one step, the margin allowed).

The InPlace-ABN paper's §4.1 makes the weaker claim of equal accuracy after 90 epochs of
ImageNet (Table 1); this is what can be checked exactly on any machine.
"""
import itertools

import torch
import torch.nn.functional as F
from tqdm import tqdm

import layers

from .models import build_model

#: The activation the paper uses everywhere (Sec. 4): leaky ReLU, slope 0.01.
ACTIVATION = "leaky_relu"
#: Relative perturbation of the rounding control's initial weights (float64 has 2.2e-16).
CONTROL_PERTURBATION = 1e-15
#: A relative loss difference at most this is rounding (float64, a deep network).
ROUNDING = 1e-9
#: The three networks trained side by side, in the order of :func:`twin_models`' result.
NETWORKS = ("std_bn", "inplace_abn", "control")


def twin_models(name, model_args, num_classes, dtype=torch.float64):
    """``(standard, inplace, control)``: ``name`` with ``norm="bn"`` + leaky ReLU, with
    ``norm="iabn"`` in ``scale_mode="bn"`` loaded with the first's weights, and the first again
    with every weight perturbed by a relative :data:`CONTROL_PERTURBATION` (random signs)."""
    standard = build_model(name, norm="bn", num_classes=num_classes, activation=ACTIVATION,
                           **model_args).to(dtype)
    inplace = build_model(name, norm="iabn", num_classes=num_classes, activation=ACTIVATION,
                          **model_args).to(dtype)
    for module in inplace.modules():
        if isinstance(module, layers.ABN):
            module.scale_mode = "bn"
    inplace.load_state_dict(standard.state_dict())
    control = build_model(name, norm="bn", num_classes=num_classes, activation=ACTIVATION,
                          **model_args).to(dtype)
    control.load_state_dict(standard.state_dict())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in control.parameters():
            signs = torch.randint(0, 2, parameter.shape, generator=generator) * 2 - 1
            parameter.mul_(1 + CONTROL_PERTURBATION * signs.to(parameter.dtype))
    return standard, inplace, control


def _optimizer(model, lr):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True,
                           weight_decay=1e-4)


def train_side_by_side(models, batches, steps, lr, desc="parity"):
    """Train ``models`` (:data:`NETWORKS`, as :func:`twin_models` returns them) on the same
    ``batches`` (an iterable of ``(input, target)``, cycled) for ``steps`` SGD steps; return one
    record per step with each network's loss, ``loss_<network>``."""
    optimizers = [_optimizer(model, lr) for model in models]
    for model in models:
        model.train()
    records = []
    source = itertools.islice(itertools.cycle(batches), steps)
    for step, (x, target) in enumerate(tqdm(source, total=steps, desc=desc, leave=False)):
        record = {"step": step}
        for name, model, optimizer in zip(NETWORKS, models, optimizers):
            optimizer.zero_grad(set_to_none=True)
            # The in-place network overwrites activations of its own graph, never the input
            # (its first layer is a convolution); each model still gets its own copy.
            loss = F.cross_entropy(model(x.clone()), target)
            loss.backward()
            optimizer.step()
            record[f"loss_{name}"] = loss.item()
        records.append(record)
    return records


def relative_differences(records, network):
    """Per step, ``|loss_<network> - loss_std_bn| / |loss_std_bn|``."""
    return [abs(r[f"loss_{network}"] - r["loss_std_bn"]) / abs(r["loss_std_bn"])
            for r in records]


def steps_within_rounding(records, network):
    """How many steps, from the first, ``network``'s loss agrees with STD-BN's to
    :data:`ROUNDING`."""
    differences = relative_differences(records, network)
    return next((i for i, d in enumerate(differences) if d > ROUNDING), len(differences))


def summary(records):
    """The comparison of a run: per network (InPlace-ABN and the control) the steps within
    rounding of STD-BN and the largest relative loss difference."""
    return {f"{key}_{network}": value
            for network in NETWORKS[1:]
            for key, value in (("steps_within_rounding", steps_within_rounding(records, network)),
                               ("max_loss_rel_diff", max(relative_differences(records, network))))}


def keeps_pace(inplace_steps, control_steps):
    """Whether InPlace-ABN stayed within rounding of STD-BN (``inplace_steps``, from
    :func:`steps_within_rounding`) about as long as the rounding control did: at least the
    control's steps less one (or less a tenth, for long agreements)."""
    return inplace_steps >= control_steps - max(1, control_steps // 10)


__all__ = ["ACTIVATION", "CONTROL_PERTURBATION", "ROUNDING", "NETWORKS", "twin_models",
           "train_side_by_side", "relative_differences", "steps_within_rounding", "summary",
           "keeps_pace"]
