"""Every refusal of an ABN layer comes before anything is written: the input, the weight, the
bias, the running statistics and ``num_batches_tracked`` are bit-identical afterwards, and the
error names the argument."""
import math

import pytest
import torch
import torch.nn as nn

import layers


def layer_of(cls=layers.InPlaceABN, momentum=0.1, **kwargs):
    """A float64 layer whose parameters and statistics are off their defaults."""
    layer = cls(3, momentum=momentum, **kwargs).double()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in (layer.weight, layer.bias, layer.running_mean):
            tensor.copy_(torch.randn(3, dtype=torch.float64, generator=generator))
        layer.running_var.uniform_(0.5, 2.0, generator=generator)
        layer.num_batches_tracked.fill_(7)
    return layer


def conv_output(requires_grad=True):
    """A non-leaf input (a convolution's output), as an in-place layer needs."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=generator)
    return x * 1 if not requires_grad else x.requires_grad_() * 1


def view_of_leaf_parameter():
    return layer_of(), nn.Parameter(torch.randn(2, 3, 4, 5, dtype=torch.float64))[:1], "input"


def inference_tensor():
    with torch.inference_mode():
        x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    return layer_of(), x, "input.*inference"


def expanded_input():
    return layer_of(), torch.randn(1, 3, 4, 5, dtype=torch.float64).expand(2, 3, 4, 5), \
        "input.*overlap"


def overlapping_input():
    storage = torch.randn(64, dtype=torch.float64)
    return layer_of(), storage.as_strided((2, 3, 4, 5), (5, 4, 3, 1)), "input.*overlap"


def zero_weight_bn_scale(momentum=0.1):
    layer = layer_of(scale_mode="bn", momentum=momentum)
    with torch.no_grad():
        layer.weight[1] = 0.0
    return layer, conv_output(), "weight"


def zero_weight_cumulative_average():
    return zero_weight_bn_scale(momentum=None)


def activation_param(value, cls=layers.InPlaceABN):
    def case():
        layer = layer_of(cls)
        layer.activation_param = value
        return layer, conv_output(), "activation_param"
    case.__name__ = f"activation_param_{value}_{cls.__name__}"
    return case


def infinite_eps(cls=layers.InPlaceABN):
    def case():
        layer = layer_of(cls)
        layer.eps = math.inf
        return layer, conv_output(), "eps"
    case.__name__ = f"infinite_eps_{cls.__name__}"
    return case


def leaf_input():
    return layer_of(), conv_output().detach().requires_grad_(), "input.*leaf"


def output_of_another_inplace_layer():
    return layer_of(), layers.InPlaceABN(3).double()(conv_output()), "input.*in-place"


#: Refusals that an eval-mode forward (which counts no batch) met only after writing too.
EVAL_CASES = [view_of_leaf_parameter, inference_tensor, expanded_input, overlapping_input,
              activation_param(math.inf), activation_param(math.inf, layers.ABN),
              infinite_eps(), infinite_eps(layers.ABN)]
CASES = [*EVAL_CASES, zero_weight_bn_scale, zero_weight_cumulative_average,
         activation_param(math.nan), activation_param(-math.inf),
         activation_param(math.nan, layers.ABN), leaf_input, output_of_another_inplace_layer]


def state_of(layer, x):
    """Copies of everything a refused call must leave as it was."""
    state = {name: tensor.detach().clone() for name, tensor in
             [*layer.named_parameters(), *layer.named_buffers()]}
    with torch.inference_mode(x.is_inference()):
        state["input"] = x.detach().clone()
    return state


@pytest.mark.parametrize("case,training",
                         [(c, True) for c in CASES] + [(c, False) for c in EVAL_CASES],
                         ids=lambda v: v.__name__ if callable(v) else ("train" if v else "eval"))
def test_refusal_writes_nothing(case, training):
    """The refusal names the argument and leaves every tensor of the call bit-identical."""
    layer, x, match = case()
    layer.train(training)
    before = state_of(layer, x)
    with pytest.raises((ValueError, TypeError), match=match):
        layer(x)
    after = state_of(layer, x)
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), f"{name} was written"
