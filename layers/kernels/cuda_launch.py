"""Launching compiled ``numba.cuda`` kernels on torch tensors at the cost of one driver call.

A launch through numba's dispatcher costs far more host time than our kernels take on a large
GPU: each torch tensor argument becomes a ``DeviceNDArray`` through
``__cuda_array_interface__``, and numba types every argument and looks up the overload, tens
of microseconds per launch, while the kernels of a whole layer step take a fraction of a
millisecond on a 100 MB tensor on a current GPU. A step of half a dozen launches through
numba is host-bound at every size.

:class:`FastLauncher` takes the first launch of each kernel, argument types and device through
numba (which compiles, or loads from the disk cache, and binds the kernel to the device), then
keeps the compiled overload and launches it from then on with ``cuda.core.launch`` on
arguments packed straight from the tensors: for an array, numba's own data model of it
(``meminfo``, ``parent``, item count, item size, data pointer, shape, strides in bytes, the
order of ``numba.cuda``'s ``_Kernel._prepare_args``), for a scalar its C value. No
``DeviceNDArray``, no typing, no context push per launch.

It falls back to numba's launch (``launch`` returns ``False``) where its assumptions do not
hold: the first launch of a signature, a thread whose current CUDA context is not the one numba
compiled the kernel into (the fast path never switches contexts), and argument types it does
not pack (it packs C-contiguous arrays and ``int64``, ``float32``, ``float64`` scalars, all
that the kernels of :mod:`.cuda` take). Kernels run on torch's current stream of the device
either way, ordered with the surrounding torch work.
"""
import ctypes
import functools

import torch
from cuda.bindings import driver
from cuda.core import LaunchConfig, Stream, launch


class FastLauncher:
    """The compiled overloads of numba CUDA dispatchers, launched without the dispatcher."""

    def __init__(self):
        #: ``(dispatcher, device index, argument key)`` -> ``(kernel, packers)`` or ``None``
        #: (not packable: always numba's launch).
        self._compiled = {}

    def launch(self, dispatcher, grid, block, device_index, args):
        """Launch ``dispatcher``'s compiled overload for ``args`` on torch's current stream of
        device ``device_index``; ``False`` (nothing launched) where numba must launch it."""
        entry = self._compiled.get((dispatcher, device_index, _argument_key(args)))
        if entry is None or _current_context() != _context_of(device_index):
            return False
        kernel, packers = entry
        packed = []
        for pack, value in zip(packers, args):
            pack(value, packed)
        launch(_stream(torch._C._cuda_getCurrentRawStream(device_index)), _config(grid, block),
               kernel, *packed)
        return True

    def register(self, dispatcher, device_index, args, arrays):
        """Keep the overload numba just launched for ``args`` (``arrays``: the arguments as
        numba received them), for :meth:`launch` to use from the next launch on."""
        key = (dispatcher, device_index, _argument_key(args))
        if key in self._compiled:
            return
        argument_types = tuple(dispatcher.typeof_pyval(a) for a in arrays)
        overload = dispatcher.overloads.get(argument_types)
        packers = None if overload is None else _packers(overload.argument_types)
        if packers is None:
            self._compiled[key] = None
            return
        from numba import cuda
        with cuda.gpus[device_index]:
            kernel = overload._codelibrary.get_cufunc().kernel  # bound by numba's launch
        self._compiled[key] = (kernel, packers)


def _argument_key(args):
    """What selects a kernel's overload: each tensor's dtype, number of dimensions and
    contiguity, each scalar's Python type."""
    return tuple((a.dtype, a.dim(), a.is_contiguous()) if isinstance(a, torch.Tensor)
                 else type(a) for a in args)


def _packers(argument_types):
    """One function per argument that appends its kernel parameters to a list, following the
    overload's ``argument_types``; ``None`` if some type is not packed here."""
    from numba.cuda import types
    scalars = {types.int64: ctypes.c_int64, types.float32: ctypes.c_float,
               types.float64: ctypes.c_double}
    packers = []
    for argument_type in argument_types:
        if isinstance(argument_type, types.Array) and argument_type.layout == "C":
            packers.append(_pack_array)
        elif argument_type in scalars:
            packers.append(functools.partial(_pack_scalar, scalars[argument_type]))
        else:
            return None
    return packers


def _pack_array(tensor, packed):
    """numba's data model of a C-contiguous array argument (see the module docstring)."""
    itemsize = tensor.element_size()
    packed += (0, 0, tensor.numel(), itemsize, tensor.data_ptr())
    packed += tensor.shape
    packed += [stride * itemsize for stride in tensor.stride()]


def _pack_scalar(c_type, value, packed):
    packed.append(c_type(value))


def _current_context():
    """The handle of the calling thread's current CUDA context (0: none)."""
    _, context = driver.cuCtxGetCurrent()
    return 0 if context is None else int(context)


@functools.lru_cache(maxsize=None)
def _context_of(device_index):
    """The handle of the context numba compiles into and launches in on ``device_index`` (the
    device's primary context, which torch uses too)."""
    from numba import cuda
    with cuda.gpus[device_index]:
        return _current_context()


@functools.lru_cache(maxsize=64)
def _stream(handle):
    """``cuda.core``'s wrapper of the torch stream ``handle``."""
    return Stream.from_handle(handle)


@functools.lru_cache(maxsize=1024)
def _config(grid, block):
    return LaunchConfig(grid=grid, block=block)
