"""Memory-saving layers: In-Place Activated BatchNorm and memory-efficient DenseNets.

``ABN``, ``InPlaceABN`` and ``InPlaceABNSync`` are ``nn.Module``s; :mod:`layers.functional`
holds the autograd functions behind them. Kernels (:mod:`layers.kernels`) compile lazily on
first use, so importing this package is cheap.
"""
from . import functional
from .abn import ABN, InPlaceABN, InPlaceABNSync

__all__ = ["ABN", "InPlaceABN", "InPlaceABNSync", "functional"]
