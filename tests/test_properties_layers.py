"""Property-based tests (hypothesis): random layer configurations, shapes, layouts and ways of
running (hooks, ``autograd.grad``, anomaly mode, ``torch.compile`` with the cheap ``eager`` and
``aot_eager`` backends) give the float64 outputs, gradients and buffers of the composite
reference (``trust_harness``). The fixed tests of ``test_trust_gradients.py`` add ``inductor``.

The examples are derandomized (the same ones every run) and bounded, so the file runs in
about two minutes on two cores.
"""
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import layers
from trust_harness import (EAGER_WAYS, LAYOUTS, assert_same, compiled, inputs, layer_net,
                           observe, plain)

CLASSES = (layers.ABN, layers.InPlaceABN, layers.InPlaceABNSync)
ONCE_AN_EXAMPLE = dict(deadline=None, derandomize=True, database=None,
                       suppress_health_check=[HealthCheck.too_slow])


@st.composite
def activations(draw, inplace):
    """An activation the layer takes, with a parameter drawn from its allowed range."""
    names = ["leaky_relu", "elu", "identity"] + ([] if inplace else ["relu"])
    name = draw(st.sampled_from(names))
    if name == "leaky_relu":
        return name, draw(st.floats(0.01, 0.5))
    if name == "elu":
        return name, draw(st.floats(0.2, 2.0))
    return name, None


@st.composite
def configurations(draw):
    """``(cls, layer keyword arguments, layout, training, input shape)``."""
    cls = draw(st.sampled_from(CLASSES))
    activation, param = draw(activations(cls.inplace))
    kwargs = dict(activation=activation, activation_param=param,
                  scale_mode=draw(st.sampled_from(["abs", "bn"])))
    if cls.inplace:
        kwargs["variant"] = draw(st.sampled_from(["I", "II"]))
    kwargs["channels"] = draw(st.integers(1, 4))
    training = draw(st.booleans())
    n, h, w = (draw(st.integers(1, 3)) for _ in range(3))
    if training and n * h * w < 2:  # batch statistics need two values per channel
        n = 2
    return cls, kwargs, draw(st.sampled_from(LAYOUTS)), training, (n, 3, h, w)


def check(configuration, way, reference_way):
    cls, kwargs, layout, training, shape = configuration
    net, reference = layer_net(cls, layout=layout, training=training, **kwargs)
    if layout == "channels_last":
        # The same function on the contiguous layout: PyTorch's own eval-mode BN under a
        # module full backward hook gives a channels-last input of shape (1, 2, 1, 2) another
        # input gradient than without the hook (the reference would be wrong, not the layer).
        reference.layout = "contiguous"
    x, grad = inputs(shape=shape)
    assert_same(observe(net, x, grad, way), observe(reference, x, grad, reference_way))


@settings(max_examples=50, **ONCE_AN_EXAMPLE)
@given(configurations(), st.sampled_from(EAGER_WAYS))
def test_eager_ways_match_the_composite(configuration, way):
    check(configuration, way, way)


#: An in-place layer compiled alone, its input made outside the graph (always run).
OUTSIDE = (layers.InPlaceABN, dict(activation="leaky_relu", activation_param=0.01,
                                   scale_mode="abs", variant="II", channels=3),
           "contiguous", True, (2, 3, 4, 4))


@settings(max_examples=8, **ONCE_AN_EXAMPLE)
@given(configurations(), st.sampled_from(["eager", "aot_eager"]),
       st.sampled_from(["outside", "inside", "returned", "breaks"]), st.booleans())
@example(OUTSIDE, "aot_eager", "outside", False)
def test_compiled_layers_match_the_composite(configuration, backend, placement, dynamic):
    check(configuration, compiled(backend, placement, dynamic), plain)
