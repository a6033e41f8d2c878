"""COCO-Stuff, stuff-only pixel maps of the COCO 2017 Stuff Segmentation Challenge release.

The layout is the COCO 2017 images with the challenge's stuff pixel maps
(``stuff_train2017_pixelmaps.zip``, ``stuff_val2017_pixelmaps.zip``) unpacked under ``root``::

    root/images/{train2017,val2017}/<12-digit id>.jpg                          RGB images
    root/annotations/stuff_{train,val}2017_pixelmaps/<12-digit id>.png         8-bit label maps

A pixel map holds COCO-Stuff category ids: 0 unlabeled, 92..182 the 91 stuff classes, 183
"other" (every thing pixel, the 80 thing classes merged). Training on stuff only, as the
InPlace-ABN paper does on this data ("91 stuff classes and 1 *void* class"): ``v in 92..182 ->
v - 92`` (train ids 0..90, named :data:`CLASSES`, COCO-Stuff's ``labels.txt`` names for ids
92..182), and 0 and 183 -> void (255). Any other value (:data:`LABEL_IDS` are the values a
stuff pixel map holds) is not this release's: a thing id 1..91 (a stuff+things map of the
full COCO-Stuff release, or a wrong file) or a train-id map with its 255 raises, naming the file
and the values, rather than turning into void.

Scoring follows from it: the mIoU is over the 91 stuff classes with 'other' void, as the paper
describes the data. cocostuffapi's ``COCOStuffeval`` (the 2017 challenge's) also scores 'other'
as a 92nd class, which a 91-way network never predicts, and averages over the classes with
ground truth (on the 5k validation images all 91 have some, so that average is the same). The maps may be single-channel (``"L"``) or palette (``"P"``, as
cocostuffapi's ``cocoSegmentationToPng`` writes them) PNGs; both are read as their values.

Samples are the pixel maps of the split, each paired with the image of the same id: the
challenge annotated a subset of the COCO images (40K training images of ``train2017``'s 118K,
by the COCO-Stuff README), so an image without a pixel map is simply not a sample, while a
pixel map without its image is an error. Checked when :class:`COCOStuff` is built, each failure a
:class:`~experiments.train.data.errors.DatasetLayoutError` naming the path and the layout: both
folders of the split exist, the pixel-map folder holds ``*.png`` maps, every map has its
``.jpg`` image. Files are decoded when read.
"""

from .errors import DatasetLayoutError
from .segmentation import SegmentationDataset, checked_root, make_lut, partner

SPLITS = ("train", "val")

FIRST_STUFF_ID = 92
OTHER_ID = 183
# nightrome/cocostuff labels.txt, ids 92..182 in order.
CLASSES = (
    "banner", "blanket", "branch", "bridge", "building-other", "bush", "cabinet", "cage",
    "cardboard", "carpet", "ceiling-other", "ceiling-tile", "cloth", "clothes", "clouds",
    "counter", "cupboard", "curtain", "desk-stuff", "dirt", "door-stuff", "fence",
    "floor-marble", "floor-other", "floor-stone", "floor-tile", "floor-wood", "flower", "fog",
    "food-other", "fruit", "furniture-other", "grass", "gravel", "ground-other", "hill",
    "house", "leaves", "light", "mat", "metal", "mirror-stuff", "moss", "mountain", "mud",
    "napkin", "net", "paper", "pavement", "pillow", "plant-other", "plastic", "platform",
    "playingfield", "railing", "railroad", "river", "road", "rock", "roof", "rug", "salad",
    "sand", "sea", "shelf", "sky-other", "skyscraper", "snow", "solid-other", "stairs",
    "stone", "straw", "structural-other", "table", "tent", "textile-other", "towel", "tree",
    "vegetable", "wall-brick", "wall-concrete", "wall-other", "wall-panel", "wall-stone",
    "wall-tile", "wall-wood", "water-other", "waterdrops", "window-blind", "window-other",
    "wood")
assert len(CLASSES) == OTHER_ID - FIRST_STUFF_ID == 91
LUT = make_lut({FIRST_STUFF_ID + i: i for i in range(len(CLASSES))}, len(CLASSES))
#: The values of a challenge pixel map (cocostuffapi's ``cocoSegmentationToPng`` writes 0 for
#: unlabeled, the stuff ids 92..182 and 183 for 'other'; ``COCOStuffeval`` scores 92..183).
LABEL_IDS = (0, *range(FIRST_STUFF_ID, OTHER_ID + 1))

EXPECTED_LAYOUT = (
    "ROOT/images/{train2017,val2017}/<12-digit id>.jpg (RGB) and "
    "ROOT/annotations/stuff_{train,val}2017_pixelmaps/<12-digit id>.png (8-bit, same size: "
    "0 unlabeled, 92..182 stuff classes, 183 other), one image per pixel map (COCO 2017 "
    "Stuff Segmentation Challenge layout)")


class COCOStuff(SegmentationDataset):
    """One split (``"train"`` or ``"val"``) of a COCO-Stuff challenge tree under ``root``.

    Items are ``(image, target)`` (see :class:`~.segmentation.SegmentationDataset`): train
    ids of the 91 stuff :data:`CLASSES` (COCO id minus 92), 255 for unlabeled and things.
    """

    def __init__(self, root, split, transform=None):
        root = checked_root(root, split, SPLITS, EXPECTED_LAYOUT)
        self.split = split
        image_dir = root / "images" / f"{split}2017"
        label_dir = root / "annotations" / f"stuff_{split}2017_pixelmaps"
        for folder in (image_dir, label_dir):
            if not folder.is_dir():
                raise DatasetLayoutError.at(folder, "no such folder", EXPECTED_LAYOUT)
        labels = sorted(p for p in label_dir.iterdir() if p.suffix == ".png" and p.is_file())
        if not labels:
            raise DatasetLayoutError.at(label_dir, "holds no .png pixel maps", EXPECTED_LAYOUT)
        samples = [(partner(label, image_dir / (label.stem + ".jpg"), "image", EXPECTED_LAYOUT),
                    label) for label in labels]
        super().__init__(samples, CLASSES, LUT, transform, root=root, expected=EXPECTED_LAYOUT,
                         valid=LABEL_IDS)


__all__ = ["CLASSES", "COCOStuff", "EXPECTED_LAYOUT", "FIRST_STUFF_ID", "LABEL_IDS", "LUT",
           "OTHER_ID", "SPLITS"]
