"""Tests of the CUDA fast launcher (``layers.kernels.cuda_launch``) that need no GPU.

What they can check here: that an array is packed in the order and with the values of numba's
own data model of a CUDA array argument (the reference: numba's ``ArrayModel`` fields, which
``numba.cuda`` flattens into kernel parameters in that order), the scalar C types, and that
the launcher leaves every launch it cannot do to numba. The launches themselves run on a GPU:
the layer tests on CUDA tensors and the GPU self-check go through it (``docs/performance.md``,
"The GPU self-check").
"""
import ctypes

import pytest
import torch

from layers.kernels import cuda_launch


def _array_model_fields(ndim):
    from numba.cuda import types
    from numba.cuda.descriptor import cuda_target

    model = cuda_target.target_context.data_model_manager[types.Array(types.float32, ndim, "C")]
    return model._fields


@pytest.mark.parametrize("shape", [(7,), (2, 3), (2, 3, 4)], ids=str)
def test_an_array_is_packed_as_numbas_data_model_flattens_it(shape):
    tensor = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(shape)
    packed = []
    cuda_launch._pack_array(tensor, packed)
    strides = [4 * s for s in tensor.stride()]
    values = {"meminfo": [0], "parent": [0], "nitems": [tensor.numel()], "itemsize": [4],
              "data": [tensor.data_ptr()], "shape": list(shape), "strides": strides}
    assert packed == [v for field in _array_model_fields(len(shape)) for v in values[field]]


def test_a_row_view_is_packed_at_its_own_address():
    """The per-channel rows the whole steps pass (``ab[0]``, ``pq[1]``) are views into a
    ``(2, C)`` tensor: the data pointer is the row's, the strides those of a vector."""
    matrix = torch.zeros(2, 5, dtype=torch.float64)
    packed = []
    cuda_launch._pack_array(matrix[1], packed)
    assert packed == [0, 0, 5, 8, matrix.data_ptr() + 5 * 8, 5, 8]


def test_scalars_and_unsupported_types():
    from numba.cuda import types

    packers = cuda_launch._packers((types.int64, types.float32, types.float64,
                                    types.Array(types.float64, 2, "C")))
    packed = []
    for pack, value in zip(packers, (3, 0.5, 0.25, torch.zeros(1, 1, dtype=torch.float64))):
        pack(value, packed)
    assert [type(p) for p in packed[:3]] == [ctypes.c_int64, ctypes.c_float, ctypes.c_double]
    assert [p.value for p in packed[:3]] == [3, 0.5, 0.25]
    # Anything else goes through numba's launch: a strided array, a 32-bit integer.
    assert cuda_launch._packers((types.Array(types.float32, 1, "A"),)) is None
    assert cuda_launch._packers((types.int32,)) is None


def test_argument_key_tells_contiguous_from_strided_tensors():
    """A strided tensor selects another overload than a contiguous one of its dtype and rank
    (numba types it as a non-contiguous array), so it never takes the contiguous one's
    packers; an int and a float scalar select different overloads too."""
    key = cuda_launch._argument_key
    t = torch.zeros(4, 6)
    assert key((t, 1, 0.5)) != key((t[:, ::2], 1, 0.5))
    assert key((t, 1)) != key((t, 1.0))


def test_an_unregistered_launch_is_left_to_numba():
    """Before numba has launched a signature once, the fast launcher launches nothing (and
    touches no driver: this runs without a GPU)."""
    launcher = cuda_launch.FastLauncher()
    assert launcher.launch(object(), (1,), (32,), 0, (torch.zeros(3), 1)) is False
