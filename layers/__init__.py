"""Memory-saving layers: In-Place Activated BatchNorm and memory-efficient DenseNets.

``ABN``, ``InPlaceABN`` and ``InPlaceABNSync`` are ``nn.Module``s; :mod:`layers.functional`
holds the autograd functions behind them. :mod:`layers.densenet` builds DenseNet-BC networks
with the naive, shared-storage (Pleiss et al.) or checkpointed implementation; ``resnext101``,
``wideresnet38`` and ``deeplabv3`` are the InPlace-ABN paper's classification and segmentation
networks, with standard BN or InPlace-ABN (``norm``). Kernels (:mod:`layers.kernels`) compile lazily on
first use, so importing this package is cheap.
"""
from . import functional
from .abn import ABN, InPlaceABN, InPlaceABNSync
from .deeplab import DeepLabV3, deeplabv3
from .densenet import (DenseNet, densenet121, densenet161, densenet169, densenet201,
                       densenet232, densenet264, densenet_bc)
from .resnext import ResNeXt, resnext101
from .wideresnet import WideResNet, wideresnet38

__all__ = ["ABN", "InPlaceABN", "InPlaceABNSync", "DenseNet", "densenet_bc", "densenet121",
           "densenet161", "densenet169", "densenet201", "densenet232", "densenet264",
           "ResNeXt", "resnext101", "WideResNet", "wideresnet38", "DeepLabV3", "deeplabv3",
           "functional"]
