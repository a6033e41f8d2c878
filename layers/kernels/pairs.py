"""bfloat16 rows read as pairs of elements per 32-bit word: element-wise loops without shuffles.

A bfloat16 is the top half of a float32, so a 32-bit word holding two consecutive bfloat16
elements gives two float32 values with one integer operation each: the word shifted up by 16
bits is the first (lower-address) element, the word with its low half cleared the second.
Back, the two rounded float32 values (:func:`_rounded_high`: each bfloat16 in the top half of
its lane) merge into one word with a shift, a mask and an or. All of it is lane-wise integer
arithmetic. LLVM's vectorisation of the scalar loops of :mod:`.cpu` instead widens each 16-bit
element to 32 bits and narrows it back with cross-lane shuffles (``vpmovzxwd``, ``vpmovdw``),
which issue on few ports and bound those loops.

:func:`scale_shift_act_row` writes the forward's element-wise loop over a row this way, in LLVM
vector IR, 32 elements (sixteen words) per step. A row's last step is the row's last 32
elements, loaded before the other steps run and stored after them: it overlaps the step before
it, whose elements it computes again from the same inputs (so in place too, each element
is written with the same value twice), instead of a masked step that would leave the next
row's first load waiting on a partial store. Rows shorter than one step keep the scalar loop.

The arithmetic per element is the scalar loop's (:func:`.common.act_forward` of ``x * a + b``,
rounded to nearest even with NaN as ``0x7FC0`` as in :mod:`.codecs`), so the results are the
same bit for bit; numba applies the calling kernel's fast-math flags to these instructions as
to its own, so a kernel that contracts ``x * a + b`` into a fused multiply-add contracts both.
Only the activations with a closed form in a few instructions have a vector body
(identity and leaky ReLU); ELU keeps the scalar loop.
"""
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from .common import ACT_IDENTITY, ACT_LEAKY_RELU

#: Elements per vector step: sixteen 32-bit words of two bfloat16 each (one AVX-512 register).
STEP = 32

_I32, _I64, _FLOAT = ir.IntType(32), ir.IntType(64), ir.FloatType()
_WORDS = ir.VectorType(_I32, STEP // 2)
_FLOATS = ir.VectorType(_FLOAT, STEP // 2)
_ELEMENTS = ir.VectorType(ir.IntType(16), STEP)


def _splat(vector_type, value):
    """A constant vector of ``vector_type`` with every lane ``value``."""
    return ir.Constant(vector_type, [ir.Constant(vector_type.element, value)] * vector_type.count)


def _broadcast(builder, value):
    """The float32 LLVM ``value`` in every lane of a vector of :data:`_FLOATS`."""
    single = builder.insert_element(ir.Constant(_FLOATS, ir.Undefined), value,
                                    ir.Constant(_I32, 0))
    return builder.shuffle_vector(single, single, _splat(_WORDS, 0))


def _rounded_high(builder, values):
    """The bfloat16 nearest each float32 lane of ``values`` (ties to even, NaN as ``0x7FC0``)
    in the top half of each 32-bit lane, the low half left over from the rounding: the
    arithmetic of :func:`.codecs._bits_from` before its shift down."""
    bits = builder.bitcast(values, _WORDS)
    low_bit = builder.and_(builder.lshr(bits, _splat(_WORDS, 16)), _splat(_WORDS, 1))
    rounded = builder.add(bits, builder.add(_splat(_WORDS, 0x7FFF), low_bit))
    is_nan = builder.fcmp_unordered("uno", values, values)
    return builder.select(is_nan, _splat(_WORDS, 0x7FC00000), rounded)


def _unpack(builder, words):
    """The float32 values of the first and of the second element of each word."""
    first = builder.shl(words, _splat(_WORDS, 16))
    second = builder.and_(words, _splat(_WORDS, 0xFFFF0000))
    return builder.bitcast(first, _FLOATS), builder.bitcast(second, _FLOATS)


def _pack(builder, first, second):
    """Words of the bfloat16 of ``first`` (low half: the first element) and of ``second``."""
    low = builder.lshr(_rounded_high(builder, first), _splat(_WORDS, 16))
    high = builder.and_(_rounded_high(builder, second), _splat(_WORDS, 0xFFFF0000))
    return builder.or_(low, high)


class _RowStep:
    """The code of one step of :func:`scale_shift_act_row`: ``act(x * a + b)`` over the 32
    elements at an index of the rows ``src`` and ``dst`` (LLVM pointers to 16-bit elements)."""

    def __init__(self, builder, src, dst, a, b, leaky, slope):
        self.builder, self.src, self.dst = builder, src, dst
        self.a, self.b, self.slope = (_broadcast(builder, value) for value in (a, b, slope))
        self.leaky = leaky

    def _pointer(self, row, index):
        return self.builder.bitcast(self.builder.gep(row, [index]), _ELEMENTS.as_pointer())

    def compute(self, index):
        """The output words of the step at ``index``, from its input words."""
        words = self.builder.bitcast(self.builder.load(self._pointer(self.src, index), align=2),
                                     _WORDS)
        return _pack(self.builder, *(self._act(x) for x in _unpack(self.builder, words)))

    def store(self, words, index):
        """Write the output ``words`` of the step at ``index``."""
        self.builder.store(self.builder.bitcast(words, _ELEMENTS), self._pointer(self.dst, index),
                           align=2)

    def _act(self, x):
        """``act(x * a + b)`` lane by lane, as :func:`.common.act_forward`: identity, or leaky
        ReLU where ``leaky`` (an i1) is set: ``y if y >= 0 else y * slope``."""
        builder = self.builder
        y = builder.fadd(builder.fmul(x, self.a), self.b)
        leaky = builder.select(builder.fcmp_ordered(">=", y, _splat(_FLOATS, 0.0)), y,
                               builder.fmul(y, self.slope))
        return builder.select(self.leaky, leaky, y)


@intrinsic
def _scale_shift_act_row(typingctx, src, dst, a, b, leaky, slope):
    if not all(isinstance(row, types.Array) and row.ndim == 1 and row.dtype == types.uint16
               for row in (src, dst)):
        return None

    def codegen(context, builder, signature, args):
        src_type, dst_type, a_type, b_type, leaky_type, slope_type = signature.args
        src_array = context.make_array(src_type)(context, builder, args[0])
        dst_array = context.make_array(dst_type)(context, builder, args[1])
        a_value, b_value, slope_value = (context.cast(builder, value, kind, types.float32)
                                         for value, kind in ((args[2], a_type), (args[3], b_type),
                                                             (args[5], slope_type)))
        step = _RowStep(builder, src_array.data, dst_array.data, a_value, b_value,
                        context.cast(builder, args[4], leaky_type, types.boolean), slope_value)
        size = builder.extract_value(src_array.shape, 0)
        last = builder.sub(size, ir.Constant(_I64, STEP))
        last_words = step.compute(last)  # read before the steps that overlap it write
        steps = builder.udiv(builder.add(last, ir.Constant(_I64, STEP - 1)),
                             ir.Constant(_I64, STEP))
        with cgutils.for_range(builder, steps) as loop:
            index = builder.mul(loop.index, ir.Constant(_I64, STEP))
            step.store(step.compute(index), index)
        step.store(last_words, last)
        return context.get_dummy_value()
    return types.none(src, dst, a, b, leaky, slope), codegen


def scale_shift_act_row(src, dst, a, b, act, slope):
    """``dst[t] = act(src[t] * a + b)`` over two 1-D rows of the same length, the same row (in
    place) or rows that do not overlap, where this module has a vector body for them: bfloat16
    bits (``uint16``) of at least :data:`STEP` elements, identity or leaky ReLU (``slope``).
    Returns whether it ran; it writes nothing where it returns False. Compiled code only."""


@overload(scale_shift_act_row, inline="always")
def _scale_shift_act_row_overload(src, dst, a, b, act, slope):
    if not (isinstance(src, types.Array) and src.dtype == types.uint16):
        return lambda src, dst, a, b, act, slope: False

    def implementation(src, dst, a, b, act, slope):
        if src.size < STEP or not (act == ACT_IDENTITY or act == ACT_LEAKY_RELU):
            return False
        _scale_shift_act_row(src, dst, a, b, act == ACT_LEAKY_RELU, slope)
        return True
    return implementation
