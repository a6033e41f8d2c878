"""Data for the training experiments: the real data sets in their released on-disk formats,
the papers' augmentation, loaders, and generated stand-ins in the same formats.

- :mod:`.cifar`: :class:`CIFAR`, CIFAR-10/100 from torchvision's python batches, validated.
- :mod:`.imagenet`: :class:`ImageNet`, an ImageFolder tree ``root/{train,val}/<wnid>/``.
- :mod:`.transforms`: ImageNet training augmentation (crop, flip, colour jitter, PCA
  lighting) and evaluation crops (centre, ten-crop; 224 and 320), the CIFAR recipe.
- :mod:`.loaders`: :func:`make_loader` (DistributedSampler for training, or a given
  ``train_sampler``; an unpadded shard sampler for evaluation; augmentation seeded per
  sample) and :class:`ShardSampler`.
- :mod:`.segmentation`: :class:`SegmentationDataset`, the shared base of the segmentation
  sets (image and 8-bit label map pairs, a label -> train id table, void 255), and
  :mod:`.cityscapes` (:class:`Cityscapes`, 19 classes, optional coarse extra data),
  :mod:`.cocostuff` (:class:`COCOStuff`, the 91 stuff classes) and :mod:`.vistas`
  (:class:`Vistas`, classes from its ``config.json``, or the v2.0 download's
  ``config_v1.2.json``), each in its released layout.
- :mod:`.seg_transforms`: the paper's segmentation augmentation (:class:`SegmentationTrain`:
  flip, scale 0.7-2.0, crop padded with the mean colour and void) and
  :class:`SegmentationEval`.
- :mod:`.class_uniform`: :class:`ClassUniformSampler`, the paper's class-uniform sampling of
  segmentation training images, sharded over ranks.
- :mod:`.generate`: deterministic, learnable CIFAR and ImageNet-layout data sets, written
  atomically (``python -m experiments.train.data.generate``).
- :mod:`.errors`: :class:`DatasetLayoutError`, raised for any data set that is missing or laid
  out wrongly, naming the path and the expected layout.
"""
from .cifar import CIFAR
from .cityscapes import Cityscapes
from .class_uniform import ClassUniformSampler
from .cocostuff import COCOStuff
from .errors import DatasetLayoutError
from .imagenet import ImageNet
from .loaders import ShardSampler, make_loader
from .seg_transforms import SegmentationEval, SegmentationTrain
from .segmentation import SegmentationDataset
from .transforms import cifar_eval, cifar_train, imagenet_eval, imagenet_train
from .vistas import Vistas


def __getattr__(name):
    # The generators load on first use, not with the package: ``python -m
    # experiments.train.data.generate`` must find its module not yet imported.
    if name in ("generate_cifar", "generate_imagenet"):
        from . import generate
        return getattr(generate, name)
    if name in ("generate_cityscapes", "generate_cocostuff", "generate_vistas"):
        from . import generate_segmentation
        return getattr(generate_segmentation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["CIFAR", "COCOStuff", "Cityscapes", "ClassUniformSampler", "DatasetLayoutError",
           "ImageNet", "SegmentationDataset", "SegmentationEval", "SegmentationTrain",
           "ShardSampler", "Vistas", "cifar_eval", "cifar_train", "generate_cifar",
           "generate_cityscapes", "generate_cocostuff", "generate_imagenet", "generate_vistas",
           "imagenet_eval", "imagenet_train", "make_loader"]
