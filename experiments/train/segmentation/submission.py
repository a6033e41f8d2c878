"""Predictions written in the formats the benchmarks read, one file per image of a split.

Each format is the release's own, as its official evaluation reads it:

* **Cityscapes** (``cityscapesScripts``, ``evaluation/evalPixelLevelSemanticLabeling.py``, the
  benchmark server's evaluator): one 8-bit single-channel PNG of *label ids* (``labels.py``'s
  ``id``, e.g. road 7, car 26; not train ids) per image, at the image's full resolution, found
  by the pattern ``<city>_<seq>_<frame>*.png`` anywhere under the results folder (exactly one
  match per image). Written as the image's own name, ``<city>_<seq>_<frame>_leftImg8bit.png``.
* **Mapillary Vistas** (``mapillary/mapillary_vistas``, the evaluation server's scripts: "8bit
  grayscale encoding in PNG format and pixel values are treated as indices for the label list
  in the config file"): ``<key>.png``, one per image of the same name, at its size.
* **COCO-Stuff** (``nightrome/cocostuffapi``): the challenge's result file, a JSON list of
  ``{"image_id", "category_id", "segmentation"}`` with one compressed-RLE mask per stuff class
  present in an image (``cocostuffhelper.segmentationToCocoResult``: category ids 92..182,
  the image id the file name's number), written as ``stuff_<split>2017_results.json``; beside
  it the label maps it encodes, ``<12-digit id>.png`` with the COCO ids (the input of the API's
  own ``pngToCocoResult``).

:class:`SubmissionWriter` is :func:`~.inference.evaluate_segmentation`'s ``sink``: it maps each
predicted train-id map through the data set's :meth:`raw_ids` and writes it, in loader order,
so the written files are exactly the predictions the returned metrics count.
"""
import json

import numpy as np
from PIL import Image

from ..data import cityscapes, cocostuff


def coco_rle(mask):
    """The COCO compressed RLE of a binary ``(H, W)`` mask, ``{"size": [H, W], "counts": str}``,
    as ``pycocotools.mask.encode`` writes it (``maskApi.c``): run lengths over the
    column-major pixel order, starting with a run of zeros, each count from the third on
    stored as its difference from the count two before, written 5 bits per character (bit
    ``0x20`` meaning more characters follow) offset by 48."""
    mask = np.asarray(mask, bool)
    if mask.ndim != 2:
        raise ValueError(f"mask: expected a 2-d array, got shape {mask.shape}")
    flat = mask.ravel(order="F")
    bounds = np.concatenate(([0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]))
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        counts.insert(0, 0)
    chars = []
    for i, count in enumerate(counts):
        x = count - counts[i - 2] if i > 2 else count
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            chars.append(chr((c | 0x20 if more else c) + 48))
    return {"size": list(mask.shape), "counts": "".join(chars)}


def coco_stuff_result(label_map, image_id):
    """cocostuffapi's ``segmentationToCocoResult``: one annotation per stuff id (>= 92) present
    in ``label_map`` (COCO ids), in increasing id order."""
    return [{"image_id": int(image_id), "category_id": int(label),
             "segmentation": coco_rle(label_map == label)}
            for label in np.unique(label_map) if label >= cocostuff.FIRST_STUFF_ID]


def file_name(dataset, image):
    """The prediction file of ``image`` (a path) in ``dataset``'s format."""
    if dataset == "cityscapes":
        if not image.name.endswith(cityscapes.IMAGE_SUFFIX):
            raise ValueError(f"{image}: not a Cityscapes image name (*{cityscapes.IMAGE_SUFFIX})")
        return image.name
    if dataset in ("vistas", "cocostuff"):
        return image.stem + ".png"
    raise ValueError(f"dataset={dataset!r}: expected cityscapes, cocostuff or vistas")


def coco_results_name(split):
    """The COCO-Stuff result file's name for ``split``."""
    return f"stuff_{split}2017_results.json"


class SubmissionWriter:
    """Writes the predictions of ``split_set`` (a :class:`~..data.segmentation.
    SegmentationDataset` of ``dataset``, read in order, one image per prediction) under
    ``folder``; ``__call__(prediction)`` takes a batch of train-id maps ``(N, H, W)``,
    :meth:`finish` checks that every image was written and writes COCO-Stuff's result file.
    Returns the written paths from :meth:`finish`."""

    def __init__(self, dataset, split_set, folder):
        self.dataset = dataset
        self.split = split_set.split
        self.images = [image for image, _ in split_set.samples]
        self.raw = split_set.raw_ids()
        self.folder = folder
        self.written = []
        self.annotations = []
        names = [file_name(dataset, image) for image in self.images]
        if len(set(names)) != len(names):
            raise ValueError(f"{split_set!r}: two images have the same prediction file name")

    def __call__(self, prediction):
        for ids in prediction.cpu().numpy():
            if len(self.written) == len(self.images):
                raise ValueError(f"more predictions than the {len(self.images)} images")
            image = self.images[len(self.written)]
            label_map = self.raw[ids]
            path = self.folder / file_name(self.dataset, image)
            Image.fromarray(label_map).save(path)  # uint8 (H, W): mode "L"
            self.written.append(path)
            if self.dataset == "cocostuff":
                self.annotations += coco_stuff_result(label_map, int(image.stem))

    def finish(self):
        if len(self.written) != len(self.images):
            raise ValueError(f"{len(self.written)} predictions for {len(self.images)} images")
        if self.dataset == "cocostuff":
            path = self.folder / coco_results_name(self.split)
            path.write_text(json.dumps(self.annotations))
            self.written.append(path)
        return list(self.written)


__all__ = ["SubmissionWriter", "coco_results_name", "coco_rle", "coco_stuff_result",
           "file_name"]
