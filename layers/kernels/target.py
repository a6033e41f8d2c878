"""The CPU that numba compiles the CPU kernels for: the instruction sets they may use, and the
cache hint they give it."""
import numba
import numba.core.codegen
from llvmlite import ir
from numba.core import cgutils


def compiles_for(feature):
    """Whether the code numba compiles may use the CPU ``feature`` (LLVM's name, e.g.
    ``"avx512f"``): the features its code generator targets, ``NUMBA_CPU_FEATURES`` where set,
    else the host's as numba reads them (``NUMBA_ENABLE_AVX=0`` and hosts whose features LLVM
    cannot read included)."""
    features = numba.config.CPU_FEATURES
    if features is None:
        features = numba.core.codegen.get_host_cpu_features()
    return f"+{feature}" in features.split(",")


def emit_prefetch(builder, pointer):
    """LLVM: ask the CPU to bring the cache line at ``pointer`` into its L2 cache (``llvm.prefetch``
    for a read with moderate locality: x86's ``prefetcht1``). A hint: it reads nothing into the
    program, never faults, and changes no result."""
    byte_pointer = ir.IntType(8).as_pointer()
    word = ir.IntType(32)
    hint = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [byte_pointer, word, word, word]),
        "llvm.prefetch.p0")
    # read (0), locality 2 of 0-3 (the L2 cache), data cache (1)
    builder.call(hint, [builder.bitcast(pointer, byte_pointer), ir.Constant(word, 0),
                        ir.Constant(word, 2), ir.Constant(word, 1)])
