"""Host time per normalization-layer call (``experiments.measure.layer_call``)."""
import pytest
import torch
import torch.nn.functional as F

from experiments.measure import layer_call


def test_every_contender_is_timed_forward_and_backward():
    times = layer_call.measure(shape=(2, 4, 3, 3), warmup=1, repeats=3)
    assert set(times) == {"inplace_abn_I", "inplace_abn_II", "abn", "bn_leaky_relu"}
    for row in times.values():
        assert set(row) == {"forward_us", "forward_backward_us"}
        assert row["forward_us"] > 0 and row["forward_backward_us"] > 0


def test_composite_is_batch_norm_then_leaky_relu():
    module = layer_call.contenders(3)["bn_leaky_relu"]
    x = torch.randn(4, 3, 2, 2)
    expected = F.leaky_relu(F.batch_norm(x, None, None, training=True), layer_call.SLOPE)
    torch.testing.assert_close(module(x), expected)


def test_refuses_a_shape_without_channels():
    with pytest.raises(ValueError, match="shape"):
        layer_call.measure(shape=(4,), warmup=0, repeats=1)
