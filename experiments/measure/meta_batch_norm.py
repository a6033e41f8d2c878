"""Batch normalization on the ``meta`` device without torch's Python decomposition.

On the meta device an operation only computes its outputs' shapes, dtypes and strides. For
``aten.native_batch_norm`` and its backward torch does that by running their Python
decompositions (``torch._decomp``): a few dozen reference operators each, about 4 ms per call
on a CPU core where a convolution's meta kernel takes 0.4 ms. In a simulated training step of
a DenseNet (the memory experiments' ``--simulate``) they were a third of the time.

:func:`call` runs an operation as torch would, except these two on meta tensors, whose
outputs it creates directly with the shapes, strides and dtypes torch's decompositions give
(``tests/test_measure_meta_batch_norm.py`` compares them with torch's, case by case):

* forward: the output like the input (its dtype, its contiguous or channels-last strides);
  the saved mean and inverse standard deviation ``(C,)`` in the computation dtype (float32
  for 16-bit inputs), in training and in eval alike;
* backward: the input gradient like the input, in its dtype; the weight and
  bias gradients ``(C,)`` in the weight's dtype (the input's without a weight), each only
  where ``output_mask`` asks for it.

Only inputs laid out densely in one of torch's memory formats (in the backward, the output
gradient and the input in the same one), with more than one value per channel, take that path;
anything else (empty tensors, strided views, mixed layouts, the one-value-per-channel case
torch refuses) runs torch's own meta implementation. Nothing is computed on real tensors
either way. :class:`MetaBatchNorm` applies :func:`call` to every operation under it (a dispatch
mode); :class:`~experiments.measure.tensor_memory.TensorMemoryTracker` calls it itself.
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


def _takes_fast_path(*tensors):
    """Whether batch norm on ``tensors`` (the activation-sized arguments) is answered here."""
    first = tensors[0]
    if first.dim() < 2 or first.numel() <= first.shape[1]:  # empty, or one value per channel
        return False
    return all(t.is_meta and t.storage_offset() == 0 and _memory_format(t) is not None
               and t.shape == first.shape and t.stride() == first.stride() for t in tensors)


def _computation_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _channel_vector(input, dtype):
    return torch.empty(input.shape[1], dtype=dtype, device="meta")


def _forward(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if not _takes_fast_path(input):
        return None
    statistics_dtype = _computation_dtype(input.dtype)
    return (torch.empty(input.shape, dtype=input.dtype, device="meta",
                        memory_format=_memory_format(input)),
            _channel_vector(input, statistics_dtype), _channel_vector(input, statistics_dtype))


def _backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train,
              eps, output_mask):
    if not _takes_fast_path(grad_out, input):
        return None
    grad_input = torch.empty(input.shape, dtype=input.dtype, device="meta",
                             memory_format=_memory_format(input))
    parameter_dtype = input.dtype if weight is None else weight.dtype
    return (grad_input,
            _channel_vector(input, parameter_dtype) if output_mask[1] else None,
            _channel_vector(input, parameter_dtype) if output_mask[2] else None)


_FAST = {aten.native_batch_norm.default: _forward,
         aten.native_batch_norm_backward.default: _backward}


def call(func, args, kwargs):
    """``func(*args, **kwargs)``, with batch norm on meta tensors answered directly (see the
    module docstring)."""
    fast = _FAST.get(func)
    if fast is not None:
        out = fast(*args, **kwargs)
        if out is not None:
            return out
    return func(*args, **kwargs)


class MetaBatchNorm(TorchDispatchMode):
    """Every operation under this mode runs through :func:`call`."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return call(func, args, kwargs or {})


__all__ = ["MetaBatchNorm", "call"]
