"""The CPU that numba compiles the CPU kernels for, and the instruction sets they may use."""
import numba
import numba.core.codegen


def compiles_for(feature):
    """Whether the code numba compiles may use the CPU ``feature`` (LLVM's name, e.g.
    ``"avx512f"``): the features its code generator targets, ``NUMBA_CPU_FEATURES`` where set,
    else the host's as numba reads them (``NUMBA_ENABLE_AVX=0`` and hosts whose features LLVM
    cannot read included)."""
    features = numba.config.CPU_FEATURES
    if features is None:
        features = numba.core.codegen.get_host_cpu_features()
    return f"+{feature}" in features.split(",")
