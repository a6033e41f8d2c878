"""Cityscapes in its released layout, with the official 19 training classes.

The layout is that of the ``leftImg8bit_trainvaltest.zip`` and ``gtFine_trainvaltest.zip``
archives (and, for the coarse extra data, ``leftImg8bit_trainextra.zip`` and
``gtCoarse.zip``) unpacked into one ``root``::

    root/leftImg8bit/<split>/<city>/<city>_<seq>_<frame>_leftImg8bit.png     RGB images
    root/gtFine/<split>/<city>/<city>_<seq>_<frame>_gtFine_labelIds.png      8-bit labelIds
    root/leftImg8bit/train_extra/<city>/..._leftImg8bit.png                   coarse extra
    root/gtCoarse/train_extra/<city>/..._gtCoarse_labelIds.png                (``coarse=True``)

Only the ``_labelIds`` PNGs are read (the release's ``_color``, ``_instanceIds`` and
``_polygons.json`` files are ignored). Label ids map to train ids with the official table of
cityscapesScripts' ``labels.py`` (:data:`LABEL_TO_TRAIN`, 19 classes :data:`CLASSES`); every
other id of the table (:data:`LABEL_IDS`, 0..33) is void (255), and a value outside the table
(a corrupt map, or a ``labelTrainIds`` map saved under the ``labelIds`` name, with its 255) is
an error naming the file and the values, as in the official evaluator. The test split's
released labelIds are all void, so its label files may be absent: such samples get an all-255
target. ``coarse=True`` (training only) adds the
~20,000 coarsely annotated ``train_extra`` images to the fine training set.

Checked when :class:`Cityscapes` is built, each failure a
:class:`~experiments.train.data.errors.DatasetLayoutError` naming the path and the layout: the
image folder of the split (and of ``train_extra``) exists and has city folders, each holding
``*_leftImg8bit.png`` images; each image of ``train``/``val``/``train_extra`` has its label
file. Images and label maps are decoded when read (a label map of another size than its image
is an error there).
"""

from .errors import DatasetLayoutError
from .segmentation import SegmentationDataset, checked_root, make_lut, partner

SPLITS = ("train", "val", "test")

# cityscapesScripts helpers/labels.py: labelId -> trainId for the 19 evaluated classes.
LABEL_TO_TRAIN = {7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10,
                  24: 11, 25: 12, 26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18}
CLASSES = ("road", "sidewalk", "building", "wall", "fence", "pole", "traffic light",
           "traffic sign", "vegetation", "terrain", "sky", "person", "rider", "car", "truck",
           "bus", "train", "motorcycle", "bicycle")
LUT = make_lut(LABEL_TO_TRAIN, len(CLASSES))
# cityscapesScripts helpers/labels.py: the ids a labelIds map holds ('unlabeled' 0 ..
# 'bicycle' 33; 'license plate', id -1, is not written to the maps).
LABEL_IDS = range(34)

IMAGE_SUFFIX = "_leftImg8bit.png"
EXPECTED_LAYOUT = (
    "ROOT/leftImg8bit/<split>/<city>/<city>_<seq>_<frame>_leftImg8bit.png (RGB) with "
    "ROOT/gtFine/<split>/<city>/<city>_<seq>_<frame>_gtFine_labelIds.png (8-bit labelIds "
    "0..33, same size; optional for test), split in train/val/test; coarse extra data: "
    "ROOT/leftImg8bit/train_extra/<city>/..._leftImg8bit.png with "
    "ROOT/gtCoarse/train_extra/<city>/..._gtCoarse_labelIds.png (Cityscapes release layout)")


def _cities(folder):
    if not folder.is_dir():
        raise DatasetLayoutError.at(folder, "no such folder", EXPECTED_LAYOUT)
    cities = sorted(p for p in folder.iterdir() if p.is_dir())
    if not cities:
        raise DatasetLayoutError.at(folder, "has no city folders", EXPECTED_LAYOUT)
    return cities


def _samples(root, split, label_folder, label_suffix, labels_required):
    """``(image, label)`` pairs of ``leftImg8bit/<split>``, labels in ``<label_folder>/<split>``."""
    samples = []
    cities = _cities(root / "leftImg8bit" / split)
    label_split = root / label_folder / split
    if labels_required and not label_split.is_dir():
        raise DatasetLayoutError.at(label_split, "no such folder (the labels of "
                                    f"leftImg8bit/{split})", EXPECTED_LAYOUT)
    for city in cities:
        images = sorted(p for p in city.iterdir()
                        if p.name.endswith(IMAGE_SUFFIX) and p.is_file())
        if not images:
            raise DatasetLayoutError.at(city, f"city folder without *{IMAGE_SUFFIX} images",
                                        EXPECTED_LAYOUT)
        label_city = label_split / city.name
        if labels_required and not label_city.is_dir():
            raise DatasetLayoutError.at(label_city, f"no such folder (the labels of {city})",
                                        EXPECTED_LAYOUT)
        for image in images:
            label = label_city / (image.name[:-len(IMAGE_SUFFIX)] + label_suffix)
            samples.append((image, partner(image, label, "label file", EXPECTED_LAYOUT,
                                           labels_required)))
    return samples


class Cityscapes(SegmentationDataset):
    """One split (``"train"``, ``"val"`` or ``"test"``) of a Cityscapes tree under ``root``.

    Items are ``(image, target)`` (see :class:`~.segmentation.SegmentationDataset`): train
    ids of :data:`CLASSES`, 255 for void and for test images without label files.
    ``coarse=True`` (``split="train"`` only) appends the ``train_extra`` images with their
    ``gtCoarse`` labels after the fine ones.
    """

    def __init__(self, root, split, transform=None, *, coarse=False):
        root = checked_root(root, split, SPLITS, EXPECTED_LAYOUT)
        if coarse and split != "train":
            raise ValueError(f"coarse=True adds the train_extra images to the training split; "
                             f"it is not available for split={split!r}")
        self.split = split
        self.coarse = bool(coarse)
        samples = _samples(root, split, "gtFine", "_gtFine_labelIds.png",
                           labels_required=split != "test")
        self.num_fine = len(samples)
        if coarse:
            samples += _samples(root, "train_extra", "gtCoarse", "_gtCoarse_labelIds.png",
                                labels_required=True)
        super().__init__(samples, CLASSES, LUT, transform, root=root, expected=EXPECTED_LAYOUT,
                         valid=LABEL_IDS)


__all__ = ["CLASSES", "Cityscapes", "EXPECTED_LAYOUT", "LABEL_IDS", "LABEL_TO_TRAIN", "LUT",
           "SPLITS"]
