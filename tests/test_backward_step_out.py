"""The out-of-place whole backward step (``ops.backward_step_out``): the input gradient of an
incoming gradient the layer does not own is written into a new tensor in the pass that reads
the incoming gradient, instead of over a copy of it. It must leave the incoming gradient as it
was (a hook or ``retain_grad`` may hold it) and compute what the in-place step computes."""
import pytest
import torch

from layers import functional
from layers.kernels import common

from abn_reference import reference_step

SHAPE = (4, 40, 5, 6)  # 40 channels: the CPU whole-step kernel's blocks of channels
SLOPE = 0.01


def bits(t):
    """The bit patterns of ``t``'s elements (signed zeros and NaNs told apart), as integers."""
    integer = {8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]
    return t.contiguous().view(integer)


@pytest.mark.parametrize("mode", [common.MODE_Y, common.MODE_XHAT_FROM_X],
                         ids=["from-y", "from-x"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last],
                         ids=["contiguous", "channels-last"])
def test_out_of_place_step_keeps_dz_and_matches_the_in_place_step(memory_format, dtype, mode):
    """``functional.normalize_activate_backward`` on an incoming gradient it does not own
    (``dz_owned=False``: the out-of-place step; on contiguous tensors the CPU whole-step
    kernel, on channels-last ones the kernels one by one) leaves ``dz`` bit-identical, writes
    ``dx`` into new memory laid out as ``dz``, and gives the input and parameter gradients of
    the in-place step (``dz_owned=True``, which writes over ``dz``) bitwise: the same
    arithmetic, only the output's address differs. In float64 ``dx`` is also the composite
    PyTorch reference's (``F.batch_norm`` + leaky ReLU through autograd) to 1e-10."""
    generator = torch.Generator().manual_seed(55)
    channels = SHAPE[1]
    x64 = torch.randn(SHAPE, generator=generator, dtype=torch.float64) * 2 + 1
    grad64 = torch.randn(SHAPE, generator=generator, dtype=torch.float64)
    weight = torch.rand(channels, generator=generator) + 0.5
    bias = torch.randn(channels, generator=generator)
    x = x64.to(dtype).contiguous(memory_format=memory_format)
    dz = grad64.to(dtype).contiguous(memory_format=memory_format)
    z = x.clone(memory_format=torch.preserve_format)
    channel = functional.normalize_activate_into(z, z, weight, bias, None, None, True, 0.1,
                                                 1e-5, common.ACT_LEAKY_RELU, SLOPE, "abs")
    spec = functional.BackwardSpec.of(mode, common.ACT_LEAKY_RELU, SLOPE, True, None, weight,
                                      bias)
    stored = x if mode == common.MODE_XHAT_FROM_X else None

    kept = dz.clone(memory_format=torch.preserve_format)
    dx, dweight, dbias = functional.normalize_activate_backward(z, kept, stored, channel, spec)
    assert torch.equal(bits(kept), bits(dz)), "dz was written"
    assert dx.data_ptr() != kept.data_ptr() and dx.stride() == dz.stride()

    owned = dz.clone(memory_format=torch.preserve_format)
    in_place = functional.normalize_activate_backward(z, owned, stored, channel, spec,
                                                      dz_owned=True)
    assert in_place[0] is owned  # the in-place step wrote over the gradient it was handed
    for name, one, other in zip(("input", "weight", "bias"), (dx, dweight, dbias), in_place):
        assert torch.equal(bits(one), bits(other)), f"{name} grad differs from the in-place step's"

    if dtype == torch.float64:
        _, dx_ref, dweight_ref, dbias_ref = reference_step(
            x64, weight.double(), bias.double(), None, None, grad64, activation="leaky_relu",
            param=SLOPE)
        torch.testing.assert_close(dx, dx_ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(dweight.double(), dweight_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dbias.double(), dbias_ref, rtol=1e-5, atol=1e-5)
