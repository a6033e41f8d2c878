"""CPU kernels (``numba.njit(parallel=True)``) for the ABN family.

Implements the backend API shared with :mod:`layers.kernels.cuda` (see
:mod:`layers.kernels` for the contract): per-channel ``moments``, the fused ``forward``
``act(x * a + b)``, and the two backward passes ``backward_reduce`` and ``backward_input``.
Each takes torch CPU tensors in one of the canonical views of :mod:`layers.kernels.common`
(3-D ``(N, C, S)`` or 2-D channels-last ``(M, C)``) and works on them zero-copy through
``Tensor.numpy()``; float16 and bfloat16 tensors arrive as their 16-bit patterns and are
converted in registers (:mod:`layers.kernels.codecs`; on AVX-512 hosts the element-wise loops
of the forward and of the input gradient take bfloat16 rows as pairs of elements per 32-bit
word, :mod:`layers.kernels.pairs`). For the eager path of
:mod:`layers.functional` it also runs a layer's whole forward and whole backward in one call
each (``forward_step``, ``backward_step``), the per-channel arithmetic included; those calls
pass contiguous tensors by address instead (:func:`_address`), which costs a fraction of a
numpy view per tensor on the small tensors where such costs show.

Memory traffic: in training, the in-place forward of an ``(N, C, S)`` view reads each channel
once and writes it once: statistics and output back to back per block of channels, the second
read hitting cache (the statistics read four of a channel's rows at a time, four memory
streams instead of one; a block of channels with short rows is read as long contiguous runs,
see :func:`_channel_block`). The whole backward step (:func:`backward_step`) does the same per
block of channels: the reductions read the output and the incoming gradient from memory, the
input gradient reads them again from cache and writes over the incoming gradient, or into a
new tensor in that same pass where the caller does not own the incoming gradient. On 16-bit
data in long rows, both steps prefetch the next block of channels while they write a block's
output or input gradient, so the memory works while the element conversions keep the core busy
(:func:`_prefetch_ahead`). The separate
backward passes make two reads for the reductions and two reads plus one write for the input
gradient (the reductions of all channels must be complete before the input gradient, for
``InPlaceABNSync``). In the ``(N, C, S)`` view, sums
are taken over blocks of ``_BLOCK`` elements in the compute precision (the data's, float32 for
16-bit data; the fused forward's blocks take four rows' ``_BLOCK`` elements) and the block sums
added in float64; the channels-last view does the same per channel over blocks of ``_BLOCK``
rows. The statistics subtract a per-channel sample value first (shifted sums), so a large mean
does not cancel the variance in float32.

Reproducibility: the order of every sum is fixed by the shape alone (rows of the ``(N, C, S)``
view, chunks of ``_ROWS_PER_CHUNK`` rows of the ``(M, C)`` view, the choice of the fused
training forward), never by the number of threads, so results are bitwise the same whatever
``torch.set_num_threads`` says. They can differ in the last bits between machines, which may
vectorise the sums differently (numba compiles for the host CPU).

They are also the same whether a process compiled the kernels or loaded them from numba's disk
cache. A kernel's compiled code holds a copy of every function it calls that numba compiled
separately (the loop bodies of its parallel loops, the per-channel steps), optimised again
with the kernel's own code. The process that compiled the kernel runs the functions' first
copies (their symbols were defined first, and the copies' are weak), a process that loads it
from the cache runs the copies in it. Both compute the same values only where LLVM's rewrites
keep the rounding of every operation. Hence no kernel allows floating-point contraction
(``fastmath`` ``contract``): which multiplies and adds fuse follows the shape of the code when
it becomes machine code, and the two copies fused differently (about one element in four of
an input gradient differed in its last bit). With reassociation alone, which vectorises the
sums, the copies agree, for both layers, every dtype, activation and view.
``tests/test_kernel_determinism.py`` compares a fresh compile with the cache.

Speed: each kernel is compiled once per activation (and backward mode) with both as
constants (:class:`_Variants`), so LLVM sees straight-line, branch-free loop bodies that it
vectorises; with the activation and mode as run-time values it does not, and the loops run
several times slower. A variant compiles on its first use: a model compiles the one or two it
runs, not all six (one backward reduction with every activation and mode inlined took many
times longer to compile). ``MODE_Y`` has no variant of its own: it runs the ``MODE_XHAT_FROM_Y``
kernels with ``p = 1``, ``q = 0`` (:data:`_KERNEL_MODES`), which give ``v = y`` exactly.
In-place kernels read and write one array argument (two arguments that alias defeat
vectorisation, see ``_target``).

Threads: the loops run on as many threads as ``torch.get_num_threads()`` (at most
``NUMBA_NUM_THREADS``), so ``torch.set_num_threads`` governs both libraries. Kernels called
from several Python threads run at once, except under numba's ``workqueue`` threading layer,
which is not thread-safe: there they run one at a time (:func:`_serialize_workqueue_launches`).

Empty inputs (no element: ``N = 0`` or a spatial size 0) launch nothing, as in ``cuda.py``:
``moments`` is NaN (no statistics), ``backward_reduce`` zero, the other operations do nothing.

All functions compile lazily on first use and are cached on disk, keyed on this file and on
``common.py`` (:mod:`layers.kernels.caching`): editing either recompiles on the next use.
"""
import functools
import os
import sys
import threading

import numba
import numpy as np
import torch
from numba.core import types
from numba.extending import intrinsic, overload

from . import caching, codecs, common, pairs, per_channel, step_vector_dtype, target
from .compose import compose_moments_forward
from .common import ACT_ELU, ACT_IDENTITY, ACT_LEAKY_RELU, MODE_XHAT_FROM_X, MODE_XHAT_FROM_Y, \
    MODE_Y

#: Source files besides this one whose code the kernels compile: their on-disk cache is keyed
#: on them too (tests check that every compiled function comes from this file or these).
DEPENDENCIES = (common.__file__, codecs.__file__, pairs.__file__, per_channel.__file__,
                target.__file__)

#: Element reads and writes: 16-bit data converts to float32 in registers (:mod:`.codecs`).
load, store, compute_empty = codecs.compiled_for_cpu()

_jit_scalar = caching.jit(numba.njit, DEPENDENCIES, inline="always")
_act_forward = _jit_scalar(common.act_forward)
_act_inverse = _jit_scalar(common.act_inverse)
_act_grad = _jit_scalar(common.act_grad)

_parallel = caching.jit(numba.njit, DEPENDENCIES, parallel=True)
#: Loops over the channels (a few thousand values at most): no threads to start.
_serial = caching.jit(numba.njit, DEPENDENCIES)
# Reassociation lets LLVM vectorise the sums; nothing else about IEEE semantics changes. No
# contraction: its fused multiply-adds differ between a fresh kernel and the same kernel loaded
# from the disk cache (see "Reproducibility" above).
_parallel_reduction = caching.jit(numba.njit, DEPENDENCIES, parallel=True,
                                  fastmath={"reassoc"})


class _Variants:
    """One kernel per activation (or per (activation, backward mode) pair), compiled on first use.

    ``template(*key)`` returns the kernel's Python function, which reads ``act`` (and ``mode``)
    from its closure: numba compiles closure variables as constants, so each variant's loops
    are free of run-time dispatch. ``decorator`` compiles it (with the disk cache, whose index
    key covers the closure's values). ``variants[key]`` is the dispatcher of one variant.
    """

    def __init__(self, decorator, keys):
        self._decorator = decorator
        self.keys = tuple(keys)
        self._kernels = {}

    def __call__(self, template):
        self.template = template
        self.__name__ = template.__name__
        self.__doc__ = template.__doc__
        return self

    def __getitem__(self, key):
        kernel = self._kernels.get(key)
        if kernel is None:
            if key not in self.keys:
                raise KeyError(f"{self.__name__} has no variant {key!r}: one of {self.keys}")
            args = key if isinstance(key, tuple) else (key,)
            function = self.template(*args)
            # numba names compiled code (and its environment) after the qualified name, a counter
            # of its own process and the argument types, not the closure's values: two processes
            # that each compile a variant as their n-th function would give it the same name,
            # and a third that loads both from the disk cache would run one with the other's
            # environment. A name per variant keeps them apart (and gives each its cache files).
            function.__qualname__ = f"{function.__qualname__}_{'_'.join(map(str, args))}"
            kernel = self._kernels[key] = self._decorator(function)
        return kernel


#: Keys of the forward kernels (the activation) and of the backward ones (activation, mode).
_ACTS = (ACT_IDENTITY, ACT_LEAKY_RELU, ACT_ELU)
#: The backward modes compiled: ``MODE_Y`` runs the ``MODE_XHAT_FROM_Y`` kernels with ``p = 1``
#: and ``q = 0`` (:func:`_kernel_mode`), whose ``v = y * 1 + 0`` is ``y`` exactly: both
#: InPlace-ABN variants share their kernels, for one multiply-add per element that the memory
#: traffic hides, and a third of the backward variants never compiles.
_KERNEL_MODES = (MODE_XHAT_FROM_Y, MODE_XHAT_FROM_X)
_ACT_MODES = tuple((act, mode) for act in _ACTS for mode in _KERNEL_MODES)


@_jit_scalar
def _backward_value(z, x, p, q, act, slope, floor, mode):
    """The value ``v = u * p + q`` that ``sum(dy * v)`` is taken against, ``u`` the stored
    input or ``y`` (see ``common`` for the modes; ``MODE_Y`` is compiled as ``MODE_XHAT_FROM_Y``,
    :data:`_KERNEL_MODES`)."""
    u = x if mode == MODE_XHAT_FROM_X else _act_inverse(z, act, slope, floor)
    return u * p + q


# --------------------------------------------------------------------------- rows
# The NCS kernels hand their loop bodies 1-D row views ``x[i, j]``. Sums run over blocks of
# ``_BLOCK`` elements taken as slices: a loop over a whole slice vectorises at full width,
# while one over ``range(start, min(start + _BLOCK, size))`` runs about half as fast.
#: Elements summed in the data's own precision before the partial sum joins the float64 total.
_BLOCK = 512
#: Rows per chunk of the channels-last reductions: a multiple of ``_BLOCK``, so the blocks, and
#: the order of the sums, depend on the shape only (not on the number of threads).
_ROWS_PER_CHUNK = 4 * _BLOCK
#: Channels from which the in-place training forward fuses statistics and output per channel
#: (parallel over channels): a constant, so that the choice, which changes the last bits of the
#: result, does not follow the thread count.
_FUSED_MIN_CHANNELS = 32
#: Elements up to which the in-place training forward fuses whatever its number of channels.
#: There its time is the calls' fixed cost, not the threads' share of the work: with fewer
#: channels than threads the fused forward leaves threads idle, but the two passes instead
#: cost several calls into numba and torch operators between them; on larger tensors a thread
#: holding several channels beyond its cache makes the fused forward the slower. The
#: ``inplace_abn_fwd_I`` row of ``python -m experiments.bench_kernels --shapes`` with a few
#: channels (e.g. ``2 3 128 128``), run with this constant moved, measures the crossover. Like
#: the channel count, a constant: the choice follows the shape alone.
_FUSED_MAX_ANY_CHANNELS = 1 << 17


def _target(out, x):
    """The array a kernel writes: ``out``, or ``x`` itself when ``out`` is None (in place)."""


@overload(_target, inline="always")
def _target_overload(out, x):
    # In place, the rows read and written are then one and the same value, which LLVM
    # vectorises directly; two argument arrays that happen to alias fail its run-time overlap
    # check and run the scalar loop, several times slower.
    if isinstance(out, (types.NoneType, types.Omitted)):
        return lambda out, x: x
    return lambda out, x: out


@intrinsic
def _pointer(typingctx, address, element):
    """The integer ``address`` as a pointer to values of ``element``'s type (a scalar whose
    value is not read)."""
    if not (isinstance(address, types.Integer)
            and isinstance(element, (types.Integer, types.Float))):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return types.CPointer(element)(address, element), codegen


def _row(array, i, j):
    """The row ``array[i, j]``, or None where ``array`` is None: with :func:`_target`, a row
    written in place is the very value read (``_target(_row(out, i, j), row)``)."""


@overload(_row, inline="always")
def _row_overload(array, i, j):
    if isinstance(array, (types.NoneType, types.Omitted)):
        return lambda array, i, j: None
    return lambda array, i, j: array[i, j]


def _array_at(address, shape, element):
    """The C-contiguous array of ``shape`` with elements of ``element``'s type at the integer
    ``address`` (:func:`_address`), or None where ``address`` is None."""


@overload(_array_at, inline="always")
def _array_at_overload(address, shape, element):
    # None or not is known when the kernel compiles: no optional type reaches the loops.
    if isinstance(address, (types.NoneType, types.Omitted)):
        return lambda address, shape, element: None
    return lambda address, shape, element: numba.carray(_pointer(address, element), shape)


#: float32 lanes of an AVX-512 register, the width LLVM vectorises the 16-bit row loops at (in
#: steps of two registers): see :func:`_split_at_lanes`.
_LANES = 16


#: Whether the 16-bit element-wise row loops split at :data:`_LANES` (:func:`_split_at_lanes`).
_SPLITS_ROWS = target.compiles_for("avx512f")
#: Whether the element-wise loops of the forward and of the backward's input gradient run
#: bfloat16 rows as pairs of elements per 32-bit word, without shuffles (:mod:`.pairs`): on
#: AVX-512 hosts they beat the scalar loops, most on the short rows of small maps, whose passes
#: compute rather than wait on memory. Hosts without AVX-512 keep the scalar loops, the pairs
#: not having been timed there. ``python -m experiments.bench_kernels --dtypes bfloat16`` with
#: this flag on and off measures it (the ``normalize_act`` and ``backward_input_in_place``
#: passes and the layer's forward + backward).
_PAIRS_ROWS = _SPLITS_ROWS


def _split_at_lanes(row):
    """On a host that splits rows (:data:`_SPLITS_ROWS`: AVX-512), whether an element-wise
    loop over the 1-D ``row`` runs as two loops: over the first ``row.size - row.size % _LANES``
    elements, then over the rest (16-bit rows only).

    Callers branch on ``_SPLITS_ROWS and _split_at_lanes(row)`` and compute that split point
    inside the branch: a split point picked by a conditional expression (``row.size`` when not
    split) hides from LLVM that it is a multiple of ``_LANES``, and gains nothing over one
    loop. The global comes first because numba prunes a branch on a global constant before it
    inlines the calls in it, while this function only resolves at typing, after inlining: on
    hosts without AVX-512 the two split loops then never enter the kernels' IR (numba copies
    an inlined function's IR at every call site, at a compile time that grows with its
    size)."""


@overload(_split_at_lanes, inline="always")
def _split_at_lanes_overload(row):
    # LLVM vectorises a loop of unknown length in steps of 2 * _LANES elements, then what is
    # left in 4-element steps and a scalar tail. When _LANES or more are left, those 4-element
    # steps dominate a short row; a first loop whose length LLVM can see is a multiple of
    # _LANES runs them at full width instead. That pays on 16-bit rows with AVX-512 (short
    # rows with a long remainder gain most, rows with no remainder nothing); float rows and
    # AVX2 hosts run slower split, at every row length, and keep one loop.
    if row.dtype in codecs.SIXTEEN_BIT_TYPES:  # callers test _SPLITS_ROWS first
        return lambda row: row.size % (2 * _LANES) >= _LANES
    return lambda row: False


def _split_sums_at_lanes(row):
    """On a host that splits rows (:data:`_SPLITS_ROWS`), whether the four-row sums over a 1-D
    ``row`` (a block of :func:`_shifted_four_row_sums`) run as two loops, as
    :func:`_split_at_lanes` does for element-wise loops: over the first
    ``row.size - row.size % _LANES`` elements, then over the rest (16-bit rows only)."""


@overload(_split_sums_at_lanes, inline="always")
def _split_sums_at_lanes_overload(row):
    # The four-row sums vectorise in steps of 4 * _LANES elements, then what is left in steps
    # of half a register: the short rows of 7x7 and 14x14 maps run almost all in half steps,
    # or one element at a time. A first loop whose length LLVM can see is a multiple of
    # _LANES runs at full width instead: faster on short 16-bit rows, the same where S is a
    # multiple of _LANES (nothing to split), slower on float32 rows, which keep one loop. The
    # ``statistics`` pass of ``python -m experiments.bench_kernels --dtypes bfloat16 float32``
    # measures it.
    if row.dtype in codecs.SIXTEEN_BIT_TYPES:  # callers test _SPLITS_ROWS first
        return lambda row: row.size % _LANES != 0
    return lambda row: False


@_jit_scalar
def _shifted_row_sums(row, k):
    """``(sum(d), sum(d * d))`` over a 1-D ``row`` with ``d = row - k``, in float64.

    ``k`` (a sample of the channel, in the compute dtype) removes the mean's magnitude first;
    blocks of ``_BLOCK`` elements are then summed in the compute dtype, which vectorises at full
    width, and the block sums are added up in float64.
    """
    s1 = 0.0
    s2 = 0.0
    for start in range(0, row.size, _BLOCK):
        block = row[start:start + _BLOCK]
        b1 = k - k
        b2 = k - k
        for t in range(block.size):
            d = load(block[t]) - k
            b1 += d
            b2 += d * d
        s1 += b1
        s2 += b2
    return s1, s2


@_jit_scalar
def _shifted_four_row_sums(r0, r1, r2, r3, k):
    """:func:`_shifted_row_sums` of four rows of the same length, added up.

    The four rows are read side by side, element by element: four memory streams at once
    instead of one. Where consecutive rows of a channel lie far apart (the ``(N, C, S)`` view
    read channel by channel), a single stream leaves the memory idle while each row's first
    cache lines arrive; four keep it busy (long rows gain, the short rows of 7x7 maps leave
    little to overlap). A block's sums in the compute dtype run over the four rows' ``_BLOCK``
    elements together (``4 * _BLOCK`` values; one accumulator per sum, which ran faster than
    separate ones per row). The rows are separate, contiguous arguments: one strided
    ``(4, S)`` view of them would not vectorise. A 16-bit block whose length is not a multiple
    of ``_LANES`` is summed in two parts (:func:`_split_sums_at_lanes`), each in the compute
    dtype, added in float64.
    """
    s1 = 0.0
    s2 = 0.0
    for start in range(0, r0.size, _BLOCK):
        b0, b1 = r0[start:start + _BLOCK], r1[start:start + _BLOCK]
        b2, b3 = r2[start:start + _BLOCK], r3[start:start + _BLOCK]
        if _SPLITS_ROWS and _split_sums_at_lanes(b0):
            head = b0.size - b0.size % _LANES
            p, q = _shifted_four_span_sums(b0, b1, b2, b3, k, 0, head)
            s1 += p
            s2 += q
            p, q = _shifted_four_span_sums(b0, b1, b2, b3, k, head, b0.size)
        else:
            p, q = _shifted_four_span_sums(b0, b1, b2, b3, k, 0, b0.size)
        s1 += p
        s2 += q
    return s1, s2


@_jit_scalar
def _shifted_four_span_sums(b0, b1, b2, b3, k, start, stop):
    """The sums of ``d`` and ``d * d`` (``d = b - k``) over elements ``start`` to ``stop`` of the
    four 1-D arrays ``b0`` to ``b3``, in the compute dtype (:func:`_shifted_four_row_sums`)."""
    p = k - k
    q = k - k
    for t in range(start, stop):
        d0 = load(b0[t]) - k
        d1 = load(b1[t]) - k
        d2 = load(b2[t]) - k
        d3 = load(b3[t]) - k
        p += (d0 + d1) + (d2 + d3)
        q += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3)
    return p, q


# The (N, C, S) kernels walk blocks of consecutive rows (:func:`_chunks`), finding a row's
# batch item and channel by one division per block, not per row: on short rows (7x7 maps) a
# 64-bit division per row is a large part of the statistics pass.
@_jit_scalar
def _chunk_rows(blk, chunks, n, c):
    """``(start, stop, i, j)``: rows ``start`` to ``stop`` of chunk ``blk`` of ``chunks`` over
    the ``N * C`` rows of an ``(N, C, S)`` view, and ``(i, j)`` of row ``start`` (the one
    division of the chunk)."""
    start, stop = blk * n * c // chunks, (blk + 1) * n * c // chunks
    return start, stop, start // c, start % c


@_jit_scalar
def _next_row(i, j, c):
    """``(i, j)`` of the row after row ``(i, j)`` of an ``(N, C, S)`` view, without dividing."""
    return (i, j + 1) if j + 1 < c else (i + 1, 0)


#: Bytes of a cache line: the step between the addresses :func:`_prefetch_row_ahead` hands the
#: CPU.
_CACHE_LINE_BYTES = 64


@intrinsic
def _prefetch(typingctx, row, index):
    """Ask the CPU to bring the cache line holding ``row[index]`` (a 1-D array) into its L2
    cache (:func:`.target.emit_prefetch`). A hint: it never faults and changes no result."""
    if not (isinstance(row, types.Array) and row.ndim == 1 and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        position = context.cast(builder, args[1], signature.args[1], types.intp)
        target.emit_prefetch(builder, builder.gep(array.data, [position]))
        return context.get_dummy_value()
    return types.none(row, index), codegen


@_jit_scalar
def _elements_ahead(x, j, ahead):
    """Elements from a row of channel ``j`` of the ``(N, C, S)`` view ``x`` to the row that a
    whole step prefetches while it computes it: the same batch item's row ``ahead`` channels
    on (the next block, :func:`_prefetch_ahead`), or 0 (none) where ``ahead`` is 0 or that
    channel does not exist. The row loops take this distance (:func:`_forward_row`,
    :func:`_input_row`), not a view of the row: a view per row costs its reference counting,
    which took a quarter of the fused forward's time on 7x7 maps."""
    if ahead > 0 and j + ahead < x.shape[1]:
        return ahead * (x.strides[1] // x.itemsize)
    return 0


@_jit_scalar
def _prefetch_row_ahead(row, ahead):
    """:func:`_prefetch` every cache line of the elements ``ahead`` after those of the 1-D
    contiguous ``row`` (none where ``ahead`` is 0)."""
    if ahead != 0:
        step = max(1, _CACHE_LINE_BYTES // row.itemsize)
        for t in range(0, row.size, step):
            _prefetch(row, t + ahead)


@caching.jit(numba.njit, DEPENDENCIES)
def _finish_moments(s1, s2, shift, count):
    """``(mean, M2)`` from sums ``s1``, ``s2`` of ``x - shift`` over ``count`` elements."""
    return shift + s1 / count, np.maximum(s2 - s1 * s1 / count, 0.0)


@_jit_scalar
def _moments_from_sums(sums, shift, count):
    """The (2, C) float64 ``[mean, M2]`` from the (2, C) sums of ``x - shift[j]`` over ``count``
    elements per channel ``j``.

    A loop over the channels: an assignment of whole rows (``out[0] = ...``) would make numba
    compile its message for mismatched shapes, seconds in every process that compiles a kernel
    with one (a large part of ``_moments_ncs``'s compile time from an empty cache).
    """
    out = np.empty((2, shift.size), np.float64)
    for j in range(shift.size):
        out[0, j], out[1, j] = _finish_moments(sums[0, j], sums[1, j], shift[j], count)
    return out


@_parallel_reduction
def _moments_ncs(x, chunks):
    n, c, s = x.shape
    shift = compute_empty(c, x)  # in the compute dtype, so the subtraction stays in it
    for j in range(c):
        shift[j] = load(x[0, j, 0])
    partial = np.empty((2, n, c), np.float64)  # every entry written below
    for blk in numba.prange(chunks):
        start, stop, i, j = _chunk_rows(blk, chunks, n, c)
        for _ in range(start, stop):
            partial[0, i, j], partial[1, i, j] = _shifted_row_sums(x[i, j], shift[j])
            i, j = _next_row(i, j, c)
    return _moments_from_sums(_total(partial), shift, n * s)


@_jit_scalar
def _zero_totals(totals):
    """``totals[:] = 0`` for a (2, C) array, as a plain loop: in a parallel kernel an array
    expression or ``np.zeros`` becomes a parallel loop of its own, one more to compile."""
    for j in range(totals.shape[1]):
        totals[0, j] = 0.0
        totals[1, j] = 0.0


@_jit_scalar
def _total(partial):
    """``partial.sum(axis=1)`` of a (2, parts, C) array, in the order of the parts, as a plain
    loop (numba compiles a generic axis reduction of its own for ``sum(axis=...)``)."""
    out = np.empty((2, partial.shape[2]), np.float64)
    _zero_totals(out)
    for k in range(partial.shape[1]):
        for j in range(partial.shape[2]):
            out[0, j] += partial[0, k, j]
            out[1, j] += partial[1, k, j]
    return out


@_jit_scalar
def _add_block_sums(totals, b0, b1):
    """``totals[0] += b0``, ``totals[1] += b1`` (float64 totals of data-precision block sums)."""
    for j in range(b0.size):
        totals[0, j] += b0[j]
        totals[1, j] += b1[j]


@_parallel_reduction
def _moments_mc(x, chunks):
    m, c = x.shape
    shift = compute_empty(c, x)  # in the compute dtype, so the subtraction stays in it
    for j in range(c):
        shift[j] = load(x[0, j])
    partial = np.empty((2, chunks, c), np.float64)
    for blk in numba.prange(chunks):
        start, stop = blk * m // chunks, (blk + 1) * m // chunks
        _zero_totals(partial[:, blk])
        b1 = compute_empty(c, x)
        b2 = compute_empty(c, x)
        for first in range(start, stop, _BLOCK):  # blocks of _BLOCK rows per channel
            b1[:] = 0
            b2[:] = 0
            for r in range(first, min(first + _BLOCK, stop)):
                row = x[r]
                for j in range(c):
                    d = load(row[j]) - shift[j]
                    b1[j] += d
                    b2[j] += d * d
            _add_block_sums(partial[:, blk], b1, b2)
    return _moments_from_sums(_total(partial), shift, m)


# --------------------------------------------------------------------------- loop bodies
# Each body handles one row of the (N, C, S) view (as 1-D row views) or one block of rows of
# the (M, C) view. ``act`` and ``mode`` are constants where a kernel variant inlines it.

@_jit_scalar
def _forward_span(src, dst, start, stop, a, b, act, slope):
    for t in range(start, stop):
        dst[t] = store(_act_forward(load(src[t]) * a + b, act, slope), dst)


@_jit_scalar
def _forward_row(src, dst, a, b, act, slope, ahead):
    """``dst = act(src * a + b)`` over a row; prefetches the elements ``ahead`` after the row's
    (0: none; see :func:`_elements_ahead`) as it goes where the pairs loop runs, else after the
    row."""
    if _PAIRS_ROWS and pairs.scale_shift_act_row(src, dst, a, b, act, slope, ahead):
        return
    if _SPLITS_ROWS and _split_at_lanes(src):
        head = src.size - src.size % _LANES
        _forward_span(src, dst, 0, head, a, b, act, slope)
        _forward_span(src, dst, head, src.size, a, b, act, slope)
    else:
        _forward_span(src, dst, 0, src.size, a, b, act, slope)
    _prefetch_row_ahead(src, ahead)


@_jit_scalar
def _forward_rows(x, out, start, stop, a, b, act, slope):
    for r in range(start, stop):
        for j in range(x.shape[1]):
            out[r, j] = store(_act_forward(load(x[r, j]) * a[j] + b[j], act, slope), out)


@_jit_scalar
def _reduce_row(z, dz, x, p, q, act, slope, floor, mode):
    s0 = 0.0
    s1 = 0.0
    for start in range(0, z.size, _BLOCK):
        zb, dzb, xb = z[start:start + _BLOCK], dz[start:start + _BLOCK], x[start:start + _BLOCK]
        b0 = slope - slope  # block sums in the compute dtype, as in _shifted_row_sums
        b1 = slope - slope
        for t in range(zb.size):
            zt = load(zb[t])
            dy = _act_grad(zt, load(dzb[t]), act, slope)
            b0 += dy
            b1 += dy * _backward_value(zt, load(xb[t]), p, q, act, slope, floor, mode)
        s0 += b0
        s1 += b1
    return s0, s1


@_jit_scalar
def _reduce_rows(z, dz, x, start, stop, p, q, act, slope, floor, mode, sums):
    c = z.shape[1]
    b0 = compute_empty(c, z)  # block sums in the compute dtype, as in _moments_mc
    b1 = compute_empty(c, z)
    for first in range(start, stop, _BLOCK):
        b0[:] = 0
        b1[:] = 0
        for r in range(first, min(first + _BLOCK, stop)):
            zr, dzr, xr = z[r], dz[r], x[r]
            for j in range(c):
                zt = load(zr[j])
                dy = _act_grad(zt, load(dzr[j]), act, slope)
                b0[j] += dy
                b1[j] += dy * _backward_value(zt, load(xr[j]), p[j], q[j], act, slope, floor,
                                              mode)
        _add_block_sums(sums, b0, b1)


@_jit_scalar
def _input_span(z, dz, x, start, stop, p, q, k0, k1, k2, act, slope, floor, mode, out):
    for t in range(start, stop):
        zt = load(z[t])
        dy = _act_grad(zt, load(dz[t]), act, slope)
        v = _backward_value(zt, load(x[t]), p, q, act, slope, floor, mode)
        out[t] = store(dy * k0 + v * k1 + k2, out)


@_jit_scalar
def _input_row(z, dz, x, p, q, k0, k1, k2, act, slope, floor, mode, out, ahead):
    """The input gradient over a row into ``out``; prefetches the elements ``ahead`` after
    ``z``'s and ``dz``'s (and ``x``'s in ``MODE_XHAT_FROM_X``, the one mode that reads ``x``;
    0: none; see :func:`_elements_ahead`) as it goes where the pairs loop runs, else after the
    row."""
    if _PAIRS_ROWS and pairs.input_gradient_row(z, dz, x, p, q, k0, k1, k2, act, slope, mode,
                                                out, ahead):
        return
    if _SPLITS_ROWS and _split_at_lanes(z):
        head = z.size - z.size % _LANES
        _input_span(z, dz, x, 0, head, p, q, k0, k1, k2, act, slope, floor, mode, out)
        _input_span(z, dz, x, head, z.size, p, q, k0, k1, k2, act, slope, floor, mode, out)
    else:
        _input_span(z, dz, x, 0, z.size, p, q, k0, k1, k2, act, slope, floor, mode, out)
    _prefetch_row_ahead(z, ahead)
    _prefetch_row_ahead(dz, ahead)
    if mode == MODE_XHAT_FROM_X:
        _prefetch_row_ahead(x, ahead)


@_jit_scalar
def _input_rows(z, dz, x, start, stop, p, q, coef, act, slope, floor, mode, out):
    for r in range(start, stop):
        for j in range(z.shape[1]):
            zt = load(z[r, j])
            dy = _act_grad(zt, load(dz[r, j]), act, slope)
            v = _backward_value(zt, load(x[r, j]), p[j], q[j], act, slope, floor, mode)
            out[r, j] = store(dy * coef[0, j] + v * coef[1, j] + coef[2, j], out)


# --------------------------------------------------------------------------- passes
# Whole passes over an (N, C, S) view, each one parallel loop, shared by the kernels below and
# the whole steps at the end of the module. Inlined, they compile with the caller's
# floating-point options.

@_jit_scalar
def _moments_normalize_ncs(x, gamma, beta, eps, act, slope, coef, block, ahead):
    """Per block of ``block`` consecutive channels (blocks in parallel): the statistics, then
    the output in place while the block is in cache. Returns the (2, C) ``[mean, M2]``;
    ``coef`` (a (2, C) array of the compute dtype) receives each channel's scale and shift.

    While it writes a block's output it prefetches, with each row, the same batch item's row
    ``ahead`` channels on (``0``: none; see :func:`_prefetch_ahead`, :func:`_elements_ahead`):
    the next block, which the same thread runs next (numba hands each thread one range of
    consecutive blocks), so its statistics read from cache while the memory was kept busy
    during this block's arithmetic. The bfloat16 pairs loops prefetch one cache line per
    step, spread over the row's arithmetic; the other loops prefetch the row's lines after
    it.

    Each channel's sums are taken in the same order whatever ``block`` is (four of its rows at
    a time, :func:`_shifted_four_row_sums`, in the order of the batch), so the result does not
    depend on it. Within a block, the rows of one batch item are consecutive in memory: a block
    of channels whose rows are short is read as long contiguous runs, which the hardware
    prefetches, instead of one short run per row far apart from the next (:func:`_channel_block`).
    """
    n, c, s = x.shape
    result = np.empty((2, c), np.float64)
    grouped = n - n % 4
    for blk in numba.prange(-(-c // block)):
        first, last = blk * block, min((blk + 1) * block, c)
        for j in range(first, last):  # sums into result, the sample value into coef[0]
            result[0, j] = 0.0
            result[1, j] = 0.0
            coef[0, j] = load(x[0, j, 0])
        for i in range(0, grouped, 4):
            for j in range(first, last):
                r1, r2 = _shifted_four_row_sums(x[i, j], x[i + 1, j], x[i + 2, j],
                                                x[i + 3, j], coef[0, j])
                result[0, j] += r1
                result[1, j] += r2
        for i in range(grouped, n):
            for j in range(first, last):
                r1, r2 = _shifted_row_sums(x[i, j], coef[0, j])
                result[0, j] += r1
                result[1, j] += r2
        for j in range(first, last):
            mean, m2 = _finish_moments(result[0, j], result[1, j], coef[0, j], n * s)
            result[0, j] = mean
            result[1, j] = m2
            scale = gamma[j] / np.sqrt(m2 / (n * s) + eps)
            coef[0, j] = scale  # through coef, a and b take the compute dtype
            coef[1, j] = beta[j] - mean * scale
        for i in range(n):
            for j in range(first, last):
                row = x[i, j]
                _forward_row(row, row, coef[0, j], coef[1, j], act, slope,
                             _elements_ahead(x, j, ahead))
    return result


@_jit_scalar
def _reduce_ncs(z, dz, x, p, q, act, slope, floor, mode, chunks):
    """``[sum dy, sum dy * v]`` per channel of an ``(N, C, S)`` view (rows in parallel)."""
    n, c, _ = z.shape
    partial = np.empty((2, n, c), np.float64)  # every entry written below
    for blk in numba.prange(chunks):
        start, stop, i, j = _chunk_rows(blk, chunks, n, c)
        for _ in range(start, stop):
            s0, s1 = _reduce_row(z[i, j], dz[i, j], x[i, j], p[j], q[j], act, slope, floor,
                                 mode)
            partial[0, i, j] = s0
            partial[1, i, j] = s1
            i, j = _next_row(i, j, c)
    return _total(partial)


@_jit_scalar
def _input_ncs(z, dz, x, p, q, coef, act, slope, floor, mode, chunks):
    """The input gradient of an ``(N, C, S)`` view over ``dz`` (rows in parallel): the row
    read and written is one value, which LLVM vectorises."""
    n, c, _ = z.shape
    for blk in numba.prange(chunks):
        start, stop, i, j = _chunk_rows(blk, chunks, n, c)
        for _ in range(start, stop):
            grad = dz[i, j]
            _input_row(z[i, j], grad, x[i, j], p[j], q[j], coef[0, j], coef[1, j], coef[2, j],
                       act, slope, floor, mode, grad, 0)
            i, j = _next_row(i, j, c)


# --------------------------------------------------------------------------- kernels
# Each kernel is a template: ``_Variants`` compiles one dispatcher per activation (and mode),
# which the closure's ``act`` (and ``mode``) make constants.

@_Variants(_parallel_reduction, _ACTS)
def _moments_forward_ncs_inplace(act):
    def kernel(x, gamma, beta, eps, slope, coef, block, ahead):
        return _moments_normalize_ncs(x, gamma, beta, eps, act, slope, coef, block, ahead)
    return kernel


@_Variants(_parallel, _ACTS)
def _forward_ncs(act):
    def kernel(x, out, a, b, slope, chunks):
        n, c, _ = x.shape
        dst = _target(out, x)
        for blk in numba.prange(chunks):
            start, stop, i, j = _chunk_rows(blk, chunks, n, c)
            for _ in range(start, stop):
                _forward_row(x[i, j], dst[i, j], a[j], b[j], act, slope, 0)
                i, j = _next_row(i, j, c)
    return kernel


@_Variants(_parallel, _ACTS)
def _forward_mc(act):
    def kernel(x, out, a, b, slope, chunks):
        m = x.shape[0]
        dst = _target(out, x)
        for blk in numba.prange(chunks):
            start, stop = blk * m // chunks, (blk + 1) * m // chunks
            _forward_rows(x, dst, start, stop, a, b, act, slope)
    return kernel


@_Variants(_parallel_reduction, _ACT_MODES)
def _backward_reduce_ncs(act, mode):
    def kernel(z, dz, x, p, q, slope, floor, chunks):
        return _reduce_ncs(z, dz, x, p, q, act, slope, floor, mode, chunks)
    return kernel


@_Variants(_parallel_reduction, _ACT_MODES)
def _backward_reduce_mc(act, mode):
    def kernel(z, dz, x, p, q, slope, floor, chunks):
        m, c = z.shape
        partial = np.empty((2, chunks, c), np.float64)
        for blk in numba.prange(chunks):
            start, stop = blk * m // chunks, (blk + 1) * m // chunks
            _zero_totals(partial[:, blk])
            _reduce_rows(z, dz, x, start, stop, p, q, act, slope, floor, mode, partial[:, blk])
        return _total(partial)
    return kernel


@_Variants(_parallel, _ACT_MODES)
def _backward_input_ncs(act, mode):
    def kernel(z, dz, x, p, q, coef, slope, floor, chunks):
        """In place over ``dz``."""
        _input_ncs(z, dz, x, p, q, coef, act, slope, floor, mode, chunks)
    return kernel


@_Variants(_parallel, _ACT_MODES)
def _backward_input_mc(act, mode):
    def kernel(z, dz, x, p, q, coef, slope, floor, chunks):
        """In place over ``dz``, as :func:`_backward_input_ncs`."""
        m = z.shape[0]
        for blk in numba.prange(chunks):
            start, stop = blk * m // chunks, (blk + 1) * m // chunks
            _input_rows(z, dz, x, start, stop, p, q, coef, act, slope, floor, mode, dz)
    return kernel


# --------------------------------------------------------------------------- API
def _np(t):
    """Zero-copy numpy view of a CPU tensor, 16-bit data as its bits (:mod:`.codecs`); a numpy
    array (a per-channel vector of the host steps) as it is."""
    return t if isinstance(t, np.ndarray) else codecs.cpu_array(t)


def _in_place(out, x):
    """Whether the output ``out`` is the input view ``x`` itself."""
    return out.data_ptr() == x.data_ptr()


def _output(out, x):
    """``out`` as a kernel's output argument: None when it is ``x`` itself (in place)."""
    return None if _in_place(out, x) else _np(out)


#: Per thread (numba's count is a thread's own): torch's count when numba's was last matched to
#: it, and the count numba's loops then got.
_threads_matched = threading.local()


def _follow_torch_threads():
    """Give numba's loops torch's thread count; return it.

    numba's count is read and set only when torch's has changed since the last call on this
    thread: reading it takes a lock and a foreign-function call, several times per layer and
    step otherwise. A count set on numba alone in between (``numba.set_num_threads``) lasts
    until torch's changes; the results do not depend on it. Launching numba's OpenMP pool (on
    the first ``set_num_threads``) resets the process's OpenMP thread count, which torch's own
    operators read too: torch's count is restored.
    """
    torch_threads = torch.get_num_threads()
    if getattr(_threads_matched, "torch", None) == torch_threads:
        return _threads_matched.numba
    wanted = min(torch_threads, numba.config.NUMBA_NUM_THREADS)
    if numba.get_num_threads() != wanted:  # the first call launches numba's threading layer
        numba.set_num_threads(wanted)
        torch.set_num_threads(torch_threads)
    _serialize_workqueue_launches()
    _threads_matched.torch, _threads_matched.numba = torch_threads, wanted
    return wanted


#: Held by a thread while it runs a parallel kernel, where launches are serialised
#: (:func:`_serialize_workqueue_launches`).
_LAUNCH_LOCK = threading.Lock()
#: Whether :func:`_launch` takes :data:`_LAUNCH_LOCK`: set once, never cleared.
_serialized_launches = False


def _serialize_workqueue_launches():
    """Serialise the parallel kernels' launches where numba's threading layer (launched by
    then) is ``workqueue``.

    That layer is not thread-safe: two threads that launch parallel loops at once (training in
    two threads, or a layer called from a thread pool) make it abort the whole process. numba
    picks it where neither TBB nor OpenMP loads (or on ``NUMBA_THREADING_LAYER=workqueue``).
    There a thread's kernel waits for the other threads' to finish, each kernel still running on
    all of numba's threads; ``tbb`` and ``omp`` run several at once. Called on a thread's first
    kernel, before it launches: the flag is process-wide and only ever set to True, so no thread
    launches unserialised once any has seen the layer.
    """
    global _serialized_launches
    if not _serialized_launches and numba.threading_layer() == "workqueue":
        _serialized_launches = True


def _launch(kernel, *args):
    """``kernel(*args)``, the launch of a parallel kernel: one at a time where
    :func:`_serialize_workqueue_launches` says so. Every launch comes after a
    :func:`_follow_torch_threads` on its thread."""
    if not _serialized_launches:
        return kernel(*args)
    with _LAUNCH_LOCK:
        return kernel(*args)


def _chunks(view, threads):
    """Blocks of consecutive rows a parallel loop over the canonical ``view`` is split into: a
    few per thread (``threads``, as :func:`_follow_torch_threads` returns it).

    The rows are the ``N * C`` rows of an ``(N, C, S)`` view or the ``M`` rows of an ``(M, C)``
    one. The element-wise channels-last loops and the ``(N, C, S)`` kernels other than the whole
    steps (which split by channels, :func:`_channel_block`) use it; the ``(N, C, S)``
    reductions keep one partial sum per row, so their results do not depend on it (nor,
    through it, on the thread count)."""
    rows = view.numel() // view.shape[-1]
    return max(1, min(rows, 4 * threads))


#: Bytes of data a block of channels of the whole steps should hold at most: read once for the
#: statistics or the backward's sums, the block is still in the core's L2 cache (512 KiB and up
#: on current x86 cores) when it is read again for the output or the input gradient. The fused
#: forward at ResNeXt-101's stage shapes is about as fast anywhere from 128 to 512 KiB, and
#: slower with much smaller blocks (more per-block work) or much larger ones (out of cache).
_CACHED_BLOCK_BYTES = 256 * 1024


def _channel_block(shape, element_size, tensors, threads):
    """Channels per block of a whole step on an ``(N, C, S)`` view of ``shape`` (elements of
    ``element_size`` bytes) that reads ``tensors`` tensors of its shape: as many as fit
    :data:`_CACHED_BLOCK_BYTES` (one when a channel alone is larger), and few enough that each
    of the ``threads`` gets several blocks. The results do not depend on it (see
    :func:`_moments_normalize_ncs`, :func:`_backward_step_ncs`)."""
    n, c, s = shape
    fits = _CACHED_BLOCK_BYTES // max(1, tensors * n * s * element_size)
    return max(1, min(fits, c // (4 * threads)))


#: The smallest rows (bytes) and the fewest bytes of data a whole step reads for which it
#: prefetches the next block of channels, on 16-bit data only (:func:`_prefetch_ahead`).
#: On 16-bit data a pass computes as well as it waits on memory, and prefetching the next
#: block overlaps the two on tensors larger than the caches; on rows of 7x7 maps (which the
#: pairs loops cover in their two last steps) and on tensors the caches hold, the extra loop
#: costs more than it gains, and on float32 (passes bound by memory alone: nothing to overlap)
#: it gains nothing. Hence rows of at least 256 bytes (not 7x7 maps) and 8 MiB read (not
#: tensors the caches hold). ``python -m experiments.bench_kernels --dtypes bfloat16 float16
#: float32`` at its default shapes, run with these constants moved, measures it.
_PREFETCH_MIN_ROW_BYTES = 256
_PREFETCH_MIN_BYTES = 8 * 2 ** 20


#: Units of the cache sizes Linux lists (``1024K``).
_SIZE_UNITS = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}


@functools.lru_cache(maxsize=None)
def _l2_cache_bytes(cache_directory="/sys/devices/system/cpu/cpu0/cache"):
    """Bytes of the L2 cache of the first core, as Linux lists it in ``cache_directory``
    (``index*/level``, ``type``, ``size``); 0 where that is not readable (other systems)."""
    try:
        entries = sorted(os.listdir(cache_directory))
    except OSError:
        return 0
    for entry in entries:
        try:
            level, kind, size = (_read_line(os.path.join(cache_directory, entry, name))
                                 for name in ("level", "type", "size"))
        except OSError:
            continue
        if level != "2" or kind == "Instruction":
            continue
        try:
            return int(size[:-1]) * _SIZE_UNITS[size[-1]] if size[-1:] in _SIZE_UNITS \
                else int(size)
        except ValueError:
            return 0
    return 0


def _read_line(path):
    """The text of the file ``path``, stripped."""
    with open(path) as f:
        return f.read().strip()


def _prefetch_ahead(shape, element_size, tensors, block):
    """Channels after each block that a whole step on an ``(N, C, S)`` view of ``shape``
    (elements of ``element_size`` bytes), reading
    ``tensors`` tensors of its shape in blocks of ``block`` channels, prefetches while it
    finishes the block (see :func:`_moments_normalize_ncs`): ``block`` (the next block) where
    that pays, else 0.

    It pays where a block's arithmetic takes long enough to hide the next block's reads
    behind it (16-bit data, converted element by element, :mod:`.codecs`) and the data
    streams from memory in long rows: at least :data:`_PREFETCH_MIN_BYTES` read, rows of at
    least :data:`_PREFETCH_MIN_ROW_BYTES`, and room for the block being finished and the next
    one in half the core's L2 cache (a prefetch that evicted the current block would cost a
    second read of it; the other half is left to what else the cache holds, the hardware
    prefetchers' lines among it). Where the L2 cache's size is unknown
    (:func:`_l2_cache_bytes`), it does not prefetch. Prefetching changes no result.
    """
    n, c, s = shape
    row_bytes = s * element_size
    if element_size != 2 or row_bytes < _PREFETCH_MIN_ROW_BYTES \
            or tensors * n * c * row_bytes < _PREFETCH_MIN_BYTES:
        return 0
    return block if 2 * tensors * n * block * row_bytes <= _l2_cache_bytes() // 2 else 0


@functools.lru_cache(maxsize=1024)
def _blocks(shape, element_size, tensors, threads):
    """``(block, ahead)`` of a whole step (:func:`_channel_block`, :func:`_prefetch_ahead`):
    computed once per shape, dtype size, tensor and thread count, not on every step (a few
    microseconds of Python, as much as the kernels take on small tensors)."""
    block = _channel_block(shape, element_size, tensors, threads)
    return block, _prefetch_ahead(shape, element_size, tensors, block)


def _reduction_chunks(rows):
    """Row blocks a channels-last reduction is split into: ``_ROWS_PER_CHUNK`` rows each (the
    last one fewer), whatever the number of threads, so the sums do not depend on it."""
    return max(1, -(-rows // _ROWS_PER_CHUNK))


def _empty(x):
    """Whether the canonical view ``x`` holds no element (then no kernel runs)."""
    return x.numel() == 0


def _nan_moments(x):
    """The ``moments`` of an empty view: NaN, as the CUDA backend returns."""
    return torch.full((2, x.shape[1 if x.dim() == 3 else -1]), float("nan"),
                      dtype=torch.float64, device="cpu")


def _scalar(value, like):
    """``value`` as a numpy scalar of the compute type of ``like``'s data, so float32 (and
    16-bit) loops stay in float32."""
    return codecs.compute_scalar(value, like)


def _elu_floor(t):
    """``common.elu_saturated_y`` for the data of tensor ``t``, as a compute-type scalar."""
    return _elu_floor_of(t.dtype)


@functools.lru_cache(maxsize=None)
def _elu_floor_of(dtype):
    """:func:`_elu_floor` of a (torch) ``dtype``: computed once per dtype, not per call."""
    floor = common.elu_saturated_y(codecs.epsneg(dtype))
    return np.float64(floor) if dtype == torch.float64 else np.float32(floor)


def moments(x):
    """Per-channel ``[mean, M2]`` (float64, shape ``(2, C)``) of a canonical view."""
    if _empty(x):
        return _nan_moments(x)
    threads = _follow_torch_threads()
    if x.dim() == 3:
        return torch.from_numpy(_launch(_moments_ncs, _np(x), _chunks(x, threads)))
    return torch.from_numpy(_launch(_moments_mc, _np(x), _reduction_chunks(x.shape[0])))


def moments_forward(x, out, gamma, beta, eps, act, slope):
    """``moments(x)``, and ``out = act(gamma * (x - mean) / sqrt(var + eps) + beta)``.

    The training forward in one call. In place, with at least ``_FUSED_MIN_CHANNELS`` channels
    (to spread over the threads) or at most ``_FUSED_MAX_ANY_CHANNELS`` elements (where the
    calls' fixed cost outweighs the work), the statistics and output of each block of channels
    are computed back to back while its data is in cache, so the input is read from memory once
    instead of twice (close to the cost of a copy of the tensor, ``forward_over_copy`` of
    ``experiments.bench_kernels``). Out of place, or with fewer channels on more elements, the
    two passes run one after the other: writing a second tensor channel by channel is slower
    than the row-wise ``forward``.
    ``gamma``, ``beta``: float64 ``(C,)``. An empty view writes nothing; its moments are NaN.
    """
    return torch.from_numpy(_moments_forward(x, out, gamma, beta, eps, act, slope))


def _fuses_statistics(x, out):
    """Whether the training forward on the non-empty view ``x`` computes the statistics and
    output of each block of channels back to back (see :func:`moments_forward`)."""
    return (x.dim() == 3 and _in_place(out, x)
            and (x.shape[1] >= _FUSED_MIN_CHANNELS or _fixed_cost_bound(x)))


def _fixed_cost_bound(x):
    """Whether the view ``x`` is small enough (at most ``_FUSED_MAX_ANY_CHANNELS`` elements)
    that the training forward's time is its calls' fixed cost, whatever its channels."""
    return x.numel() <= _FUSED_MAX_ANY_CHANNELS


def _copies_into_output(x, out):
    """Whether :func:`forward_step` from the view ``x`` into ``out``, another view that does
    not overlap it (``forward_step_out``; in place, ``out`` is ``x`` itself, which this tells
    without a call into torch), copies ``x`` into ``out`` and runs in place there: on
    :func:`_fixed_cost_bound` views, where one copy and the fused forward cost less than the two
    passes' calls, as on the small shapes that ``_FUSED_MAX_ANY_CHANNELS`` fuses (measured
    as that constant is)."""
    return out is not x and x.dim() == 3 and _fixed_cost_bound(x)


def _moments_forward(x, out, gamma, beta, eps, act, slope):
    """:func:`moments_forward`, returning the moments as a numpy array."""
    if _empty(x):
        return _nan_moments(x).numpy()
    if not _fuses_statistics(x, out):  # the scale and shift as torch operators
        return compose_moments_forward(sys.modules[__name__], x, out, torch.as_tensor(gamma),
                                       torch.as_tensor(beta), eps, act, slope).numpy()
    xa = _np(x)
    coef = compute_empty((2, x.shape[1]), xa)
    block, ahead = _blocks(x.shape, x.element_size(), 1, _follow_torch_threads())
    return _launch(_moments_forward_ncs_inplace[act], xa, _np(gamma), _np(beta), float(eps),
                   _scalar(slope, xa), coef, block, ahead)


def forward(x, out, a, b, act, slope):
    """``out = act(x * a + b)`` per channel; ``out`` may be ``x`` itself."""
    if _empty(x):
        return
    threads = _follow_torch_threads()
    xa = _np(x)
    kernel = _forward_ncs[act] if x.dim() == 3 else _forward_mc[act]
    _launch(kernel, xa, _output(out, x), _np(a), _np(b), _scalar(slope, xa),
            _chunks(x, threads))


def _compiled_mode(mode):
    """The mode of the backward kernels that run ``mode`` (:data:`_KERNEL_MODES`)."""
    return MODE_XHAT_FROM_Y if mode == MODE_Y else mode


def _kernel_mode(mode, p, q, za):
    """:func:`_compiled_mode` of ``mode`` and the kernel's ``p``, ``q`` arrays: ``MODE_Y`` runs
    with ``p = 1``, ``q = 0`` (its own ``p`` and ``q`` are not read), in the compute dtype of
    the data ``za``."""
    if mode != MODE_Y:
        return mode, _np(p), _np(q)
    pq = compute_empty((2, za.shape[1]), za)  # the channels: axis 1 of (N, C, S) and (M, C)
    pq[0], pq[1] = 1, 0
    return _compiled_mode(mode), pq[0], pq[1]


def backward_reduce(z, dz, x, p, q, act, slope, mode):
    """``[sum(dy), sum(dy * v)]`` per channel (float64, shape ``(2, C)``)."""
    za = _np(z)
    mode, p, q = _kernel_mode(mode, p, q, za)
    return torch.from_numpy(_backward_sums(z, za, _np(dz), _np(x), p, q, act, slope, mode))


def _backward_sums(z, za, dza, xa, p, q, act, slope, mode):
    """:func:`backward_reduce` on the arrays ``za``, ``dza``, ``xa``, ``p``, ``q`` of the view
    ``z``, ``dz``, ``x`` and the coefficients, in a kernel's ``mode`` (:func:`_kernel_mode`),
    returning a numpy array."""
    if _empty(z):
        return np.zeros((2, z.shape[1 if z.dim() == 3 else -1]))
    threads = _follow_torch_threads()
    args = (za, dza, xa, p, q, _scalar(slope, za), _elu_floor(z))
    if z.dim() == 3:
        return _launch(_backward_reduce_ncs[act, mode], *args, _chunks(z, threads))
    return _launch(_backward_reduce_mc[act, mode], *args, _reduction_chunks(z.shape[0]))


def backward_input(z, dz, x, p, q, coef, act, slope, mode, out):
    """``out = dy * coef[0] + v * coef[1] + coef[2]`` per channel; ``out`` may be ``dz``.

    The kernel runs in place over the incoming gradient (each element read, then overwritten);
    into another ``out`` it runs on a copy of ``dz`` made there first. One compiled kernel per
    dtype and layout instead of two, for one extra pass where ``out`` is new: the shared-storage
    layers write over a gradient their own backward created, which no one else can hold.
    """
    if _empty(z):
        return
    if not _in_place(out, dz):
        out.copy_(dz)
    za = _np(z)
    mode, p, q = _kernel_mode(mode, p, q, za)
    _input_gradient_in_place(z, za, _np(out), _np(x), p, q, coef, act, slope, mode)


def _input_gradient_in_place(z, za, dza, xa, p, q, coef, act, slope, mode):
    """:func:`backward_input` over ``dza`` itself, on the arrays of the views ``z``, ``dz``
    and ``x`` and the coefficients ``p``, ``q``, in a kernel's ``mode`` (``z`` not empty)."""
    threads = _follow_torch_threads()
    kernel = _backward_input_ncs[act, mode] if z.dim() == 3 else _backward_input_mc[act, mode]
    _launch(kernel, za, dza, xa, p, q, _np(coef), _scalar(slope, za), _elu_floor(z),
            _chunks(z, threads))


# --------------------------------------------------------------------------- per-channel steps
# The arithmetic around the kernels (:mod:`.per_channel`), one compiled loop over the channels
# per step instead of a dozen numpy or torch operations on vectors. ``state`` is the (6, C)
# float64 per-channel state of :func:`layers.functional.normalize_activate_into`: rows
# ``gamma, beta, dgamma_dweight, mean, rstd, count``.
_scale = _jit_scalar(per_channel.scale)
_scale_derivative = _jit_scalar(per_channel.scale_derivative)
_batch_rstd = _jit_scalar(per_channel.batch_rstd)
_running_average = _jit_scalar(per_channel.running_average)
_unbiased_variance = _jit_scalar(per_channel.unbiased_variance)
_value_coefficients = _jit_scalar(per_channel.value_coefficients)
_scale_gradient = _jit_scalar(per_channel.scale_gradient)
_input_gradient_coefficients = _jit_scalar(per_channel.input_gradient_coefficients)


@_serial
def _channel_scale(weight, bias, eps, abs_mode, state):
    """Rows ``gamma, beta, dgamma_dweight`` of ``state`` from ``weight`` and ``bias`` (arrays,
    or ``None``: scale 1, shift 0)."""
    for j in range(state.shape[1]):
        if weight is None:
            state[0, j], state[2, j] = 1.0, 0.0
        else:
            w = np.float64(weight[j])
            state[0, j] = _scale(w, eps, abs_mode)
            state[2, j] = _scale_derivative(w, abs_mode)
        state[1, j] = 0.0 if bias is None else np.float64(bias[j])


@_serial
def _channel_batch_statistics(moments, count, eps, momentum, running_mean, running_var, state):
    """Rows ``mean, rstd, count`` of ``state`` from the batch's ``[mean, M2]`` (``moments``),
    and the running statistics (arrays, or ``None``) updated as ``nn.BatchNorm2d`` does."""
    for j in range(state.shape[1]):
        mean, m2 = moments[0, j], moments[1, j]
        state[3, j], state[4, j], state[5, j] = mean, _batch_rstd(m2, count, eps), count
        if running_mean is not None:
            running_mean[j] = _running_average(np.float64(running_mean[j]), mean, momentum)
            running_var[j] = _running_average(np.float64(running_var[j]),
                                              _unbiased_variance(m2, count), momentum)


@_serial
def _channel_running_statistics(running_mean, running_var, count, eps, state):
    """Rows ``mean, rstd, count`` of ``state`` from the running statistics (eval)."""
    for j in range(state.shape[1]):
        state[3, j] = running_mean[j]
        state[4, j] = _batch_rstd(np.float64(running_var[j]), 1, eps)
        state[5, j] = count


@_serial
def _channel_value_coefficients(state, from_x, variant_y, pq):
    """``pq`` = ``[p, q]`` of the backward's value ``v = u * p + q`` (:mod:`.common`): ``x_hat``
    from the stored input (``from_x``) or from ``y``, or ``y`` itself (``variant_y``: ``p = 1``,
    ``q = 0``, as the kernels run ``MODE_Y``)."""
    for j in range(state.shape[1]):
        if variant_y:
            pq[0, j], pq[1, j] = 1.0, 0.0
        else:
            pq[0, j], pq[1, j] = _value_coefficients(state[0, j], state[1, j], state[3, j],
                                                     state[4, j], from_x)


@_serial
def _channel_gradients(state, sums, training, variant_y, coef, dweight, dbias, first, last):
    """The backward's per-channel results, for channels ``first`` to ``last``, from the global
    sums ``[sum dy, sum dy * v]``: ``coef`` (or ``None``: no input gradient) the input
    gradient's ``(k0, k1, k2)``, ``dweight`` and ``dbias`` (or ``None``) the parameter
    gradients."""
    for j in range(first, last):
        gamma, beta, rstd, count = state[0, j], state[1, j], state[4, j], state[5, j]
        sum_dy, sum_dy_v = sums[0, j], sums[1, j]
        if coef is not None:
            if training:
                k0, k1, k2 = _input_gradient_coefficients(gamma, beta, rstd, count, sum_dy,
                                                          sum_dy_v, variant_y)
            else:  # running statistics do not depend on x
                k0, k1, k2 = gamma * rstd, 0.0, 0.0
            coef[0, j], coef[1, j], coef[2, j] = k0, k1, k2
        if dweight is not None:
            dweight[j] = _scale_gradient(gamma, beta, sum_dy, sum_dy_v, variant_y) * state[2, j]
        if dbias is not None:
            dbias[j] = sum_dy


def _optional(t):
    """The numpy view of an optional per-channel tensor (``None`` stays ``None``)."""
    return None if t is None else codecs.cpu_array(t)


def _addressable(*tensors):
    """Whether a whole-step kernel may read each of ``tensors`` (``None`` where absent) at its
    address (:func:`_address`): each is contiguous."""
    for tensor in tensors:  # a loop, not all() over a generator: called twice per step
        if tensor is not None and not tensor.is_contiguous():
            return False
    return True


def _address(tensor):
    """The address of a contiguous CPU tensor's first element (``None`` stays ``None``).

    The whole-step kernels take their tensors so and read them as arrays
    (:func:`_array_at`): a numpy view per tensor and call (:func:`_np`) costs several times
    more, a visible part of a small tensor's step. The caller holds the tensor (an argument of
    the step) until the kernel returns."""
    return None if tensor is None else tensor.data_ptr()


def _vector_element(*vectors):
    """:func:`codecs.cpu_element` of the per-channel ``vectors`` of a whole step (``None``
    where absent), which its kernel reads by address as one dtype
    (:func:`layers.kernels.step_vector_dtype`); ``None`` where they are not of one such dtype
    (the numpy views of the other path take any mix)."""
    dtype = step_vector_dtype(vectors)
    return None if dtype is None else codecs.cpu_element(dtype)


# --------------------------------------------------------------------------- whole steps
# Where the CPU kernels run eagerly, :mod:`layers.functional` runs a layer's forward and its
# backward as one call each. On small tensors the Python between separate calls, and each
# call's start of numba's threads, more than the kernels, make up a step's time. The in-place
# training forward and the backward of (N, C, S) views are then one compiled call each (the
# passes and the per-channel loops above); other views run the kernels one by one, their
# arrays made once.

@_Variants(_parallel_reduction, _ACTS)
def _forward_step_ncs_inplace(act):
    def kernel(x, shape, element, weight, bias, running_mean, running_var, vector_element, eps,
               momentum, abs_mode, slope, state, block, ahead):
        """The training forward in place: the scale, the statistics and output channel by
        channel, the batch and running statistics; the per-channel state into ``state``. The
        tensors arrive as addresses (:func:`_address`): ``x`` of ``shape`` with elements of
        ``element``'s type, the per-channel vectors (or None) of ``vector_element``'s."""
        n, c, s = shape
        x = _array_at(x, shape, element)
        weight, bias = _array_at(weight, c, vector_element), _array_at(bias, c, vector_element)
        running_mean = _array_at(running_mean, c, vector_element)
        running_var = _array_at(running_var, c, vector_element)
        _channel_scale(weight, bias, eps, abs_mode, state)
        coef = compute_empty((2, c), x)
        moments = _moments_normalize_ncs(x, state[0], state[1], eps, act, slope, coef, block,
                                         ahead)
        _channel_batch_statistics(moments, n * s, eps, momentum, running_mean, running_var,
                                  state)
    return kernel


@_Variants(_parallel_reduction, _ACT_MODES)
def _backward_step_ncs(act, mode):
    from_x = mode == MODE_XHAT_FROM_X

    def kernel(z, dz, out, x, shape, element, state, training, variant_y, slope, floor, block,
               ahead, coef, dweight, dbias):
        """The backward per block of ``block`` consecutive channels (blocks in parallel):
        ``v``'s coefficients (``variant_y``: ``MODE_Y``, which this kernel of
        ``MODE_XHAT_FROM_Y`` runs with ``p = 1``, ``q = 0``), the reductions, the per-channel
        gradients and, unless ``coef`` is None, the input gradient while the block is in cache
        (its element-wise arithmetic compiled with the reductions' reassociation, so it may
        differ from :func:`_backward_input_ncs` in the last bit): into ``out``, an array of
        ``shape`` that does not overlap ``dz``, in the same pass that reads ``dz`` (no copy of
        it first), or over ``dz`` where ``out`` is None (:func:`_target`: one array read and
        written, not two that alias).
        Each channel's sums run over its rows in the order of the batch, as in
        :func:`_reduce_ncs`, whatever ``block`` is. While it writes a block's input gradient
        it prefetches, with each row, the rows ``ahead`` channels on of ``z``, ``dz`` and (in
        ``MODE_XHAT_FROM_X``) ``x``, as :func:`_moments_normalize_ncs` does (all three of
        ``shape``, so one distance, :func:`_elements_ahead`, serves them). ``z``, ``dz`` and
        ``x`` (and ``out``) arrive as addresses (:func:`_address`) of arrays of ``shape`` with
        elements of ``element``'s type, ``state`` as an address of its (6, C) float64 values."""
        n, c, _ = shape
        z, dz, x = (_array_at(z, shape, element), _array_at(dz, shape, element),
                    _array_at(x, shape, element))
        out = _array_at(out, shape, element)
        state = _array_at(state, (6, c), np.float64(0))
        pq = compute_empty((2, c), z)
        _channel_value_coefficients(state, from_x, variant_y, pq)
        sums = np.empty((2, c), np.float64)
        for blk in numba.prange(-(-c // block)):
            first, last = blk * block, min((blk + 1) * block, c)
            for j in range(first, last):
                sums[0, j] = 0.0
                sums[1, j] = 0.0
            for i in range(n):
                for j in range(first, last):
                    s0, s1 = _reduce_row(z[i, j], dz[i, j], x[i, j], pq[0, j], pq[1, j], act,
                                         slope, floor, mode)
                    sums[0, j] += s0
                    sums[1, j] += s1
            _channel_gradients(state, sums, training, variant_y, coef, dweight, dbias, first,
                               last)
            if coef is not None:
                for i in range(n):
                    for j in range(first, last):
                        grad = dz[i, j]
                        _input_row(z[i, j], grad, x[i, j], pq[0, j], pq[1, j], coef[0, j],
                                   coef[1, j], coef[2, j], act, slope, floor, mode,
                                   _target(_row(out, i, j), grad), _elements_ahead(z, j, ahead))
    return kernel


def forward_step(x, out, weight, bias, running_mean, running_var, training, momentum, eps, act,
                 slope, abs_mode):
    """The forward of BN + activation on canonical views: ``out = act(gamma * x_hat + beta)``
    (``out`` may be ``x``), with the batch statistics in ``training`` (the running statistics,
    if given, updated as ``nn.BatchNorm2d`` does), else the running ones.

    Returns the (6, C) float64 per-channel state (rows ``gamma, beta, dgamma_dweight, mean,
    rstd, count``), a tensor. ``weight``, ``bias``, ``running_mean``, ``running_var``: float32
    or float64 tensors, or ``None``; ``abs_mode``: the scale is ``|weight| + eps``, else
    ``weight``.
    """
    channels = x.shape[1]
    state = np.empty((6, channels))
    vector_element = _vector_element(weight, bias, running_mean, running_var)
    if training and _copies_into_output(x, out):
        x = out.copy_(x)
    if (training and _fuses_statistics(x, out) and not _empty(x) and vector_element is not None
            and _addressable(x, weight, bias, running_mean, running_var)):
        element, shape = codecs.cpu_element(x.dtype), tuple(x.shape)
        block, ahead = _blocks(shape, x.element_size(), 1, _follow_torch_threads())
        _launch(
            _forward_step_ncs_inplace[act], x.data_ptr(), shape, element, _address(weight),
            _address(bias), _address(running_mean), _address(running_var), vector_element,
            float(eps), float(momentum), bool(abs_mode), codecs.compute_scalar(slope, element),
            state, block, ahead)
        return torch.from_numpy(state)
    weight, bias = _optional(weight), _optional(bias)
    running_mean, running_var = _optional(running_mean), _optional(running_var)
    count = x.numel() // channels
    _channel_scale(weight, bias, float(eps), bool(abs_mode), state)
    if training:
        moments = _moments_forward(x, out, state[0], state[1], eps, act, slope)
        _channel_batch_statistics(moments, count, float(eps), float(momentum), running_mean,
                                  running_var, state)
    else:
        _channel_running_statistics(running_mean, running_var, count, float(eps), state)
        ab = compute_empty((2, channels), _np(x))
        ab[0], ab[1] = per_channel.scale_shift(state[0], state[1], state[3], state[4])
        forward(x, out, ab[0], ab[1], act, slope)
    return torch.from_numpy(state)


def backward_step(z, dz, x, state, act, slope, mode, training, input_grad, param_dtype,
                  has_weight, has_bias, out=None):
    """The backward of BN + activation on canonical views, given the forward's ``state``.

    Writes the input gradient if ``input_grad``: into ``out``, a view shaped like ``dz`` that
    does not overlap it (``dz`` is only read), or over ``dz`` where ``out`` is None or ``dz``
    itself (for a caller that owns ``dz``); returns ``(dweight, dbias)``,
    tensors of ``param_dtype`` (float32 or float64; ``None`` where ``has_weight`` /
    ``has_bias`` is false). ``x`` is only read in ``MODE_XHAT_FROM_X`` (``None`` otherwise:
    ``v`` is recovered from ``z``); ``training``: whether the forward used batch statistics.
    """
    channels = z.shape[1]
    element = codecs.cpu_element(z.dtype)
    coef = compute_empty((3, channels), element) if input_grad else None
    gradient_dtype = _NUMPY_DTYPES[param_dtype]
    dweight = np.empty(channels, gradient_dtype) if has_weight else None
    dbias = np.empty(channels, gradient_dtype) if has_bias else None
    if out is not None and (not input_grad or _in_place(out, dz)):
        out = None  # nothing written, or written over dz: the in-place kernel
    if (z.dim() == 3 and not _empty(z) and state.dtype is torch.float64
            and _addressable(z, dz, x, state, out)):
        tensors = 2 if x is None else 3  # z, dz (and x)
        shape = tuple(z.shape)
        block, ahead = _blocks(shape, z.element_size(), tensors, _follow_torch_threads())
        z_address = z.data_ptr()
        # MODE_Y runs the MODE_XHAT_FROM_Y kernel with p = 1, q = 0 (variant_y)
        _launch(
            _backward_step_ncs[act, _compiled_mode(mode)], z_address, dz.data_ptr(),
            _address(out), z_address if x is None else x.data_ptr(), shape, element,
            state.data_ptr(), bool(training), mode == MODE_Y,
            codecs.compute_scalar(slope, element), _elu_floor(z), block,
            ahead if input_grad else 0, coef, dweight, dbias)
    else:
        _backward_passes(z, dz, x, _np(state), act, slope, mode, training, coef, dweight, dbias,
                         dz if out is None else out)
    return _optional_tensor(dweight), _optional_tensor(dbias)


def _backward_passes(z, dz, x, state, act, slope, mode, training, coef, dweight, dbias, out):
    """:func:`backward_step` on views the whole-step kernel does not take: the reductions, the
    per-channel gradients into ``coef``, ``dweight``, ``dbias`` (arrays, or None), and the input
    gradient into ``out`` (``dz`` itself, or a copy of it made there first:
    :func:`backward_input`) unless ``coef`` is None, one kernel after the other."""
    channels = z.shape[1]
    from_x, variant_y = mode == MODE_XHAT_FROM_X, mode == MODE_Y
    kernel_mode = _compiled_mode(mode)  # variant_y: p = 1, q = 0 (_channel_value_coefficients)
    za, dza = _np(z), _np(dz)
    xa = za if x is None else _np(x)
    pq = compute_empty((2, channels), za)
    _channel_value_coefficients(state, from_x, variant_y, pq)
    p, q = pq[0], pq[1]
    sums = _backward_sums(z, za, dza, xa, p, q, act, slope, kernel_mode)
    _channel_gradients(state, sums, bool(training), variant_y, coef, dweight, dbias, 0,
                       channels)
    if coef is not None:
        backward_input(z, dz, xa, p, q, coef, act, slope, kernel_mode, out)


#: numpy dtypes of the parameter gradients of :func:`backward_step`.
_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _optional_tensor(array):
    """A tensor sharing the memory of the numpy ``array`` (``None`` stays ``None``)."""
    return None if array is None else torch.from_numpy(array)
