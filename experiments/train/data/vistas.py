"""Mapillary Vistas (research edition) in its released layouts, classes from its config.

The layout of the v1.x archive unpacked into ``root``::

    root/config.json                                   {"labels": [{"name", "readable", "color",
                                                         "instances", "evaluate"}, ...]}
    root/{training,validation,testing}/images/<key>.jpg           RGB images
    root/{training,validation}/labels/<key>.png                   8-bit palette label maps

and that of today's download (v2.0, which carries the v1.2 labels the paper's 65 classes are,
beside v2.0's): ``root/config_v1.2.json`` and ``root/{training,validation}/v1.2/labels/``,
the images as above (:data:`LAYOUTS`; the v2.0 labels are not read). A tree with
``config.json`` is read as v1.x.

``config.json`` lists the labels; a label's id is its index in that list (v1.2: 66 labels,
the last, ``void--unlabeled``, not evaluated). The label PNGs are palette images whose pixel
indices are those ids (read as indices, never as colours). Ids of labels with ``"evaluate":
true`` become consecutive train ids in config order (v1.2: 65 classes); the others are void
(255). An index beyond the list is no label of the release (a map of another version, or a
wrong file) and raises, naming the file and the values, rather than turning into void. ``classes`` are the labels' ``"readable"`` names (their
``"name"`` where a label has none), ``names`` their ``"name"`` fields. The ``testing`` split
has no labels: its targets are all void. The release's ``instances/`` maps are not read.

Checked when :class:`Vistas` is built, each failure a
:class:`~experiments.train.data.errors.DatasetLayoutError` naming the path and the layout:
``config.json`` exists, parses, and has a ``"labels"`` list of at most 256 objects with a
string ``"name"`` and a boolean ``"evaluate"``, at least one evaluated; the split's
``images/`` folder exists and holds images; in ``training`` and ``validation`` each image has
its ``labels/<key>.png``. Files are decoded when read.
"""
import json

from .errors import DatasetLayoutError
from .segmentation import IGNORE_INDEX, SegmentationDataset, checked_root, make_lut, partner

SPLITS = ("training", "validation", "testing")
LABELLED_SPLITS = ("training", "validation")
IMAGE_EXTENSIONS = (".jpg", ".jpeg")
#: The released layouts, in the order they are tried: (config file, label folder inside a
#: split): the v1.x archive, then the v2.0 download's research edition v1.2.
LAYOUTS = (("config.json", "labels"), ("config_v1.2.json", "v1.2/labels"))

EXPECTED_LAYOUT = (
    "ROOT/config.json ({\"labels\": [{\"name\": str, \"readable\": str, \"color\": [r, g, b], "
    "\"evaluate\": bool, ...}, ...]}, label id = list index), "
    "ROOT/{training,validation,testing}/images/<key>.jpg (RGB) and "
    "ROOT/{training,validation}/labels/<key>.png (8-bit palette PNG of label ids, same size) "
    "(Mapillary Vistas research edition layout; or the v2.0 download's ROOT/config_v1.2.json "
    "and ROOT/{training,validation}/v1.2/labels/)")


def layout(root):
    """``(config path, label folder name)`` of the tree at ``root`` (:data:`LAYOUTS`: the first
    whose config file exists; none: the v1.x names, whose absence is then reported)."""
    for config, labels in LAYOUTS:
        if (root / config).is_file():
            return root / config, labels
    return root / LAYOUTS[0][0], LAYOUTS[0][1]


def read_config(path):
    """``(classes, names, lut, labels)`` from a Vistas ``config.json``: readable and machine
    names of the evaluated labels, the label id -> train id table, and the number of labels
    (the ids a label map may hold are ``0 .. labels - 1``)."""
    if not path.is_file():
        raise DatasetLayoutError.at(path, "missing file", EXPECTED_LAYOUT)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetLayoutError.at(path, f"cannot parse the JSON ({type(exc).__name__}: {exc})",
                                    EXPECTED_LAYOUT) from exc
    labels = config.get("labels") if isinstance(config, dict) else None
    if not isinstance(labels, list) or not labels:
        raise DatasetLayoutError.at(path, "no non-empty \"labels\" list at the top level",
                                    EXPECTED_LAYOUT)
    if len(labels) > 256:
        raise DatasetLayoutError.at(path, f"{len(labels)} labels, more than an 8-bit label map "
                                    "can index (256)", EXPECTED_LAYOUT)
    classes, names, mapping = [], [], {}
    for i, label in enumerate(labels):
        if not (isinstance(label, dict) and isinstance(label.get("name"), str)
                and isinstance(label.get("evaluate"), bool)):
            raise DatasetLayoutError.at(path, f"label {i} ({label!r:.80}) is not an object with a "
                                        "string \"name\" and a boolean \"evaluate\"",
                                        EXPECTED_LAYOUT)
        if label["evaluate"]:
            mapping[i] = len(classes)
            readable = label.get("readable")
            classes.append(readable if isinstance(readable, str) else label["name"])
            names.append(label["name"])
    if not classes:
        raise DatasetLayoutError.at(path, "no label has \"evaluate\": true", EXPECTED_LAYOUT)
    if len(classes) >= IGNORE_INDEX:
        raise DatasetLayoutError.at(path, f"{len(classes)} evaluated labels; train ids must stay "
                                    f"below the void id {IGNORE_INDEX}", EXPECTED_LAYOUT)
    return classes, names, make_lut(mapping, len(classes)), len(labels)


class Vistas(SegmentationDataset):
    """One split (``"training"``, ``"validation"`` or ``"testing"``) of a Vistas tree.

    Items are ``(image, target)`` (see :class:`~.segmentation.SegmentationDataset`): train
    ids of the evaluated labels of the tree's config (:func:`layout`), 255 for the others and
    for every pixel of ``testing``.
    """

    def __init__(self, root, split, transform=None):
        root = checked_root(root, split, SPLITS, EXPECTED_LAYOUT)
        self.split = split
        config, labels = layout(root)
        classes, self.names, lut, self.labels = read_config(config)
        image_dir = root / split / "images"
        if not image_dir.is_dir():
            raise DatasetLayoutError.at(image_dir, "no such folder", EXPECTED_LAYOUT)
        images = sorted(p for p in image_dir.iterdir()
                        if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        if not images:
            raise DatasetLayoutError.at(image_dir, "holds no .jpg images", EXPECTED_LAYOUT)
        if split in LABELLED_SPLITS:
            label_dir = root / split / labels
            if not label_dir.is_dir():
                raise DatasetLayoutError.at(label_dir, "no such folder", EXPECTED_LAYOUT)
            samples = [(image, partner(image, label_dir / (image.stem + ".png"), "label map",
                                       EXPECTED_LAYOUT)) for image in images]
        else:
            samples = [(image, None) for image in images]
        super().__init__(samples, classes, lut, transform, root=root, expected=EXPECTED_LAYOUT,
                         valid=range(self.labels))


__all__ = ["EXPECTED_LAYOUT", "LABELLED_SPLITS", "LAYOUTS", "SPLITS", "Vistas", "layout",
           "read_config"]
