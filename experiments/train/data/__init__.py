"""Data for the training experiments: the real data sets in their released on-disk formats,
the papers' augmentation, loaders, and generated stand-ins in the same formats.

- :mod:`.cifar`: :class:`CIFAR`, CIFAR-10/100 from torchvision's python batches, validated.
- :mod:`.imagenet`: :class:`ImageNet`, an ImageFolder tree ``root/{train,val}/<wnid>/``.
- :mod:`.transforms`: ImageNet training augmentation (crop, flip, colour jitter, PCA
  lighting) and evaluation crops (centre, ten-crop; 224 and 320), the CIFAR recipe.
- :mod:`.loaders`: :func:`make_loader` (DistributedSampler for training, an unpadded shard
  sampler for evaluation, augmentation seeded per sample) and :class:`ShardSampler`.
- :mod:`.generate`: deterministic, learnable CIFAR and ImageNet-layout data sets, written
  atomically (``python -m experiments.train.data.generate``).
- :mod:`.errors`: :class:`DatasetLayoutError`, raised for any data set that is missing or laid
  out wrongly, naming the path and the expected layout.
"""
from .cifar import CIFAR
from .errors import DatasetLayoutError
from .imagenet import ImageNet
from .loaders import ShardSampler, make_loader
from .transforms import cifar_eval, cifar_train, imagenet_eval, imagenet_train


def __getattr__(name):
    # The generators load on first use, not with the package: ``python -m
    # experiments.train.data.generate`` must find its module not yet imported.
    if name in ("generate_cifar", "generate_imagenet"):
        from . import generate
        return getattr(generate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["CIFAR", "DatasetLayoutError", "ImageNet", "ShardSampler", "cifar_eval",
           "cifar_train", "generate_cifar", "generate_imagenet", "imagenet_eval",
           "imagenet_train", "make_loader"]
