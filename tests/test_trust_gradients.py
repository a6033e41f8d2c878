"""The ABN layers give the eager float64 gradients of BN + activation through PyTorch's own
ops under every way PyTorch runs a module: tensor hooks, module full backward hooks,
``retain_grad``, ``torch.autograd.grad`` (with and without ``create_graph``), anomaly mode,
gradient checkpointing and ``torch.compile`` (backends ``eager``, ``aot_eager``, ``inductor``;
the layer's input from outside the graph or inside it, its output returned or used inside,
graph breaks around it, dynamic shapes); likewise every DenseNet implementation.

The reference is the same network with every ABN layer replaced by its composite twin
(``trust_harness.reference_of``), run the same way. Each feature is run with each class at
least once rather than as the full cross-product: the ``inductor`` compiles take tens of
seconds each on a small machine.
"""
import pytest
import torch

import layers
from trust_harness import (EAGER_WAYS, assert_same, autograd_grad, checkpointed, compiled,
                           inputs, layer_net, observe, plain)

CLASSES = [layers.ABN, layers.InPlaceABN, layers.InPlaceABNSync]


def check(net, reference, way, reference_way=None, **shape):
    """One step of ``net`` run ``way`` against ``reference`` run ``reference_way`` (default:
    the same way)."""
    x, grad = inputs(**shape)
    expected = observe(reference, x, grad, reference_way or way)
    assert_same(observe(net, x, grad, way), expected)


# --------------------------------------------------------------------------- eager ways
@pytest.mark.parametrize("way", EAGER_WAYS, ids=lambda w: w.__name__)
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_hooks_and_autograd_see_the_reference_gradients(cls, way):
    """A gradient kept by a hook or ``retain_grad`` is never overwritten afterwards, and every
    gradient equals the reference's."""
    check(*layer_net(cls), way)


@pytest.mark.parametrize("variant", ["I", "II"])
@pytest.mark.parametrize("activation,param", [("leaky_relu", 0.2), ("elu", 0.7),
                                              ("identity", None)])
@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_kept_gradients_of_every_configuration(training, channels_last, activation, param,
                                               variant):
    """The Grad-CAM pattern (a hook keeping the norm output's gradient) in every variant,
    activation, mode and layout."""
    way = EAGER_WAYS[1]
    check(*layer_net(layers.InPlaceABN, channels_last=channels_last, training=training,
                     activation=activation, activation_param=param, variant=variant), way)
