"""Small, learnable semantic-segmentation data sets in the released on-disk formats.

The default (smoke) profile trains the segmentation experiments on data sets made here, so the
real loaders (:class:`~.cityscapes.Cityscapes`, :class:`~.cocostuff.COCOStuff`,
:class:`~.vistas.Vistas`) run unchanged:

- :func:`generate_cityscapes`: ``leftImg8bit/{train,val,test}/<city>/<city>_<seq>_000019_
  leftImg8bit.png`` with ``gtFine/<split>/<city>/..._gtFine_{labelIds,color,instanceIds}.png``
  (real labelIds 0..33, non-train ids included; optional ``train_extra`` + ``gtCoarse``).
- :func:`generate_cocostuff`: ``images/{train2017,val2017}/<12-digit id>.jpg`` with
  ``annotations/stuff_{train,val}2017_pixelmaps/<id>.png`` (0 unlabeled, 92..182 stuff,
  183 "other").
- :func:`generate_vistas`: ``config.json`` (the 66 labels of v1.2), ``{training,validation,
  testing}/images/<22-char key>.jpg``, palette ``labels/<key>.png`` and 16-bit
  ``instances/<key>.png``.

**Content.** An image is a stack of regions painted back to front: street scenes (Cityscapes,
Vistas) start from a sky above a skyline of buildings, a road in perspective flanked by
sidewalks and some vegetation; COCO-Stuff scenes from two or three large stuff regions split
by a wavy line. On top come objects (ellipses, rotated rectangles, blobs) of several sizes,
larger first. Every evaluated class has a look: a hue (golden-ratio spaced round the colour
circle), a texture (plain, stripes, waves, checks, dots, block noise), a texture period and a
brightness level; (texture, period, brightness) differ between any two of the first 36
classes and classes close in hue always differ in texture. Each region jitters hue,
saturation, brightness, texture orientation and phase, and the image gets a lighting gradient
and pixel noise, so a class is recognised from colour *and* texture, not one colour. Void
regions (Cityscapes' non-train ids such as 0 unlabeled, 4 static, 6 ground, 1 ego vehicle at
the bottom, 2 rectification border; COCO-Stuff 0 and 183; Vistas ``void--unlabeled``) get a
random look.

**Class schedule.** The object classes of the training images cycle through a list that holds
every class once per round and common classes in several rounds (rare ones in one), so every
class appears in the training split (the first ``ceil(classes / slots)`` images already hold
them all; the slots per image grow when there are few images) and class frequencies differ,
as class-uniform sampling expects. A scheduled object that ends up hidden by later ones is
painted again, small, on top.

**Determinism and atomicity.** Each image draws from its own generator seeded by ``(seed,
data set, split, image)``; the tree is written in a temporary folder beside ``root`` and
renamed into place (:func:`~.generate._atomic_dir`), so a data set is a function of the
arguments only (bit-identical files for the same library versions) and never half-written.

Not written (the loaders do not read them): Cityscapes ``_polygons.json``, COCO-Stuff's
COCO-format JSON annotations, Vistas panoptic/polygon files.
"""
import colorsys
import json
import math
from pathlib import Path
from types import MappingProxyType

import numpy as np
from PIL import Image

from .generate import JPEG_QUALITY, _atomic_dir, _check_count

# ---------------------------------------------------------------------------------------------
# Label tables

# cityscapesScripts helpers/labels.py: (name, labelId, trainId, hasInstances, color); the
# license plate (id -1) never appears in labelIds maps.
CITYSCAPES_LABELS = (
    ("unlabeled", 0, 255, False, (0, 0, 0)),
    ("ego vehicle", 1, 255, False, (0, 0, 0)),
    ("rectification border", 2, 255, False, (0, 0, 0)),
    ("out of roi", 3, 255, False, (0, 0, 0)),
    ("static", 4, 255, False, (0, 0, 0)),
    ("dynamic", 5, 255, False, (111, 74, 0)),
    ("ground", 6, 255, False, (81, 0, 81)),
    ("road", 7, 0, False, (128, 64, 128)),
    ("sidewalk", 8, 1, False, (244, 35, 232)),
    ("parking", 9, 255, False, (250, 170, 160)),
    ("rail track", 10, 255, False, (230, 150, 140)),
    ("building", 11, 2, False, (70, 70, 70)),
    ("wall", 12, 3, False, (102, 102, 156)),
    ("fence", 13, 4, False, (190, 153, 153)),
    ("guard rail", 14, 255, False, (180, 165, 180)),
    ("bridge", 15, 255, False, (150, 100, 100)),
    ("tunnel", 16, 255, False, (150, 120, 90)),
    ("pole", 17, 5, False, (153, 153, 153)),
    ("polegroup", 18, 255, False, (153, 153, 153)),
    ("traffic light", 19, 6, False, (250, 170, 30)),
    ("traffic sign", 20, 7, False, (220, 220, 0)),
    ("vegetation", 21, 8, False, (107, 142, 35)),
    ("terrain", 22, 9, False, (152, 251, 152)),
    ("sky", 23, 10, False, (70, 130, 180)),
    ("person", 24, 11, True, (220, 20, 60)),
    ("rider", 25, 12, True, (255, 0, 0)),
    ("car", 26, 13, True, (0, 0, 142)),
    ("truck", 27, 14, True, (0, 0, 70)),
    ("bus", 28, 15, True, (0, 60, 100)),
    ("caravan", 29, 255, True, (0, 0, 90)),
    ("trailer", 30, 255, True, (0, 0, 110)),
    ("train", 31, 16, True, (0, 80, 100)),
    ("motorcycle", 32, 17, True, (0, 0, 230)),
    ("bicycle", 33, 18, True, (119, 11, 32)),
)
_CS_TRAIN = {lid: tid for _, lid, tid, _, _ in CITYSCAPES_LABELS if tid != 255}
_CS_INSTANCES = frozenset(lid for _, lid, _, inst, _ in CITYSCAPES_LABELS if inst)
_CS_VOID_REGIONS = (0, 4, 5, 6, 9, 10, 14, 15, 16, 18, 29, 30)  # painted as random-look blobs
# How often each train id is scheduled as an object (rounds of the class cycle): rare classes 1.
_CS_WEIGHTS = (1, 1, 1, 2, 3, 4, 2, 3, 1, 2, 1, 4, 1, 4, 1, 1, 1, 1, 2)
_CS_TRAIN_TO_LABEL = {tid: lid for lid, tid in _CS_TRAIN.items()}
_CS_FRAME = 19  # the annotated frame of each 30-frame snippet

CITYSCAPES_CITIES = MappingProxyType({  # real city names of each split
    "train": ("aachen", "bochum", "bremen"),
    "val": ("frankfurt", "lindau", "munster"),
    "test": ("berlin", "bielefeld"),
    "train_extra": ("augsburg", "bamberg"),
})

# Mapillary Vistas v1.2 config.json labels: (name, readable, color, instances); all evaluated
# but the last.
VISTAS_LABELS = (
    ("animal--bird", "Bird", (165, 42, 42), True),
    ("animal--ground-animal", "Ground Animal", (0, 192, 0), True),
    ("construction--barrier--curb", "Curb", (196, 196, 196), False),
    ("construction--barrier--fence", "Fence", (190, 153, 153), False),
    ("construction--barrier--guard-rail", "Guard Rail", (180, 165, 180), False),
    ("construction--barrier--other-barrier", "Barrier", (90, 120, 150), False),
    ("construction--barrier--wall", "Wall", (102, 102, 156), False),
    ("construction--flat--bike-lane", "Bike Lane", (128, 64, 255), False),
    ("construction--flat--crosswalk-plain", "Crosswalk - Plain", (140, 140, 200), True),
    ("construction--flat--curb-cut", "Curb Cut", (170, 170, 170), False),
    ("construction--flat--parking", "Parking", (250, 170, 160), False),
    ("construction--flat--pedestrian-area", "Pedestrian Area", (96, 96, 96), False),
    ("construction--flat--rail-track", "Rail Track", (230, 150, 140), False),
    ("construction--flat--road", "Road", (128, 64, 128), False),
    ("construction--flat--service-lane", "Service Lane", (110, 110, 110), False),
    ("construction--flat--sidewalk", "Sidewalk", (244, 35, 232), False),
    ("construction--structure--bridge", "Bridge", (150, 100, 100), False),
    ("construction--structure--building", "Building", (70, 70, 70), False),
    ("construction--structure--tunnel", "Tunnel", (150, 120, 90), False),
    ("human--person", "Person", (220, 20, 60), True),
    ("human--rider--bicyclist", "Bicyclist", (255, 0, 0), True),
    ("human--rider--motorcyclist", "Motorcyclist", (255, 0, 100), True),
    ("human--rider--other-rider", "Other Rider", (255, 0, 200), True),
    ("marking--crosswalk-zebra", "Lane Marking - Crosswalk", (200, 128, 128), True),
    ("marking--general", "Lane Marking - General", (255, 255, 255), False),
    ("nature--mountain", "Mountain", (64, 170, 64), False),
    ("nature--sand", "Sand", (230, 160, 50), False),
    ("nature--sky", "Sky", (70, 130, 180), False),
    ("nature--snow", "Snow", (190, 255, 255), False),
    ("nature--terrain", "Terrain", (152, 251, 152), False),
    ("nature--vegetation", "Vegetation", (107, 142, 35), False),
    ("nature--water", "Water", (0, 170, 30), False),
    ("object--banner", "Banner", (255, 255, 128), True),
    ("object--bench", "Bench", (250, 0, 30), True),
    ("object--bike-rack", "Bike Rack", (100, 140, 180), True),
    ("object--billboard", "Billboard", (220, 220, 220), True),
    ("object--catch-basin", "Catch Basin", (220, 128, 128), True),
    ("object--cctv-camera", "CCTV Camera", (222, 40, 40), True),
    ("object--fire-hydrant", "Fire Hydrant", (100, 170, 30), True),
    ("object--junction-box", "Junction Box", (40, 40, 40), True),
    ("object--mailbox", "Mailbox", (33, 33, 33), True),
    ("object--manhole", "Manhole", (100, 128, 160), True),
    ("object--phone-booth", "Phone Booth", (142, 0, 0), True),
    ("object--pothole", "Pothole", (70, 100, 150), False),
    ("object--street-light", "Street Light", (210, 170, 100), True),
    ("object--support--pole", "Pole", (153, 153, 153), True),
    ("object--support--traffic-sign-frame", "Traffic Sign Frame", (128, 128, 128), True),
    ("object--support--utility-pole", "Utility Pole", (0, 0, 80), True),
    ("object--traffic-light", "Traffic Light", (250, 170, 30), True),
    ("object--traffic-sign--back", "Traffic Sign (Back)", (192, 192, 192), True),
    ("object--traffic-sign--front", "Traffic Sign (Front)", (220, 220, 0), True),
    ("object--trash-can", "Trash Can", (140, 140, 20), True),
    ("object--vehicle--bicycle", "Bicycle", (119, 11, 32), True),
    ("object--vehicle--boat", "Boat", (150, 0, 255), True),
    ("object--vehicle--bus", "Bus", (0, 60, 100), True),
    ("object--vehicle--car", "Car", (0, 0, 142), True),
    ("object--vehicle--caravan", "Caravan", (0, 0, 90), True),
    ("object--vehicle--motorcycle", "Motorcycle", (0, 0, 230), True),
    ("object--vehicle--on-rails", "On Rails", (0, 80, 100), False),
    ("object--vehicle--other-vehicle", "Other Vehicle", (128, 64, 64), True),
    ("object--vehicle--trailer", "Trailer", (0, 0, 110), True),
    ("object--vehicle--truck", "Truck", (0, 0, 70), True),
    ("object--vehicle--wheeled-slow", "Wheeled Slow", (0, 0, 192), True),
    ("void--car-mount", "Car Mount", (32, 32, 32), False),
    ("void--ego-vehicle", "Ego Vehicle", (120, 10, 10), False),
)
VISTAS_VOID = ("void--unlabeled", "Unlabeled", (0, 0, 0), False)
_VISTAS_STREET = {"sky": 27, "building": 17, "vegetation": 30, "road": 13, "sidewalk": 15}
_VISTAS_EGO = 64
_KEY_ALPHABET = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                              "0123456789-_"))

COCO_FIRST_STUFF, COCO_OTHER, COCO_UNLABELED = 92, 183, 0
COCO_STUFF_CLASSES = 91

DEFAULT_CITYSCAPES_SIZE = (256, 128)  # (width, height); the release is 2048x1024
DEFAULT_COCO_SIZES = ((160, 120), (120, 160), (160, 112), (144, 144), (160, 96))
DEFAULT_VISTAS_SIZES = ((160, 120), (176, 99), (120, 160), (192, 144), (144, 108))
MIN_SIDE = 16

_DATASET_CODES = {"cityscapes": 11, "cocostuff": 12, "vistas": 13}
_SPLIT_CODES = {"train": 1, "val": 2, "test": 3, "train_extra": 4, "ids": 5}


def _rng(seed, dataset, split, i):
    return np.random.default_rng([int(seed) & (2**63 - 1), _DATASET_CODES[dataset],
                                  _SPLIT_CODES[split], i])


# ---------------------------------------------------------------------------------------------
# Looks and painting

TEXTURES = ("plain", "stripes", "waves", "checks", "dots", "noise")
_PERIODS = (4.0, 6.0, 9.0)
_LEVELS = (0.92, 0.62)
_PHI = (math.sqrt(5) - 1) / 2


def class_look(c):
    """The nominal look of evaluated class ``c``: ``(hue, value, texture index, period)``."""
    return ((0.05 + c * _PHI) % 1.0, _LEVELS[(c // 18) % 2], c % len(TEXTURES),
            _PERIODS[(c // 6) % 3])


def _jittered_look(rng, c):
    hue, value, texture, period = class_look(c)
    return ((hue + rng.uniform(-0.025, 0.025)) % 1.0, rng.uniform(0.55, 0.95),
            float(np.clip(value + rng.uniform(-0.08, 0.08), 0.3, 1.0)), texture,
            period * rng.uniform(0.85, 1.15))


def _random_look(rng):
    return (rng.random(), rng.uniform(0.0, 1.0), rng.uniform(0.2, 1.0),
            int(rng.integers(len(TEXTURES))), rng.uniform(3.0, 10.0))


def _fill(rng, look, yy, xx):
    """Colours ``(h, w, 3)`` of a look on pixel coordinates ``yy (h, 1)``, ``xx (1, w)``."""
    hue, sat, value, texture, period = look
    rgb = np.array(colorsys.hsv_to_rgb(hue, sat, value), np.float32)
    name = TEXTURES[texture]
    psi = rng.uniform(0, np.pi)
    u = (xx * np.cos(psi) + yy * np.sin(psi)) / period + rng.random()
    v = (yy * np.cos(psi) - xx * np.sin(psi)) / period + rng.random()
    if name == "plain":
        shade = 0.9 + 0.1 * np.tanh(u / 8.0)  # a faint gradient
    elif name == "stripes":
        shade = np.where(u % 1.0 < 0.5, 1.0, 0.5)
    elif name == "waves":
        shade = 0.7 + 0.3 * np.sin(2 * np.pi * u)
    elif name == "checks":
        shade = np.where((np.floor(u) + np.floor(v)) % 2 == 0, 1.0, 0.5)
    elif name == "dots":
        shade = np.where((u % 1.0 - 0.5) ** 2 + (v % 1.0 - 0.5) ** 2 < 0.09, 0.4, 1.0)
    else:  # block noise of the class's period
        iy = (yy / period).astype(np.int64)
        ix = (xx / period).astype(np.int64)
        grid = rng.random((int(iy.max()) + 1, int(ix.max()) + 1))
        shade = 0.5 + 0.5 * grid[iy, ix]
    shade = np.broadcast_to(shade, (yy.shape[0], xx.shape[1])).astype(np.float32)
    return rgb * shade[..., None]


class _Canvas:
    """An image being painted with its label map and instance map."""

    def __init__(self, rng, height, width, background, look_of, instance_of):
        self.rng, self.h, self.w = rng, height, width
        self.image = np.zeros((height, width, 3), np.float32)
        self.label = np.full((height, width), background, np.int32)
        self.instance = np.full((height, width), instance_of(background, None), np.int32)
        self.look_of, self.instance_of = look_of, instance_of
        self.counts = {}

    def coords(self, y0=0, x0=0, h=None, w=None):
        h = self.h - y0 if h is None else h
        w = self.w - x0 if w is None else w
        return (np.arange(y0, y0 + h, dtype=np.float32)[:, None],
                np.arange(x0, x0 + w, dtype=np.float32)[None, :])

    def paint(self, mask, label, *, y0=0, x0=0, instance=True, look=None):
        """Paint ``label`` where ``mask`` (a window at ``(y0, x0)``) is true."""
        if not mask.any():
            return
        h, w = mask.shape
        yy, xx = self.coords(y0, x0, h, w)
        colours = _fill(self.rng, look or self.look_of(self.rng, label), yy, xx)
        window = np.s_[y0:y0 + h, x0:x0 + w]
        self.image[window][mask] = colours[mask]
        self.label[window][mask] = label
        k = None
        if instance:
            k = self.counts.get(label, 0)
            self.counts[label] = k + 1
        self.instance[window][mask] = self.instance_of(label, k)

    def shape(self, label, cy, cx, ry, rx, kind=None, **kwargs):
        """Paint an ellipse, rotated rectangle or blob of radii ``(ry, rx)`` at ``(cy, cx)``."""
        rng = self.rng
        kind = kind or ("ellipse", "rect", "blob")[rng.integers(3)]
        reach = 1.6 * max(ry, rx)
        y0, y1 = max(0, int(cy - reach)), min(self.h, int(cy + reach) + 1)
        x0, x1 = max(0, int(cx - reach)), min(self.w, int(cx + reach) + 1)
        if y1 <= y0 or x1 <= x0:
            return
        yy, xx = self.coords(y0, x0, y1 - y0, x1 - x0)
        yy, xx = yy - cy, xx - cx
        theta = rng.uniform(-0.5, 0.5) if kind == "rect" else rng.uniform(0, np.pi)
        u = (xx * np.cos(theta) + yy * np.sin(theta)) / rx
        v = (yy * np.cos(theta) - xx * np.sin(theta)) / ry
        if kind == "ellipse":
            mask = u * u + v * v <= 1.0
        elif kind == "rect":
            mask = np.maximum(np.abs(u), np.abs(v)) <= 1.0
        else:  # a star-shaped blob: radius 1 + a few random harmonics
            angle = np.arctan2(v, u)
            radius = np.ones_like(angle)
            for k in (2, 3, 5):
                radius = radius + rng.uniform(0, 0.2) * np.cos(k * angle + rng.uniform(0, 6.3))
            mask = u * u + v * v <= radius * radius
        self.paint(mask, label, y0=y0, x0=x0, **kwargs)

    def objects(self, labels, scale=(0.06, 0.3)):
        """Paint objects of ``labels`` at random places, larger ones first."""
        rng = self.rng
        side = min(self.h, self.w)
        sizes = side * np.exp(rng.uniform(np.log(scale[0]), np.log(scale[1]), len(labels)))
        for i in np.argsort(-sizes, kind="stable"):
            r = sizes[i]
            aspect = np.exp(rng.uniform(-0.6, 0.6))
            self.shape(labels[i], rng.uniform(0.1, 0.95) * self.h, rng.uniform(0, self.w),
                       max(3.0, r * aspect), max(3.0, r / aspect))

    def ensure(self, labels):
        """Paint again, small and on top, each of ``labels`` that ended up hidden."""
        present = np.bincount(self.label.ravel(), minlength=256)
        side = min(self.h, self.w)
        for label in dict.fromkeys(labels):
            if present[label] == 0:
                r = max(3.0, 0.07 * side)
                self.shape(label, self.rng.uniform(r, 0.8 * self.h - r),
                           self.rng.uniform(r, self.w - r), r, r, kind="rect")

    def finish(self):
        """The uint8 RGB image: a lighting gradient and pixel noise over the painted regions."""
        rng = self.rng
        yy, xx = self.coords()
        phi = rng.uniform(0, 2 * np.pi)
        ramp = ((xx - self.w / 2) * np.cos(phi) + (yy - self.h / 2) * np.sin(phi)) / max(self.h,
                                                                                        self.w)
        image = self.image * (1 + rng.uniform(0, 0.3) * ramp)[..., None]
        image += rng.normal(0, 0.03, image.shape).astype(np.float32)
        return (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8)


def _street(canvas, ids):
    """Sky over a skyline of buildings, vegetation, a road in perspective between sidewalks."""
    rng, h, w = canvas.rng, canvas.h, canvas.w
    yy, xx = canvas.coords()
    horizon = rng.uniform(0.38, 0.5) * h
    columns = int(rng.integers(3, 8))
    edges = np.sort(rng.uniform(0, w, columns - 1))
    tops = horizon - rng.uniform(0.05, 0.3, columns) * h
    skyline = tops[np.searchsorted(edges, xx[0])][None, :]
    road_top = horizon + rng.uniform(0.0, 0.08) * h
    canvas.paint(yy < skyline, ids["sky"], instance=False)
    canvas.paint((yy >= skyline) & (yy < road_top), ids["building"], instance=False)
    for _ in range(int(rng.integers(1, 3))):
        r = rng.uniform(0.08, 0.2) * h
        canvas.shape(ids["vegetation"], horizon - r * rng.uniform(0, 1), rng.uniform(0, w),
                     r, r * rng.uniform(1, 2.5), kind="blob", instance=False)
    vanish = rng.uniform(0.3, 0.7) * w
    slope = rng.uniform(0.8, 2.2)
    below = yy >= road_top
    road = below & (np.abs(xx - vanish) <= (yy - road_top + 2) * slope)
    canvas.paint(road, ids["road"], instance=False)
    canvas.paint(below & ~road, ids["sidewalk"], instance=False)


def _hood(canvas):
    """The mask of an ego-vehicle bonnet along the bottom of the image."""
    rng, h, w = canvas.rng, canvas.h, canvas.w
    yy, xx = canvas.coords()
    depth = rng.uniform(0.06, 0.14) * h
    top = h - depth * (1 - 0.5 * ((xx - w / 2) / (w / 2)) ** 2)
    return yy >= top


def _schedule(weights, seed, dataset):
    """The class cycle: round ``r`` holds (in a seeded order) the classes of weight > ``r``."""
    rng = _rng(seed, dataset, "ids", 0)
    order = []
    for r in range(max(weights)):
        members = np.array([c for c, wgt in enumerate(weights) if wgt > r])
        order.extend(int(c) for c in rng.permutation(members))
    return order


def _slots(cycle, split, i, per_image):
    """The classes scheduled for image ``i`` of ``split`` (val starts half-way round)."""
    start = i * per_image + (len(cycle) // 2 if split != "train" else 0)
    return [cycle[(start + j) % len(cycle)] for j in range(per_image)]


def _per_image(base, classes, train_images):
    return max(base, -(-classes // train_images))


def _generic_weights(n):
    """Class frequencies for the sets without a hand-made table: 4, 2 or 1 rounds (a sixth of
    the classes common, a sixth medium, the rest rare)."""
    return [4 if c % 6 == 0 else 2 if c % 3 == 0 else 1 for c in range(n)]


# ---------------------------------------------------------------------------------------------
# Writing helpers


def _check_size(name, size):
    size = tuple(size)
    if len(size) != 2 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                                 and d >= MIN_SIDE for d in size):
        raise ValueError(f"{name} must be (width, height) pairs of ints >= {MIN_SIDE}, "
                         f"got {size!r}")
    return int(size[0]), int(size[1])


def _check_sizes(sizes):
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes must hold at least one (width, height)")
    return [_check_size("sizes", s) for s in sizes]


# ---------------------------------------------------------------------------------------------
# Cityscapes


def _cs_colour_table():
    table = np.zeros((256, 4), np.uint8)
    for _, lid, _, _, colour in CITYSCAPES_LABELS:
        table[lid] = (*colour, 255)
    return table


_CS_COLOURS = _cs_colour_table()  # labelId -> RGBA of the _color.png maps


def _cs_look(rng, label):
    if label in _CS_TRAIN:
        return _jittered_look(rng, _CS_TRAIN[label])
    if label == 1:  # ego vehicle: a dark bonnet
        return (rng.random(), rng.uniform(0, 0.5), rng.uniform(0.1, 0.35), 0, 6.0)
    return _random_look(rng)


def _cs_instance(label, k):
    return label * 1000 + k if (k is not None and label in _CS_INSTANCES) else label


def _cityscapes_scene(rng, size, scheduled):
    width, height = size
    canvas = _Canvas(rng, height, width, 0, _cs_look, _cs_instance)
    _street(canvas, {"sky": 23, "building": 11, "vegetation": 21, "road": 7, "sidewalk": 8})
    labels = [_CS_TRAIN_TO_LABEL[c] for c in scheduled]
    voids = [int(v) for v in rng.choice(_CS_VOID_REGIONS, int(rng.integers(1, 4)))]
    canvas.objects(labels + voids)
    if rng.random() < 0.5:
        canvas.paint(_hood(canvas), 1, instance=False)
    if rng.random() < 0.3:  # a rectification border along the left, right and bottom edges
        b = int(rng.integers(1, 4))
        yy, xx = canvas.coords()
        canvas.paint((xx < b) | (xx >= width - b) | (yy >= height - b), 2, instance=False)
    canvas.ensure(labels)
    return canvas


def _cs_coarse(label, instance, rng):
    """Coarse annotation of a fine map: boundaries (a few pixels wide) and some objects void."""
    edge = np.zeros(label.shape, bool)
    edge[:, 1:] |= label[:, 1:] != label[:, :-1]
    edge[1:, :] |= label[1:, :] != label[:-1, :]
    for _ in range(int(rng.integers(2, 4))):
        grown = edge.copy()
        grown[:, 1:] |= edge[:, :-1]
        grown[:, :-1] |= edge[:, 1:]
        grown[1:, :] |= edge[:-1, :]
        grown[:-1, :] |= edge[1:, :]
        edge = grown
    drop = [v for v in np.unique(instance) if v >= 1000 and rng.random() < 0.3]
    edge |= np.isin(instance, drop)
    return np.where(edge, 0, label), np.where(edge, 0, instance)


def _cs_write(folder, stem, kind, label, instance):
    base = folder / f"{stem}_{kind}"
    Image.fromarray(label.astype(np.uint8)).save(f"{base}_labelIds.png")
    Image.fromarray(_CS_COLOURS[label]).save(f"{base}_color.png")
    Image.fromarray(instance.astype(np.uint16)).save(f"{base}_instanceIds.png")


def generate_cityscapes(root, train_images, val_images, seed=0, *, size=DEFAULT_CITYSCAPES_SIZE,
                        cities=CITYSCAPES_CITIES, test_images=2, coarse_extra=0,
                        overwrite=False):
    """Write a Cityscapes tree under ``root`` (the folder of ``leftImg8bit/`` and ``gtFine/``).

    ``train_images``/``val_images``/``test_images`` images of ``size = (width, height)`` go
    round-robin into the cities of each split (``cities``: split -> city names; missing splits
    take :data:`CITYSCAPES_CITIES`) as ``leftImg8bit/<split>/<city>/<city>_<seq:06d>_000019_
    leftImg8bit.png``; each has ``gtFine/<split>/<city>/<stem>_gtFine_labelIds.png`` (mode
    ``"L"``, real labelIds: the 19 train classes and void ids 0, 1 ego vehicle, 2
    rectification border, 4 static, 5, 6 ground, 9, 10, 14-16, 18, 29, 30),
    ``_gtFine_color.png`` (RGBA in the official label colours, as the release's) and
    ``_gtFine_instanceIds.png`` (16-bit: ``labelId * 1000 + k`` for objects of instance
    classes, else ``labelId``). ``_gtFine_polygons.json`` is not written. Test labels are all
    0, as released. ``coarse_extra > 0`` adds that many ``leftImg8bit/train_extra`` images and
    ``gtCoarse/{train,val,train_extra}/..._gtCoarse_{labelIds,color,instanceIds}.png`` (fine
    maps with void boundaries and some objects left out). Every train class appears in the
    training split. Returns ``root``; an existing non-empty ``root`` is an error unless
    ``overwrite``.
    """
    _check_count("train_images", train_images)
    _check_count("val_images", val_images)
    _check_count("test_images", test_images)
    _check_count("coarse_extra", coarse_extra, minimum=0)
    size = _check_size("size", size)
    cities = dict(cities)
    if set(cities) - set(CITYSCAPES_CITIES):
        raise ValueError(f"cities has keys {sorted(set(cities) - set(CITYSCAPES_CITIES))}; "
                         f"the splits are {sorted(CITYSCAPES_CITIES)}")
    cities = {**CITYSCAPES_CITIES, **cities}
    for split, names in cities.items():
        if isinstance(names, str) or not names or not all(
                isinstance(c, str) and c and "_" not in c and "/" not in c for c in names):
            raise ValueError(f"cities[{split!r}] must be city names without '_' or '/', "
                             f"got {names!r}")
    cycle = _schedule(_CS_WEIGHTS, seed, "cityscapes")
    per_image = _per_image(4, len(_CS_WEIGHTS), train_images)
    counts = {"train": train_images, "val": val_images, "test": test_images,
              "train_extra": coarse_extra}
    root = Path(root)
    with _atomic_dir(root, overwrite) as tmp:
        for split, count in counts.items():
            seq = {}
            for i in range(count):
                city = cities[split][i % len(cities[split])]
                stem = f"{city}_{seq.setdefault(city, 0):06d}_{_CS_FRAME:06d}"
                seq[city] += 1
                rng = _rng(seed, "cityscapes", split, i)
                canvas = _cityscapes_scene(rng, size, _slots(cycle, split, i, per_image))
                folder = tmp / "leftImg8bit" / split / city
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(canvas.finish()).save(folder / f"{stem}_leftImg8bit.png")
                label, instance = canvas.label, canvas.instance
                if split == "test":
                    label = instance = np.zeros_like(label)
                if split != "train_extra":
                    folder = tmp / "gtFine" / split / city
                    folder.mkdir(parents=True, exist_ok=True)
                    _cs_write(folder, stem, "gtFine", label, instance)
                if coarse_extra and split != "test":
                    folder = tmp / "gtCoarse" / split / city
                    folder.mkdir(parents=True, exist_ok=True)
                    _cs_write(folder, stem, "gtCoarse", *_cs_coarse(label, instance, rng))
    return root


# ---------------------------------------------------------------------------------------------
# COCO-Stuff


def _coco_look(rng, label):
    if COCO_FIRST_STUFF <= label < COCO_FIRST_STUFF + COCO_STUFF_CLASSES:
        return _jittered_look(rng, label - COCO_FIRST_STUFF)
    return _random_look(rng)


def _cocostuff_scene(rng, size, scheduled):
    width, height = size
    canvas = _Canvas(rng, height, width, COCO_UNLABELED, _coco_look, lambda label, k: label)
    labels = [COCO_FIRST_STUFF + c for c in scheduled]
    background = 3 if len(labels) > 3 and rng.random() < 0.5 else 2
    yy, xx = canvas.coords()
    split = (rng.uniform(0.3, 0.7) * height + rng.uniform(0, 0.08) * height
             * np.sin(2 * np.pi * xx / (width * rng.uniform(0.4, 1.2)) + rng.uniform(0, 6.3)))
    top = yy < split
    canvas.paint(~top, labels[0])
    if background == 3:
        left = xx < rng.uniform(0.3, 0.7) * width
        canvas.paint(top & left, labels[1])
        canvas.paint(top & ~left, labels[2])
    else:
        canvas.paint(top, labels[1])
    things = [COCO_OTHER] * int(rng.integers(1, 4))
    unlabeled = [COCO_UNLABELED] * int(rng.random() < 0.5)
    canvas.objects(labels[background:] + things + unlabeled)
    canvas.ensure(labels)
    return canvas


def _coco_ids(seed, count):
    """Distinct 12-digit image ids (below COCO's largest, 581929)."""
    return [int(i) + 1 for i in _rng(seed, "cocostuff", "ids", 1).choice(581929, count,
                                                                          replace=False)]


def generate_cocostuff(root, train_images, val_images, seed=0, *, sizes=DEFAULT_COCO_SIZES,
                       overwrite=False):
    """Write a COCO-Stuff (2017 stuff challenge, stuff-only pixel maps) tree under ``root``.

    ``images/{train2017,val2017}/<12-digit id>.jpg`` (JPEG quality 90, each of a random
    ``(width, height)`` of ``sizes``) with ``annotations/stuff_{train,val}2017_pixelmaps/
    <id>.png`` (mode ``"L"``: 92..182 the 91 stuff classes, 183 "other" for thing regions,
    0 unlabeled). Every stuff class appears in the training split. The COCO-format JSON
    annotations of the release are not written. Returns ``root``; an existing non-empty
    ``root`` is an error unless ``overwrite``.
    """
    _check_count("train_images", train_images)
    _check_count("val_images", val_images)
    sizes = _check_sizes(sizes)
    cycle = _schedule(_generic_weights(COCO_STUFF_CLASSES), seed, "cocostuff")
    per_image = _per_image(8, COCO_STUFF_CLASSES, train_images)
    ids = _coco_ids(seed, train_images + val_images)
    root = Path(root)
    with _atomic_dir(root, overwrite) as tmp:
        for split, count, offset in (("train", train_images, 0),
                                     ("val", val_images, train_images)):
            images = tmp / "images" / f"{split}2017"
            labels = tmp / "annotations" / f"stuff_{split}2017_pixelmaps"
            images.mkdir(parents=True)
            labels.mkdir(parents=True)
            for i in range(count):
                rng = _rng(seed, "cocostuff", split, i)
                canvas = _cocostuff_scene(rng, sizes[rng.integers(len(sizes))],
                                          _slots(cycle, split, i, per_image))
                name = f"{ids[offset + i]:012d}"
                Image.fromarray(canvas.finish()).save(images / f"{name}.jpg", format="JPEG",
                                                      quality=JPEG_QUALITY)
                Image.fromarray(canvas.label.astype(np.uint8)).save(labels / f"{name}.png")
    return root


# ---------------------------------------------------------------------------------------------
# Mapillary Vistas


def vistas_config(num_classes=65):
    """The ``config.json`` object: ``num_classes`` evaluated labels and ``void--unlabeled``.

    With 65 classes these are the labels of the v1.2 release (names, readable names, colours,
    instance flags); with fewer, its first ``num_classes``; more get systematic names
    ``object--generated--class-NNN`` and spread colours.
    """
    if not isinstance(num_classes, int) or not 1 <= num_classes <= 254:
        raise ValueError(f"num_classes must be an int in 1..254, got {num_classes!r}")
    entries = list(VISTAS_LABELS[:num_classes])
    for c in range(len(entries), num_classes):
        rgb = colorsys.hsv_to_rgb((c * _PHI) % 1.0, 0.4 + 0.5 * (c % 2), 0.5 + 0.4 * (c % 3 == 0))
        entries.append((f"object--generated--class-{c:03d}", f"Generated Class {c}",
                        tuple(int(round(255 * x)) for x in rgb), True))
    labels = [{"color": list(colour), "instances": inst, "readable": readable, "name": name,
               "evaluate": True} for name, readable, colour, inst in entries]
    name, readable, colour, inst = VISTAS_VOID
    labels.append({"color": list(colour), "instances": inst, "readable": readable, "name": name,
                   "evaluate": False})
    return {"labels": labels, "version": 1.2, "mapping": "public",
            "folder_structure": "{split}/{content}/{key:.{22}}.{ext}"}


def _vistas_scene(rng, size, scheduled, num_classes, instances):
    width, height = size
    void = num_classes
    canvas = _Canvas(rng, height, width, void,
                     lambda rng, label: (_jittered_look(rng, label) if label < void
                                         else _random_look(rng)),
                     lambda label, k: label * 256 + (k if k is not None and instances[label]
                                                     else 0) % 256)
    street = (_VISTAS_STREET if max(_VISTAS_STREET.values()) < num_classes
              else {k: j % num_classes for j, k in enumerate(_VISTAS_STREET)})
    _street(canvas, street)
    canvas.objects(list(scheduled) + [void] * int(rng.integers(1, 3)))
    if num_classes == len(VISTAS_LABELS) and rng.random() < 0.3:
        canvas.paint(_hood(canvas), _VISTAS_EGO, instance=False)
    canvas.ensure(scheduled)
    return canvas


def _vistas_key(rng):
    return "".join(_KEY_ALPHABET[rng.integers(len(_KEY_ALPHABET), size=22)])


def generate_vistas(root, train_images, val_images, seed=0, *, sizes=DEFAULT_VISTAS_SIZES,
                    num_classes=65, test_images=2, overwrite=False):
    """Write a Mapillary Vistas (research edition) tree under ``root``.

    ``config.json`` (:func:`vistas_config`: with the default 65 classes the 66 labels of
    v1.2, the last ``void--unlabeled`` with ``"evaluate": false``; plus the release's
    ``version``, ``mapping`` and ``folder_structure`` keys);
    ``{training,validation,testing}/images/<key>.jpg`` (22-character keys of ``[A-Za-z0-9-_]``,
    JPEG quality 90, each of a random ``(width, height)`` of ``sizes``);
    ``{training,validation}/labels/<key>.png`` (palette PNG, palette = the config colours,
    indices = label ids, ``num_classes`` = void) and ``instances/<key>.png`` (16-bit,
    ``label id * 256 + instance``). Every evaluated class appears in ``training``. Returns
    ``root``; an existing non-empty ``root`` is an error unless ``overwrite``.
    """
    _check_count("train_images", train_images)
    _check_count("val_images", val_images)
    _check_count("test_images", test_images)
    sizes = _check_sizes(sizes)
    config = vistas_config(num_classes)
    palette = [v for label in config["labels"] for v in label["color"]]
    palette += [0] * (768 - len(palette))
    instances = [label["instances"] for label in config["labels"]]
    cycle = _schedule(_generic_weights(num_classes), seed, "vistas")
    per_image = _per_image(6, num_classes, train_images)
    root = Path(root)
    keys = set()
    with _atomic_dir(root, overwrite) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        for split, folder, count in (("train", "training", train_images),
                                     ("val", "validation", val_images),
                                     ("test", "testing", test_images)):
            (tmp / folder / "images").mkdir(parents=True)
            if split != "test":
                (tmp / folder / "labels").mkdir()
                (tmp / folder / "instances").mkdir()
            for i in range(count):
                rng = _rng(seed, "vistas", split, i)
                key = _vistas_key(rng)
                if key in keys:  # pragma: no cover - 64**22 keys
                    raise AssertionError(f"duplicate key {key}")
                keys.add(key)
                canvas = _vistas_scene(rng, sizes[rng.integers(len(sizes))],
                                       _slots(cycle, split, i, per_image), num_classes,
                                       instances)
                Image.fromarray(canvas.finish()).save(tmp / folder / "images" / f"{key}.jpg",
                                                      format="JPEG", quality=JPEG_QUALITY)
                if split == "test":
                    continue
                label = Image.frombytes("P", (canvas.w, canvas.h),
                                        canvas.label.astype(np.uint8).tobytes())
                label.putpalette(palette)
                label.save(tmp / folder / "labels" / f"{key}.png")
                Image.fromarray(canvas.instance.astype(np.uint16)).save(
                    tmp / folder / "instances" / f"{key}.png")
    return root


__all__ = ["CITYSCAPES_CITIES", "CITYSCAPES_LABELS", "VISTAS_LABELS", "class_look",
           "generate_cityscapes", "generate_cocostuff", "generate_vistas", "vistas_config"]
