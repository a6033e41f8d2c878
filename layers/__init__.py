"""Memory-saving layers: In-Place Activated BatchNorm and memory-efficient DenseNets.

``ABN``, ``InPlaceABN``, ``ABNSync`` and ``InPlaceABNSync`` are ``nn.Module``s with
``nn.BatchNorm2d``'s parameters and state dict (but not ``_BatchNorm`` subclasses: select
normalization layers with ``NORM_TYPES``); :mod:`layers.functional` holds the autograd
functions behind them and :func:`convert_sync_batchnorm` synchronises a model's ABN layers.
:mod:`layers.densenet` builds DenseNet-BC networks with the naive, shared-storage (Pleiss et
al.) or checkpointed implementation; ``resnext101``, ``resnext152``, ``wideresnet38`` and
``deeplabv3`` are the InPlace-ABN paper's classification and segmentation networks, with
standard BN, InPlace-ABN or InPlace-ABN sync (``norm``). In eval mode every layer and model
scripts, traces and exports to ONNX as standard PyTorch ops, and :func:`fuse_abn` folds
``conv -> BN`` pairs for inference. Kernels (:mod:`layers.kernels`) compile lazily on first
use, so importing this package is cheap.
"""
from . import functional
from .abn import ABN, NORM_TYPES, ABNSync, InPlaceABN, InPlaceABNSync
from .convert import convert_sync_batchnorm
from .deeplab import DeepLabV3, deeplabv3
from .densenet import (DenseNet, densenet121, densenet161, densenet169, densenet201,
                       densenet232, densenet264, densenet_bc)
from .fuse import fuse_abn
from .resnext import ResNeXt, resnext101, resnext152
from .wideresnet import WideResNet, wideresnet38

__all__ = ["ABN", "InPlaceABN", "ABNSync", "InPlaceABNSync", "NORM_TYPES",
           "convert_sync_batchnorm", "DenseNet", "densenet_bc", "densenet121", "densenet161",
           "densenet169", "densenet201", "densenet232", "densenet264", "ResNeXt", "resnext101",
           "resnext152", "WideResNet", "wideresnet38", "DeepLabV3", "deeplabv3", "fuse_abn",
           "functional"]
