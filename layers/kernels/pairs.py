"""bfloat16 rows read as pairs of elements per 32-bit word: element-wise loops without shuffles.

A bfloat16 is the top half of a float32, so a 32-bit word holding two consecutive bfloat16
elements gives two float32 values with one integer operation each: the word shifted up by 16
bits is the first (lower-address) element, the word with its low half cleared the second.
Back, the two rounded float32 values (:func:`.codecs.rounded_bfloat16_word`: each bfloat16 in
the top half of its lane, the rounding the scalar stores use too) merge into one word with a
shift, a mask and an or. All of it is lane-wise integer arithmetic. LLVM's vectorisation of the
scalar loops of :mod:`.cpu` instead widens each 16-bit element to 32 bits and narrows it back
with cross-lane shuffles (``vpmovzxwd``, ``vpmovdw``), which issue on few ports and bound those
loops. On hosts with AVX512-BF16, one conversion instruction and one permutation round and
merge a step instead, wherever no lane of it is NaN or subnormal (:func:`_pack`): the same bits,
in fewer instructions.

Two element-wise loops of the CPU kernels are written this way, in LLVM vector IR, 32 elements
(sixteen words) per step (:func:`_emit_row`): the forward's ``act(x * a + b)``
(:func:`scale_shift_act_row`) and the backward's input gradient (:func:`input_gradient_row`).
Rows shorter than one step, and ELU, keep the scalar loops. The arithmetic per element is the
scalar loops' (:mod:`.common`'s activation formulas, rounded to nearest even with NaN as
``0x7FC0`` as in :mod:`.codecs`), in the same order, so the results are the same bit for bit;
numba applies the calling kernel's fast-math flags to these instructions as to its own, so a
kernel that contracts ``x * a + b`` into a fused multiply-add contracts both.
"""
import numba
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from .codecs import constant, rounded_bfloat16_word
from .common import ACT_IDENTITY, ACT_LEAKY_RELU, MODE_XHAT_FROM_X
from .target import compiles_for, emit_prefetch

#: Elements per vector step: sixteen 32-bit words of two bfloat16 each (one AVX-512 register).
STEP = 32

_I16, _I32, _I64, _FLOAT = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_WORDS = ir.VectorType(_I32, STEP // 2)
_FLOATS = ir.VectorType(_FLOAT, STEP // 2)
_ELEMENTS = ir.VectorType(_I16, STEP)
_LANE_FLAGS = ir.VectorType(ir.IntType(1), STEP // 2)


class _BFloat16Type(ir.Type):
    """LLVM's ``bfloat``, which llvmlite's IR builder has no class for: the element type of the
    hardware conversion's result (:func:`_converted_pack`), only ever bitcast."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat16Type)

    def __hash__(self):
        return hash(_BFloat16Type)


_BFLOAT16 = _BFloat16Type()
#: ``vfpclassps`` classes: quiet NaN (bit 0), subnormal (bit 5), signalling NaN (bit 7).
_NAN_OR_SUBNORMAL = 0x01 | 0x20 | 0x80
#: Positions of a step's elements when the first of each word are in the low half of a vector
#: and the second in the high half.
_INTERLEAVE = ir.Constant(ir.VectorType(_I32, STEP),
                          [half + i for i in range(STEP // 2) for half in (0, STEP // 2)])

#: Whether the packing may use AVX512-BF16's conversion (:func:`_pack`): where the host has
#: it, one instruction rounds what the integer rounding alone takes several for, in the
#: forward's loop and in the input gradient's. ``python -m experiments.bench_kernels --dtypes
#: bfloat16`` with this flag on and off measures it.
HARDWARE_ROUNDING = compiles_for("avx512bf16")


def _broadcast(builder, value):
    """The float32 LLVM ``value`` in every lane of a vector of :data:`_FLOATS`."""
    single = builder.insert_element(ir.Constant(_FLOATS, ir.Undefined), value,
                                    ir.Constant(_I32, 0))
    return builder.shuffle_vector(single, single, constant(_WORDS, 0))


def _unpack(builder, words):
    """The float32 values of the first and of the second element of each word."""
    first = builder.shl(words, constant(_WORDS, 16))
    second = builder.and_(words, constant(_WORDS, 0xFFFF0000))
    return builder.bitcast(first, _FLOATS), builder.bitcast(second, _FLOATS)


def _rounded_pack(builder, first, second):
    """Words of the bfloat16 of ``first`` (low half: the first element) and of ``second``,
    rounded in integer arithmetic (:func:`.codecs.rounded_bfloat16_word`)."""
    low = builder.lshr(rounded_bfloat16_word(builder, first), constant(_WORDS, 16))
    high = builder.and_(rounded_bfloat16_word(builder, second), constant(_WORDS, 0xFFFF0000))
    return builder.or_(low, high)


def _exceptional(builder, values):
    """The lanes of the float32 vector ``values`` that are NaN or subnormal (x86's
    ``vfpclassps``): those the hardware conversion rounds differently (:func:`_converted_pack`)."""
    classify = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_LANE_FLAGS, [_FLOATS, _I32]),
        "llvm.x86.avx512.fpclass.ps.512")
    return builder.call(classify, [values, ir.Constant(_I32, _NAN_OR_SUBNORMAL)])


def _converted_pack(builder, first, second):
    """:func:`_rounded_pack` by AVX512-BF16's conversion (``vcvtne2ps2bf16``, the elements in
    two halves) and one permutation that interleaves them. It rounds to nearest even as
    :func:`_rounded_pack` does, but reads subnormal inputs as zero and keeps a NaN's sign and
    payload: right only where no lane of either vector is NaN or subnormal."""
    convert = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VectorType(_BFLOAT16, STEP), [_FLOATS, _FLOATS]),
        "llvm.x86.avx512bf16.cvtne2ps2bf16.512")
    halves = builder.bitcast(builder.call(convert, [second, first]), _ELEMENTS)  # first: low
    interleaved = builder.shuffle_vector(halves, halves, _INTERLEAVE)
    return builder.bitcast(interleaved, _WORDS)


def _pack(builder, first, second):
    """Words of the bfloat16 of ``first`` (low half: the first element) and of ``second``.

    Where the code may use AVX512-BF16 (:data:`HARDWARE_ROUNDING`), by the hardware
    conversion, unless a lane of either vector is NaN or subnormal, which branch to the
    integer rounding; else by the integer rounding. Both give the same bits for every float32
    value (checked on all 2 ** 32 once; the tests check every top half with low halves around
    the rounding's tie, with NaN and subnormal lanes alone in a step and mixed into steps of
    normal ones)."""
    if not HARDWARE_ROUNDING:
        return _rounded_pack(builder, first, second)
    flags = builder.or_(_exceptional(builder, first), _exceptional(builder, second))
    exceptional = builder.icmp_unsigned("!=", builder.bitcast(flags, _I16),
                                        ir.Constant(_I16, 0))
    with builder.if_else(exceptional, likely=False) as (rounded, converted):
        with rounded:
            rounded_words, rounded_block = _rounded_pack(builder, first, second), builder.block
        with converted:
            converted_words = _converted_pack(builder, first, second)
            converted_block = builder.block
    words = builder.phi(_WORDS)
    words.add_incoming(rounded_words, rounded_block)
    words.add_incoming(converted_words, converted_block)
    return words


def _row_pointer(builder, row, index):
    """Pointer to the step of 32 elements at ``index`` of ``row`` (a pointer to 16-bit data)."""
    return builder.bitcast(builder.gep(row, [index]), _ELEMENTS.as_pointer())


def _emit_row(builder, size, sources, destination, element_values, prefetched, ahead):
    """Code of one row: for each step of 32 elements, the words of ``sources`` (LLVM pointers to
    rows of ``size`` bfloat16 elements) unpacked, ``element_values(builder, values)`` (one
    float32 vector per source, in their order; the result's float32 vector) for the first and
    for the second element of each word, packed and stored at ``destination``, which may be
    one of the sources (in place).

    Prefetching (:func:`.target.emit_prefetch`): where ``ahead`` (an i64) is not 0, every step
    but the last two prefetches, for each ``(pointer, wanted)`` of ``prefetched`` (``pointer``
    one of ``sources``; ``wanted`` an i1, or None for always), the cache line ``ahead``
    elements after the step's first element there (a step is 64 bytes, one line): with
    ``ahead`` the distance to the rows a kernel computes next, the memory reads them while the
    core computes this row. The lines the last two steps would give are read on
    demand later. Prefetching changes no result, and an address outside the data does not
    fault.

    The steps start at every multiple of 32 below ``size - 32``, and one more step covers the
    row's last 32 elements (``size`` is at least :data:`STEP`); it overlaps the step before it,
    the only one it overlaps, so both of those read their inputs before either writes. In
    place, the overlapped elements are thus computed twice from the same inputs and written
    twice with the same value, and no step is masked: with a masked last step the normalize
    pass over 7x7 maps ran at about half the speed (the next row's first load likely waits
    on the partial store). The reads go up the row in order, as the hardware prefetchers
    expect: with the last step read first, before the others, the input-gradient pass over
    14x14 maps read from memory took twice as long. The ``normalize_act`` and
    ``backward_input_in_place`` passes of ``python -m experiments.bench_kernels --dtypes
    bfloat16 --shapes 32 2048 7 7 32 1024 14 14`` measure both."""
    def compute(index):
        words = [builder.bitcast(builder.load(_row_pointer(builder, row, index), align=2),
                                 _WORDS) for row in sources]
        firsts, seconds = zip(*(_unpack(builder, w) for w in words))
        return _pack(builder, element_values(builder, firsts), element_values(builder, seconds))

    def store(words, index):
        builder.store(builder.bitcast(words, _ELEMENTS), _row_pointer(builder, destination, index),
                      align=2)

    def steps(count, prefetches):
        with cgutils.for_range(builder, count) as loop:
            index = builder.mul(loop.index, step)
            if prefetches:
                for pointer, wanted in prefetched:
                    address = builder.gep(pointer, [builder.add(index, ahead)])
                    if wanted is None:
                        emit_prefetch(builder, address)
                    else:
                        with builder.if_then(wanted):
                            emit_prefetch(builder, address)
            store(compute(index), index)

    step, zero = ir.Constant(_I64, STEP), ir.Constant(_I64, 0)
    last = builder.sub(size, step)
    # steps before the last one: ceil(last / STEP); all but the final one in the loop
    before_last = builder.udiv(builder.add(last, ir.Constant(_I64, STEP - 1)), step)
    looped = builder.select(builder.icmp_unsigned(">", before_last, zero),
                            builder.sub(before_last, ir.Constant(_I64, 1)), zero)
    with builder.if_else(builder.icmp_signed("!=", ahead, zero)) as (with_prefetches, without):
        with with_prefetches:
            steps(looped, True)
        with without:
            steps(looped, False)
    final = builder.mul(looped, step)  # 0 = last where the row is one step long: stored twice
    final_words, last_words = compute(final), compute(last)
    store(final_words, final)
    store(last_words, last)


def _is_row(kind):
    """Whether the numba type ``kind`` is a contiguous 1-D array of bfloat16 bits: the steps
    load and store 32 consecutive elements from the row's start (a strided row, e.g. of a
    view that skips elements, keeps the scalar loops)."""
    return (isinstance(kind, types.Array) and kind.ndim == 1 and kind.dtype == types.uint16
            and kind.layout == "C")


def _arguments(context, builder, signature, args):
    """Each argument as codegen uses it: a row as the pointer to its data (and its size, in
    ``sizes``), a boolean as an i1, an integer as an i64, a float as a float32 vector with it
    in every lane."""
    values, sizes = [], []
    for value, kind in zip(args, signature.args):
        if _is_row(kind):
            array = context.make_array(kind)(context, builder, value)
            values.append(array.data)
            sizes.append(builder.extract_value(array.shape, 0))
        elif isinstance(kind, types.Integer):
            values.append(context.cast(builder, value, kind, types.int64))
        elif isinstance(kind, types.Boolean):
            values.append(value)
        else:
            values.append(_broadcast(builder, context.cast(builder, value, kind, types.float32)))
    return values, sizes


@intrinsic
def _scale_shift_act_row(typingctx, src, dst, a, b, leaky, slope, ahead):
    """``dst = act(src * a + b)`` (:func:`scale_shift_act_row`); ``leaky``: leaky ReLU, else
    identity."""
    if not (_is_row(src) and _is_row(dst) and isinstance(ahead, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        (src_row, dst_row, a_lanes, b_lanes, is_leaky, slope_lanes, ahead), (size, _) = \
            _arguments(context, builder, signature, args)

        def element_values(builder, values):
            # act_forward: identity, or y if y >= 0 else y * slope
            y = builder.fadd(builder.fmul(values[0], a_lanes), b_lanes)
            leaky = builder.select(builder.fcmp_ordered(">=", y, constant(_FLOATS, 0.0)), y,
                                   builder.fmul(y, slope_lanes))
            return builder.select(is_leaky, leaky, y)
        _emit_row(builder, size, [src_row], dst_row, element_values, [(src_row, None)], ahead)
        return context.get_dummy_value()
    return types.none(src, dst, a, b, leaky, slope, ahead), codegen


@intrinsic
def _input_gradient_row(typingctx, z, dz, x, p, q, k0, k1, k2, leaky, from_x, slope, out,
                        ahead):
    """``out = dy * k0 + v * k1 + k2`` (:func:`input_gradient_row`); ``leaky``: leaky ReLU, else
    identity; ``from_x``: ``v = x * p + q``, else ``v = act^-1(z) * p + q``. Where ``from_x`` is
    a constant, LLVM drops the loads and arithmetic of the other case, and the prefetches of
    ``x`` (``from_x``) or the test for them (the other modes)."""
    if not (all(_is_row(row) for row in (z, dz, x, out)) and isinstance(ahead, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        values, sizes = _arguments(context, builder, signature, args)
        z_row, dz_row, x_row, p_lanes, q_lanes, k0_lanes, k1_lanes, k2_lanes, is_leaky, \
            is_from_x, slope_lanes, out_row, ahead = values

        def element_values(builder, values):
            zt, dzt, xt = values
            positive = builder.fcmp_ordered(">", zt, constant(_FLOATS, 0.0))
            # act_grad: dz if z > 0 else dz * slope; act_inverse: z if z > 0 else z / slope
            dy = builder.select(is_leaky, builder.select(positive, dzt,
                                                         builder.fmul(dzt, slope_lanes)), dzt)
            y = builder.select(is_leaky, builder.select(positive, zt,
                                                        builder.fdiv(zt, slope_lanes)), zt)
            v = builder.fadd(builder.fmul(builder.select(is_from_x, xt, y), p_lanes), q_lanes)
            return builder.fadd(builder.fadd(builder.fmul(dy, k0_lanes),
                                             builder.fmul(v, k1_lanes)), k2_lanes)
        _emit_row(builder, sizes[0], [z_row, dz_row, x_row], out_row, element_values,
                  [(z_row, None), (dz_row, None), (x_row, is_from_x)], ahead)
        return context.get_dummy_value()
    return types.none(z, dz, x, p, q, k0, k1, k2, leaky, from_x, slope, out, ahead), codegen


@numba.njit(inline="always")
def _has_vector_body(act):
    """Whether the activation ``act`` has a vector body here: identity and leaky ReLU."""
    return act == ACT_IDENTITY or act == ACT_LEAKY_RELU


def scale_shift_act_row(src, dst, a, b, act, slope, ahead):
    """``dst[t] = act(src[t] * a + b)`` over two 1-D rows of the same length, the same row (in
    place) or rows that do not overlap, where this module has a vector body for them:
    contiguous rows of bfloat16 bits (``uint16``) of at least :data:`STEP` elements, identity or
    leaky ReLU (``slope``), float32 scalars. ``ahead``: an integer; where not 0, it prefetches
    the elements ``ahead`` after ``src``'s as it goes (see :func:`_emit_row`). Returns whether
    it ran; it writes nothing and prefetches nothing where it returns False. Compiled code
    only."""


def _float32_scalars(*kinds):
    """Whether all the numba types ``kinds`` are float32: the scalars the scalar loops compute
    with on bfloat16 data (another type would change their arithmetic, and this module's code
    computes in float32 only)."""
    return all(kind == types.float32 for kind in kinds)


@overload(scale_shift_act_row, inline="always")
def _scale_shift_act_row_overload(src, dst, a, b, act, slope, ahead):
    if not (_is_row(src) and _is_row(dst) and _float32_scalars(a, b, slope)):
        return lambda src, dst, a, b, act, slope, ahead: False

    def implementation(src, dst, a, b, act, slope, ahead):
        if src.size < STEP or not _has_vector_body(act):
            return False
        _scale_shift_act_row(src, dst, a, b, act == ACT_LEAKY_RELU, slope, ahead)
        return True
    return implementation


def input_gradient_row(z, dz, x, p, q, k0, k1, k2, act, slope, mode, out, ahead):
    """The backward's input gradient over 1-D rows of the same length, as the CPU kernels'
    scalar loop computes it: ``out[t] = dy * k0 + v * k1 + k2`` with ``dy = act_grad(z, dz)``
    and ``v = u * p + q``, ``u`` the stored input ``x`` (``MODE_XHAT_FROM_X``) or
    ``act^-1(z)`` (the other modes). ``out`` is ``dz`` (in place) or a row that overlaps none
    of the others. Runs where this module has a vector body: contiguous bfloat16 rows
    (``uint16``) of at least :data:`STEP` elements, identity or leaky ReLU (``slope``), float32
    scalars. ``ahead``: where not 0, it prefetches the elements ``ahead`` after ``z``'s and
    ``dz``'s (and ``x``'s, in ``MODE_XHAT_FROM_X``, the one mode that reads ``x``) as it goes.
    Returns whether it ran; it writes nothing and prefetches nothing where it returns False.
    Compiled code only."""


@overload(input_gradient_row, inline="always")
def _input_gradient_row_overload(z, dz, x, p, q, k0, k1, k2, act, slope, mode, out, ahead):
    if not (all(_is_row(row) for row in (z, dz, x, out))
            and _float32_scalars(p, q, k0, k1, k2, slope)):
        return lambda z, dz, x, p, q, k0, k1, k2, act, slope, mode, out, ahead: False

    def implementation(z, dz, x, p, q, k0, k1, k2, act, slope, mode, out, ahead):
        if z.size < STEP or not _has_vector_body(act):
            return False
        _input_gradient_row(z, dz, x, p, q, k0, k1, k2, act == ACT_LEAKY_RELU,
                            mode == MODE_XHAT_FROM_X, slope, out, ahead)
        return True
    return implementation
