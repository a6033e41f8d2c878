"""A few operations on the ``meta`` device without torch's Python decompositions.

On the meta device an operation only computes its outputs' shapes, dtypes and strides. For
some operations torch does that by running Python: ``aten.native_batch_norm`` and its backward
run their decompositions (``torch._decomp``), a few dozen reference operators each, about 4 ms
per call on a CPU core; element-wise ``add``, ``mul``, ``relu`` and ``threshold_backward`` run
torch's reference implementations (0.4 to 0.8 ms), and ``normal_`` (weight initialisation) too
(0.9 ms), where a convolution's meta kernel takes 0.1 ms. A simulated training step of a deep
network (the memory experiments' ``--simulate``) runs thousands of them: autograd alone adds
up the gradients of a DenseNet's feature maps a number of times that grows with the square of
its depth.

:func:`call` runs an operation as torch would, except these ones on meta tensors, whose
outputs it creates directly with the shapes, strides and dtypes torch's own implementations
give (``tests/test_measure_fast_meta.py`` compares them, case by case):

* batch norm forward: the output like the input; the saved mean and inverse standard
  deviation ``(C,)`` in the computation dtype (float32 for 16-bit inputs), in training and in
  eval alike;
* batch norm backward: the input gradient like the input; the weight and bias gradients
  ``(C,)`` in the weight's dtype (the input's without a weight), each only where
  ``output_mask`` asks for it;
* ``relu``, and ``add``, ``mul`` and ``threshold_backward`` of two tensors of one shape,
  layout and floating dtype: an output like the (first) input; ``add`` and ``mul`` also of a
  tensor and a number, or of a tensor with no dimension of size 1 and a view of its shape and
  dtype in another layout (a channel slice of a larger tensor), whose strides torch's own
  implementation does not consult then;
* ``normal_``: the tensor itself, as every in-place operation returns it (on the meta device
  there are no values to draw).

Only tensors laid out densely in one of torch's memory formats, all in the same one, take that
path, and for batch norm only with more than one value per channel; anything else (empty
tensors, strided views, mixed layouts or dtypes, broadcasting, the one-value-per-channel case
torch refuses) runs torch's own meta implementation, and nothing changes on real tensors.
:class:`FastMeta` applies :func:`call` to every operation under it (a dispatch mode);
:class:`~experiments.measure.tensor_memory.TensorMemoryTracker` calls it itself.
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _dense_strides(shape, memory_format):
    """The strides of a dense tensor of ``shape`` in ``memory_format``."""
    return torch.empty(shape, device="meta", memory_format=memory_format).stride()


def _memory_format(tensor):
    """The memory format whose dense strides ``tensor`` has exactly, or ``None``."""
    formats = [torch.contiguous_format]
    if tensor.dim() == 4:
        formats.append(torch.channels_last)
    elif tensor.dim() == 5:
        formats.append(torch.channels_last_3d)
    stride = tensor.stride()
    return next((f for f in formats if _dense_strides(tensor.shape, f) == stride), None)


def _shared_dense_format(*tensors):
    """The memory format in which ``tensors``, meta tensors of one shape, strides and floating
    dtype, are all laid out densely, or ``None`` (other tensors, or no such format)."""
    first = tensors[0]
    if not (all(isinstance(t, torch.Tensor) and t.is_meta and t.shape == first.shape
                and t.stride() == first.stride() and t.dtype == first.dtype
                and t.storage_offset() == 0 for t in tensors)
            and first.dtype.is_floating_point and first.numel() > 0):
        return None
    return _memory_format(first)


def _new(tensor, memory_format):
    """A new meta tensor of ``tensor``'s shape and dtype in ``memory_format``."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta",
                       memory_format=memory_format)


def _computation_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _channel_vector(input, dtype):
    return torch.empty(input.shape[1], dtype=dtype, device="meta")


def _batch_norm_format(*tensors):
    """The memory format of ``tensors`` (the activation-sized arguments) where batch norm on
    them is answered here, or ``None``."""
    first = tensors[0]
    if first.dim() < 2 or first.numel() <= first.shape[1]:
        return None
    return _shared_dense_format(*tensors)


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    memory_format = _batch_norm_format(input)
    if memory_format is None:
        return None
    statistics_dtype = _computation_dtype(input.dtype)
    return (_new(input, memory_format),
            _channel_vector(input, statistics_dtype), _channel_vector(input, statistics_dtype))


def _batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                         save_invstd, train, eps, output_mask):
    memory_format = _batch_norm_format(grad_out, input)
    if memory_format is None:
        return None
    parameter_dtype = input.dtype if weight is None else weight.dtype
    return (_new(input, memory_format),
            _channel_vector(input, parameter_dtype) if output_mask[1] else None,
            _channel_vector(input, parameter_dtype) if output_mask[2] else None)


def _like_operands(*operands):
    """An output like the first of ``operands`` where they share one dense layout."""
    memory_format = _shared_dense_format(*operands)
    return None if memory_format is None else _new(operands[0], memory_format)


def _relu(self):
    return _like_operands(self)


def _add_or_mul(self, other, **alpha):
    """Also where ``other`` is a number, or a view of ``self``'s shape and dtype in any layout
    (autograd adds a DenseNet's feature-map gradients into channel slices of a shared storage
    this way, a number of times that grows with the square of the depth): torch lays the
    output out as the first operand whose strides order two dimensions, so ``self`` decides
    every order when its strides are all distinct, as in a dense tensor without dimensions of
    size 1."""
    if isinstance(other, (int, float)) and not isinstance(other, bool):
        return _like_operands(self)
    if (isinstance(other, torch.Tensor) and other.is_meta and other.shape == self.shape
            and other.dtype == self.dtype and all(size > 1 for size in self.shape)):
        return _like_operands(self)
    return None


def _threshold_backward(grad_output, self, threshold):
    return _like_operands(grad_output, self)


def _normal_(self, *args, **kwargs):
    """On the meta device, the tensor itself (no values to draw; torch's random generators
    are not advanced there either)."""
    return self if self.is_meta else None


_FAST = {aten.native_batch_norm.default: _batch_norm,
         aten.native_batch_norm_backward.default: _batch_norm_backward,
         aten.add.Tensor: _add_or_mul,
         aten.mul.Tensor: _add_or_mul,
         aten.threshold_backward.default: _threshold_backward,
         aten.relu.default: _relu,
         aten.normal_.default: _normal_}


def call(func, args, kwargs):
    """``func(*args, **kwargs)``, with the operations of the module docstring on meta tensors
    answered directly."""
    fast = _FAST.get(func)
    if fast is not None:
        out = fast(*args, **kwargs)
        if out is not None:
            return out
    return func(*args, **kwargs)


class FastMeta(TorchDispatchMode):
    """Every operation under this mode runs through :func:`call`."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return call(func, args, kwargs or {})


__all__ = ["FastMeta", "call"]
