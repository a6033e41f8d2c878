"""Every refusal of an ABN layer comes before anything is written: the input, the weight, the
bias, the running statistics and ``num_batches_tracked`` are bit-identical afterwards, and the
error names the argument."""
import math

import pytest
import torch
import torch.nn as nn

import layers
from layers import shared_inplace, shared_storage
from layers.residual import BatchNormAct2d


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


def single_value_per_channel(cls=layers.InPlaceABN):
    def case():
        return layer_of(cls), conv_output()[:1, :, :1, :1], "more than 1 value per channel"
    case.__name__ = f"single_value_per_channel_{cls.__name__}"
    return case


#: Refusals that an eval-mode forward (which counts no batch) met only after writing too.
EVAL_CASES = [view_of_leaf_parameter, inference_tensor, expanded_input, overlapping_input,
              activation_param(math.inf), activation_param(math.inf, layers.ABN),
              infinite_eps(), infinite_eps(layers.ABN)]
CASES = [*EVAL_CASES, zero_weight_bn_scale, zero_weight_cumulative_average,
         activation_param(math.nan), activation_param(-math.inf),
         activation_param(math.nan, layers.ABN), leaf_input, output_of_another_inplace_layer,
         *[single_value_per_channel(cls) for cls in (layers.InPlaceABN, layers.ABN,
                                                     BatchNormAct2d)]]


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


# --------------------------------------------------------------------------- shared storages
def features_of(*shapes, requires_grad=True):
    """Convolution-output-like feature maps of the given shapes for the shared routes."""
    generator = torch.Generator().manual_seed(2)
    return [torch.randn(shape, dtype=torch.float64, generator=generator)
            .requires_grad_(requires_grad) * 1 for shape in shapes]


def conv_of(in_channels=3):
    torch.manual_seed(3)
    return nn.Conv2d(in_channels, 2, 1, bias=False).double()


def one_value_per_channel(norm):
    return norm, conv_of(), features_of((1, 2, 1, 1), (1, 1, 1, 1)), "more than 1 value"


def norm_of_another_width(norm):
    return norm, conv_of(2), features_of((2, 1, 4, 5), (2, 1, 4, 5)), "weight has shape"


def conv_of_another_width(norm):
    return norm, conv_of(5), features_of((2, 2, 4, 5), (2, 1, 4, 5)), "conv takes 5"


def features_of_other_sizes(norm):
    return norm, conv_of(), features_of((2, 2, 4, 5), (2, 1, 4, 4)), "features\\[1\\]"


def infinite_norm_eps(norm):
    norm.eps = math.inf
    return norm, conv_of(), features_of((2, 2, 4, 5), (2, 1, 4, 5)), "eps"


def momentum_above_one(norm):
    norm.momentum = 2.0
    return norm, conv_of(), features_of((2, 2, 4, 5), (2, 1, 4, 5)), "momentum"


def zero_norm_weight(norm):
    with torch.no_grad():
        norm.weight[1] = 0.0
    return norm, conv_of(), features_of((2, 2, 4, 5), (2, 1, 4, 5)), "weight"


def batch_norm():
    """A float64 ``nn.BatchNorm2d`` off its defaults, as :func:`layer_of` makes the others."""
    norm = nn.BatchNorm2d(3).double()
    reference = layer_of()
    norm.load_state_dict(reference.state_dict())
    return norm


def abn_norm():
    return layer_of(layers.ABN)


def abn_norm_bn_scale():
    return layer_of(layers.ABN, scale_mode="bn")


SHARED_CASES = [one_value_per_channel, norm_of_another_width, conv_of_another_width,
                features_of_other_sizes, infinite_norm_eps, momentum_above_one]
SHARED_ROUTES = {
    "shared": lambda f, norm, conv: shared_storage.concat_norm_act_conv(
        f, shared_storage.SharedStorages(), norm, conv),
    "shared_inplace": lambda f, norm, conv: shared_inplace.concat_norm_act_conv(
        f, shared_storage.SharedStorage(), norm, conv, chunk_channels=2),
}


@pytest.mark.parametrize("route,make_norm,case", [
    *[("shared", make, c) for make in (abn_norm, batch_norm) for c in SHARED_CASES],
    *[("shared_inplace", abn_norm, c) for c in SHARED_CASES],
    ("shared_inplace", abn_norm_bn_scale, zero_norm_weight),
], ids=lambda v: v.__name__ if callable(v) else None)
def test_shared_route_refusal_writes_nothing(route, make_norm, case):
    """The memory-efficient DenseNet routes (``layers.shared_storage``, ``shared_inplace``)
    refuse before counting the batch or writing any statistic: the norm's parameters and
    buffers, the convolution's weight and the features are bit-identical afterwards."""
    norm, conv, features, match = case(make_norm())
    state = {f"norm.{name}": t.detach().clone() for name, t in
             [*norm.named_parameters(), *norm.named_buffers()]}
    state["conv.weight"] = conv.weight.detach().clone()
    state.update({f"features[{i}]": f.detach().clone() for i, f in enumerate(features)})
    with pytest.raises((ValueError, TypeError), match=match):
        SHARED_ROUTES[route](features, norm, conv)
    after = {f"norm.{name}": t for name, t in [*norm.named_parameters(), *norm.named_buffers()]}
    after["conv.weight"] = conv.weight
    after.update({f"features[{i}]": f for i, f in enumerate(features)})
    for name, tensor in state.items():
        assert torch.equal(after[name].detach(), tensor), f"{name} was written"
