"""16-bit floating-point data in the kernels: stored as 16 bits, computed in float32.

numba has no ``bfloat16`` type on either target and no ``float16`` on the CPU, so the kernels
receive such tensors as arrays of 16-bit integers holding the bits, and convert each element
in registers: :func:`load` on every read, :func:`store` on every write. Everything in between
(the activation, the statistics, the per-channel constants) runs in float32, and the sums in
float32 blocks added up in float64, as for float32 data. float32 and float64 data pass through
both functions unchanged.

The array each backend receives for a tensor of each dtype (the element type tells
:func:`load` and :func:`store` what the bits are, at compile time):

=============  =========================  ==========================================
tensor dtype   CPU kernels (numba.njit)   CUDA kernels (numba.cuda, and simulator)
=============  =========================  ==========================================
float16        int16 (the bits)           float16 (numba.cuda converts in hardware)
bfloat16       uint16 (the bits)          uint16 (the bits)
float32/64     itself                     itself
=============  =========================  ==========================================

The conversions equal torch's bit for bit: a bfloat16 is the top half of a float32 (loading
shifts it up); storing rounds to nearest, ties to even, and keeps NaN a NaN; float16 goes
through LLVM's ``fpext``/``fptrunc`` of ``half`` (IEEE round to nearest even).

:func:`load`, :func:`store` and :func:`compute_empty` are plain Python functions as well: that
is what runs under numba's CUDA simulator (which executes kernels as Python), and the
reference the compiled conversions are tested against. Compiled code gets their LLVM
versions from :func:`compiled_for_cpu` and :func:`compiled_for_cuda`.
"""
import numpy as np
import torch
from llvmlite import ir
from numba.core import types

#: Tensor dtypes the kernels take, and the dtype their arithmetic runs in.
COMPUTE_DTYPES = {
    torch.float64: torch.float64,
    torch.float32: torch.float32,
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
}


def compute_dtype(dtype):
    """The dtype the kernels compute in for data of (torch) ``dtype``."""
    return COMPUTE_DTYPES[dtype]


def epsneg(dtype):
    """The gap below 1 of (torch) ``dtype``: ``2 ** -(mantissa bits + 1)``."""
    return torch.finfo(dtype).eps / 2


# --------------------------------------------------------------------------- arrays
#: 16-bit tensor dtype -> the integer dtype whose bits the CPU kernels receive (see the table).
_CPU_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.uint16}


def cpu_array(tensor):
    """Zero-copy numpy view of a CPU tensor as the CPU kernels take it (see the table)."""
    t = tensor.detach() if tensor.requires_grad else tensor
    bits = _CPU_BITS.get(t.dtype)
    return (t if bits is None else t.view(bits)).numpy()


#: Tensor dtype -> a numpy scalar of the element type the CPU kernels see (see the table): what
#: a kernel that reads a tensor by its address is told the elements are (:func:`cpu_element`).
_CPU_ELEMENTS = {torch.float64: np.float64(0), torch.float32: np.float32(0),
                 torch.float16: np.int16(0), torch.bfloat16: np.uint16(0)}


def cpu_element(dtype):
    """A numpy scalar (its value unused) of the element type the CPU kernels see for tensors of
    (torch) ``dtype``, as :func:`cpu_array` gives it (see the table)."""
    return _CPU_ELEMENTS[dtype]


def cuda_tensor(tensor):
    """The tensor whose ``__cuda_array_interface__`` the CUDA kernels take (see the table)."""
    t = tensor.detach()
    return t.view(torch.uint16) if t.dtype == torch.bfloat16 else t


def simulator_array(tensor):
    """Zero-copy numpy view of a CPU tensor as the simulated CUDA kernels take it."""
    t = cuda_tensor(tensor)
    return t.numpy()


def compute_scalar(value, array):
    """``value`` as a numpy scalar of the compute type of ``array``'s data (float32 loops stay
    in float32, and 16-bit data computes in float32)."""
    return np.float64(value) if array.dtype.type is np.float64 else np.float32(value)


# --------------------------------------------------------------------------- Python reference
def _float32_from_bfloat16_bits(bits):
    return np.array(np.uint32(bits) << np.uint32(16), np.uint32).view(np.float32)[()]


def _round_to_bfloat16(bits, is_nan):
    """The bfloat16 nearest the float32 with ``bits`` (a uint32), ties to even; a quiet NaN
    if ``is_nan``. Integer arithmetic only: the Python reference and the compiled code."""
    half = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    rounded = np.uint16((bits + half) >> np.uint32(16))
    return np.uint16(0x7FC0) if is_nan else rounded


def _bfloat16_bits_from_float32(value):
    value = np.float32(value)
    return _round_to_bfloat16(np.array(value).view(np.uint32)[()], value != value)


def load(value):
    """The element ``value`` of a kernel's array in its compute type (see the table)."""
    if isinstance(value, np.uint16):
        return _float32_from_bfloat16_bits(value)
    if isinstance(value, np.int16):
        return np.array(value, np.int16).view(np.float16)[()].astype(np.float32)
    if isinstance(value, np.float16):
        return np.float32(value)
    return value


def store(value, out):
    """``value`` (compute type) as an element of the array ``out`` (see the table)."""
    if out.dtype == np.uint16:
        return _bfloat16_bits_from_float32(value)
    if out.dtype == np.int16:
        return np.array(np.float16(value)).view(np.int16)[()]
    return value


def compute_empty(shape, like):
    """An uninitialised array of ``shape`` in the compute type of the array ``like``."""
    return np.empty(shape, np.float64 if like.dtype.type is np.float64 else np.float32)


# --------------------------------------------------------------------------- compiled
# Both conversions are written in LLVM IR, which the CPU and the CUDA targets compile alike:
# intrinsics need no device to be typed (an overload on numba.cuda does).
_I16, _I32, _HALF, _FLOAT = ir.IntType(16), ir.IntType(32), ir.HalfType(), ir.FloatType()


def _float32_from(builder, value, kind):
    """LLVM: the float32 of a 16-bit ``value`` of numba type ``kind``."""
    if kind == types.uint16:  # bfloat16 bits: the top half of a float32
        word = builder.shl(builder.zext(value, _I32), ir.Constant(_I32, 16))
        return builder.bitcast(word, _FLOAT)
    # IEEE half bits: numba's float16 is an i16 in LLVM on both targets, as int16 is.
    half = value if value.type == _HALF else builder.bitcast(value, _HALF)
    return builder.fpext(half, _FLOAT)


def constant(kind, value):
    """An LLVM constant of type ``kind`` with ``value``, in every lane where ``kind`` is a vector
    type."""
    if isinstance(kind, ir.VectorType):
        return ir.Constant(kind, [ir.Constant(kind.element, value)] * kind.count)
    return ir.Constant(kind, value)


def rounded_bfloat16_word(builder, value):
    """LLVM: a float32 ``value`` (or vector of them) rounded to the nearest bfloat16, ties to
    even, NaN as ``0x7FC0``: a 32-bit word (or vector of them) with the bfloat16's bits in its
    top half, its low half left over from the rounding. The one rounding of the compiled
    :func:`store` and of :mod:`.pairs`."""
    word = ir.VectorType(_I32, value.type.count) if isinstance(value.type, ir.VectorType) \
        else _I32
    bits = builder.bitcast(value, word)
    low_bit = builder.and_(builder.lshr(bits, constant(word, 16)), constant(word, 1))
    rounded = builder.add(bits, builder.add(constant(word, 0x7FFF), low_bit))
    is_nan = builder.fcmp_unordered("uno", value, value)
    return builder.select(is_nan, constant(word, 0x7FC00000), rounded)


def _bits_from(builder, value, kind):
    """LLVM: a float32 ``value`` as an element of numba type ``kind`` (16-bit)."""
    if kind == types.uint16:  # round to nearest, ties to even; NaN -> 0x7FC0
        word = rounded_bfloat16_word(builder, value)
        return builder.trunc(builder.lshr(word, ir.Constant(_I32, 16)), _I16)
    return builder.bitcast(builder.fptrunc(value, _HALF), _I16)


#: numba types of 16-bit data in the kernels' arrays (and of numba's own float16).
SIXTEEN_BIT_TYPES = (types.uint16, types.int16, types.float16)


def _load_typer(typingctx, value):
    """Typing and code of the compiled :func:`load`."""
    if value in SIXTEEN_BIT_TYPES:
        def codegen(context, builder, signature, args):
            return _float32_from(builder, args[0], value)
        return types.float32(value), codegen
    if isinstance(value, types.Float):
        return value(value), lambda context, builder, signature, args: args[0]
    return None


def _store_typer(typingctx, value, out):
    """Typing and code of the compiled :func:`store`."""
    if not (isinstance(out, types.Array) and isinstance(value, (types.Float, types.Integer))):
        return None
    kind = out.dtype

    def codegen(context, builder, signature, args):
        if kind in SIXTEEN_BIT_TYPES:
            single = context.cast(builder, args[0], value, types.float32)
            return _bits_from(builder, single, kind)
        return context.cast(builder, args[0], value, kind)
    return kind(value, out), codegen


def _compute_empty_overload(shape, like):
    dtype = np.float64 if like.dtype == types.float64 else np.float32
    return lambda shape, like: np.empty(shape, dtype)


def compiled_for_cpu():
    """``(load, store, compute_empty)`` for ``numba.njit`` code."""
    from numba.extending import intrinsic, overload
    overload(compute_empty, inline="always")(_compute_empty_overload)
    return intrinsic(_load_typer), intrinsic(_store_typer), compute_empty


def compiled_for_cuda():
    """``(load, store)`` for ``numba.cuda.jit`` code (the Python functions themselves under
    the simulator, which runs kernels as Python)."""
    from numba import config
    if config.ENABLE_CUDASIM:
        return load, store
    from numba.cuda.extending import intrinsic
    return intrinsic(_load_typer), intrinsic(_store_typer)


__all__ = ["COMPUTE_DTYPES", "SIXTEEN_BIT_TYPES", "compute_dtype", "epsneg", "cpu_array",
           "cuda_tensor", "simulator_array", "compute_scalar", "load", "store",
           "compute_empty", "compiled_for_cpu", "compiled_for_cuda"]
