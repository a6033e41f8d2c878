"""Small, learnable data sets written in exactly the real on-disk formats.

The default (smoke) profile trains on data sets made here, so the real loaders
(:class:`~.cifar.CIFAR`, :class:`~.imagenet.ImageNet`) and transforms run unchanged on a laptop:

- :func:`generate_cifar`: ``cifar-10-batches-py/`` (``data_batch_1..5``, ``test_batch``,
  ``batches.meta``) or ``cifar-100-python/`` (``train``, ``test``, ``meta``), pickled dicts
  with ``uint8`` rows of 3072 bytes (R, G, B planes of a 32x32 image) and the label keys of the
  released files (CIFAR-100: ``fine_labels`` and ``coarse_labels``, coarse = fine // 5);
  ``torchvision.datasets.CIFAR10``/``CIFAR100`` read them (less their MD5 check).
- :func:`generate_imagenet`: ``train/<wnid>/<wnid>_<n>.JPEG`` and
  ``val/<wnid>/ILSVRC2012_val_<n>.JPEG`` (wnid-like class names ``n0000xxxx``), JPEG quality
  90, images of a few sizes and aspect ratios (``sizes``).
- Cityscapes, COCO-Stuff and Mapillary Vistas trees: :mod:`.generate_segmentation` (loaded
  on first use: ``python -m ... generate cityscapes`` etc. run it).

**Content.** Every class is a combination of a shape (disc, square, triangle, ring, cross,
stripes, star, crescent, frame, x), a hue band (five bands of 72 degrees) and a fill texture
(plain, waves, checks); each image draws its shape at a random position, size and small
rotation, in a random shade of the class's hue band, with a texture of random phase and
orientation, on a dull random background with a colour gradient and pixel noise. A small CNN
separates the classes within a few epochs; chance-level features (position, background) carry
nothing. Up to 10 classes differ in shape (and hue); more classes enumerate hue fastest, then
shape, then texture (up to 150), so CIFAR-100's superclasses (fine // 5) are the 20
shape-texture pairs, each in five hues. Class names say what they are (``disc-red-plain``).

**Determinism and atomicity.** Each (split, class) draws from its own generator seeded by
``(seed, split, class)``, so a data set is a function of its arguments only (bit-identical
files for the same arguments and library versions). The whole tree is built in a temporary
folder beside its destination and renamed into place, so a reader never sees half a data set.

**Never a user's folder.** A generated tree holds the marker of
:mod:`experiments.records.ownership`; a destination that exists and holds files but no marker
(a real data set, any folder of the user's) is refused, ``--overwrite`` or not, and nothing
there is moved or removed. ``--overwrite`` replaces only a tree generated here.

Command line::

    python -m experiments.train.data.generate {cifar10,cifar100,imagenet} --out ROOT
        [--train-per-class N] [--test-per-class N] [--classes N] [--seed S]
        [--sizes WxH ...] [--overwrite]
    python -m experiments.train.data.generate {cityscapes,cocostuff,vistas} --out ROOT
        [--train-images N] [--val-images N] [--sizes WxH ...] [--coarse-extra N] [--seed S]
        [--overwrite]

(``--classes``: ImageNet only; ``--sizes``: ImageNet, COCO-Stuff, Vistas, and Cityscapes with
exactly one size; ``--coarse-extra``: Cityscapes only.)
"""
import argparse
import colorsys
import contextlib
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from ...records import ownership
from ...records.atomic import write_json_atomic
from ..plan import GENERATED_STAMP
from .cifar import LAYOUTS

SHAPES = ("disc", "square", "triangle", "ring", "cross", "stripes", "star", "crescent",
          "frame", "x")
TEXTURES = ("plain", "waves", "checks")
HUES = ("red", "lime", "green", "blue", "purple")  # band centres 0, 72, 144, 216, 288 degrees
MAX_CLASSES = len(SHAPES) * len(TEXTURES) * len(HUES)
DEFAULT_SIZES = ((64, 48), (48, 64), (64, 64), (80, 56))  # (width, height)
JPEG_QUALITY = 90
_SPLIT_CODES = {"train": 1, "test": 2, "val": 2, "shuffle": 3}
DEFAULTS = {  # per-class counts of the command line
    "cifar10": {"train_per_class": 500, "test_per_class": 100},
    "cifar100": {"train_per_class": 50, "test_per_class": 10},
    "imagenet": {"train_per_class": 100, "test_per_class": 20, "classes": 10},
}
SEGMENTATION_DEFAULTS = {  # image counts of the command line (generate_segmentation)
    "cityscapes": {"train_images": 40, "val_images": 10, "coarse_extra": 0},
    "cocostuff": {"train_images": 40, "val_images": 10},
    "vistas": {"train_images": 40, "val_images": 10},
}


# ---------------------------------------------------------------------------------------------
# Content


def class_style(k, num_classes):
    """``(shape, texture, hue)`` indices of class ``k`` out of ``num_classes``."""
    if not 0 <= k < num_classes <= MAX_CLASSES:
        raise ValueError(f"class {k} of {num_classes}: at most {MAX_CLASSES} classes")
    if num_classes <= len(SHAPES):
        return k, (k // len(HUES)) % len(TEXTURES), k % len(HUES)
    return (k // len(HUES)) % len(SHAPES), k // (len(HUES) * len(SHAPES)), k % len(HUES)


def class_name(k, num_classes):
    shape, texture, hue = class_style(k, num_classes)
    return f"{SHAPES[shape]}-{HUES[hue]}-{TEXTURES[texture]}"


def _shape_mask(shape, u, v):
    """Boolean mask of ``SHAPES[shape]`` in shape coordinates (extent about [-1, 1])."""
    name = SHAPES[shape]
    r2 = u * u + v * v
    au, av = np.abs(u), np.abs(v)
    if name == "disc":
        return r2 <= 1.0
    if name == "square":
        return np.maximum(au, av) <= 0.8
    if name == "triangle":  # apex up (v grows downwards)
        return (v <= 0.75) & (v >= -0.95 + 1.9 * au)
    if name == "ring":
        return (r2 <= 1.0) & (r2 >= 0.5 ** 2)
    if name == "cross":
        return ((au <= 0.3) & (av <= 0.95)) | ((av <= 0.3) & (au <= 0.95))
    if name == "stripes":  # three horizontal bars
        return (au <= 0.9) & (av <= 0.95) & (np.floor((v + 0.95) / 0.38) % 2 == 0)
    if name == "star":
        return np.sqrt(r2) <= 0.6 + 0.38 * np.cos(5 * np.arctan2(v, u))
    if name == "crescent":
        return (r2 <= 1.0) & ((u - 0.5) ** 2 + v * v >= 0.8 ** 2)
    if name == "frame":
        return (np.maximum(au, av) <= 0.9) & (np.maximum(au, av) >= 0.55)
    if name == "x":
        return ((np.abs(u + v) <= 0.4) | (np.abs(u - v) <= 0.4)) & (np.maximum(au, av) <= 0.9)
    raise AssertionError(name)


def render(rng, height, width, style):
    """One ``(height, width, 3)`` uint8 image of class style ``(shape, texture, hue)``."""
    shape, texture, hue = style
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    side = min(height, width)

    # Background: a dull random colour with a linear gradient in a random direction.
    bg = np.array(colorsys.hsv_to_rgb(rng.random(), rng.uniform(0, 0.35),
                                      rng.uniform(0.25, 0.8)), np.float32)
    phi = rng.uniform(0, 2 * np.pi)
    ramp = ((x - width / 2) * np.cos(phi) + (y - height / 2) * np.sin(phi)) / side
    image = bg * (1 + rng.uniform(0, 0.5) * ramp)[..., None]

    # The shape: random centre, size and a small rotation.
    s = rng.uniform(0.26, 0.4) * side
    cx = rng.uniform(s * 0.8, width - s * 0.8)
    cy = rng.uniform(s * 0.8, height - s * 0.8)
    theta = rng.uniform(-0.35, 0.35)
    dx, dy = x - cx, y - cy
    u = (dx * np.cos(theta) + dy * np.sin(theta)) / s
    v = (-dx * np.sin(theta) + dy * np.cos(theta)) / s
    mask = _shape_mask(shape, u, v)

    # Fill: a shade of the class's hue band, modulated by the class's texture.
    h = (hue + rng.uniform(-0.25, 0.25)) / len(HUES)
    fill = np.array(colorsys.hsv_to_rgb(h % 1.0, rng.uniform(0.65, 1.0),
                                        rng.uniform(0.7, 1.0)), np.float32)
    period = s * rng.uniform(0.35, 0.5)
    if TEXTURES[texture] == "waves":
        psi = rng.uniform(0, np.pi)
        t = np.sin(2 * np.pi * (dx * np.cos(psi) + dy * np.sin(psi)) / period
                   + rng.uniform(0, 2 * np.pi))
        shade = 0.7 + 0.3 * t
    elif TEXTURES[texture] == "checks":
        c = period / 2
        shade = np.where((np.floor(u * s / c) + np.floor(v * s / c)) % 2 == 0, 1.0, 0.45)
    else:
        shade = np.ones_like(x)
    image = np.where(mask[..., None], fill * shade[..., None], image)
    image += rng.normal(0, 0.04, image.shape).astype(np.float32)
    return (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8)


def _rng(seed, split, k):
    return np.random.default_rng([int(seed) & (2**63 - 1), _SPLIT_CODES[split], k])


# ---------------------------------------------------------------------------------------------
# Writing


#: The tool named in the marker of a generated tree (:mod:`experiments.records.ownership`).
TOOL = "experiments.train.data.generate"


def _check_replaceable(target, overwrite):
    """Refuse to write ``target`` unless it is absent, an empty folder, or a tree generated
    here earlier (it holds the ownership marker) and ``overwrite`` is set."""
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        return
    if not (target.is_dir() and ownership.is_marked(target)):
        raise ownership.NotOwnedError(
            f"{target} exists and was not generated here (it holds no {ownership.MARKER}): a "
            "data set this tool did not make is never replaced, --overwrite or not. Use it as "
            "it is (a profile's datasets.<name>.generate: null) or generate elsewhere; a tree "
            "generated by a version without the marker must be deleted once by hand")
    if not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True (--overwrite) to replace it")


@contextlib.contextmanager
def _atomic_dir(target, overwrite):
    """Yield a temporary folder beside ``target``; rename it to ``target`` when the block
    succeeds. ``target`` may be absent or an empty folder; a tree generated here earlier is
    replaced only if ``overwrite``; anything else is refused before anything is written. The
    tree carries the ownership marker, which is what lets a later call replace it."""
    target = Path(target)
    _check_replaceable(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = ownership.mark(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.",
                                          suffix=".tmp"), TOOL)
    try:
        yield tmp
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)
        old = None
        if target.is_dir() and ownership.is_marked(target):
            # Move the old tree aside, put the new one in its place, then delete the old one.
            old = ownership.mark(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.",
                                                  suffix=".old"), TOOL)
            os.rename(target, old / target.name)
        elif target.is_dir():
            target.rmdir()  # empty (checked above); rmdir refuses a folder that filled since
        try:
            os.rename(tmp, target)
        except BaseException:
            if old is not None:
                os.rename(old / target.name, target)
                ownership.remove(old)
            raise
        if old is not None:
            ownership.remove(old)
    except BaseException:
        ownership.remove(tmp)
        raise


def _check_count(name, value, minimum=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _dump(obj, path):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)  # the released files are Python 2 pickles


def _cifar_split(variant, split, per_class, seed):
    """Images (N, 3072) uint8 rows, fine labels and file names of one split, shuffled."""
    n = LAYOUTS[variant].num_classes
    rows, labels, names = [], [], []
    for k in range(n):
        rng, style = _rng(seed, split, k), class_style(k, n)
        for i in range(per_class):
            rows.append(render(rng, 32, 32, style).transpose(2, 0, 1).reshape(-1))
            labels.append(k)
            names.append(f"{class_name(k, n)}_s_{i:06d}.png")
    order = np.random.default_rng([int(seed) & (2**63 - 1), _SPLIT_CODES["shuffle"],
                                   _SPLIT_CODES[split]]).permutation(len(rows))
    return (np.stack(rows)[order], [labels[i] for i in order], [names[i] for i in order])


def generate_cifar(root, variant, train_per_class, test_per_class, seed=0, *, overwrite=False):
    """Write a CIFAR-10 (``variant="cifar10"``) or CIFAR-100 data set under ``root``.

    ``root`` is the folder that will contain ``cifar-10-batches-py/`` or ``cifar-100-python/``
    (torchvision's ``root``); ``train_per_class`` and ``test_per_class`` images of each class
    go into the training batches (CIFAR-10: split over ``data_batch_1..5``) and the test batch.
    Returns the data set folder. An existing folder is an error unless ``overwrite``.
    """
    if variant not in LAYOUTS:
        raise ValueError(f"variant must be one of {sorted(LAYOUTS)}, got {variant!r}")
    _check_count("train_per_class", train_per_class)
    _check_count("test_per_class", test_per_class)
    lay = LAYOUTS[variant]
    n = lay.num_classes
    target = Path(root) / lay.folder
    with _atomic_dir(target, overwrite) as tmp:
        for split, files, per_class, what in (("train", lay.train_files, train_per_class,
                                               "training"),
                                              ("test", lay.test_files, test_per_class,
                                               "testing")):
            data, labels, names = _cifar_split(variant, split, per_class, seed)
            chunks = np.array_split(np.arange(len(data)), len(files))
            for b, (name, idx) in enumerate(zip(files, chunks), 1):
                batch = {"batch_label": f"{what} batch {b} of {len(files)}",
                         lay.label_key: [labels[i] for i in idx],
                         "data": data[idx],
                         "filenames": [names[i] for i in idx]}
                if lay.coarse_label_key:
                    batch[lay.coarse_label_key] = [labels[i] // 5 for i in idx]
                _dump(batch, tmp / name)
        meta = {lay.names_key: [class_name(k, n) for k in range(n)]}
        if lay.coarse_names_key:
            meta[lay.coarse_names_key] = [
                f"{SHAPES[s]}-{TEXTURES[t]}"
                for s, t, _ in (class_style(5 * c, n) for c in range(lay.num_coarse))]
        else:
            meta.update(num_cases_per_batch=len(chunks[0]), num_vis=3 * 32 * 32)
        _dump(meta, tmp / lay.meta_file)
    return target


def wnid(k):
    """The wnid-like folder name of generated class ``k`` (``n00000000``, ``n00000001``, ...)."""
    return f"n0000{k:04d}"


def generate_imagenet(root, classes, train_per_class, val_per_class, seed=0,
                      sizes=DEFAULT_SIZES, *, overwrite=False):
    """Write an ImageNet-layout tree ``root/{train,val}/<wnid>/*.JPEG`` of ``classes`` classes.

    Each image takes a random ``(width, height)`` from ``sizes``; JPEG quality 90. Returns
    ``root``. An existing non-empty ``root`` is an error unless ``overwrite``.
    """
    _check_count("classes", classes)
    if classes > MAX_CLASSES:
        raise ValueError(f"classes must be at most {MAX_CLASSES} (distinct generated classes), "
                         f"got {classes}")
    if classes > 9999:
        raise ValueError("wnid names hold 4 digits")
    _check_count("train_per_class", train_per_class)
    _check_count("val_per_class", val_per_class)
    sizes = [tuple(s) for s in sizes]
    if not sizes or any(len(s) != 2 or not all(isinstance(d, int) and d >= 8 for d in s)
                        for s in sizes):
        raise ValueError(f"sizes must be (width, height) pairs of ints >= 8, got {sizes!r}")
    root = Path(root)
    with _atomic_dir(root, overwrite) as tmp:
        val_number = 0
        for k in range(classes):
            style = class_style(k, classes)
            for split, per_class in (("train", train_per_class), ("val", val_per_class)):
                folder = tmp / split / wnid(k)
                folder.mkdir(parents=True)
                rng = _rng(seed, split, k)
                for i in range(per_class):
                    width, height = sizes[rng.integers(len(sizes))]
                    pixels = render(rng, height, width, style)
                    if split == "train":
                        name = f"{wnid(k)}_{i + 1}.JPEG"
                    else:
                        val_number += 1
                        name = f"ILSVRC2012_val_{val_number:08d}.JPEG"
                    Image.fromarray(pixels).save(folder / name, format="JPEG",
                                                 quality=JPEG_QUALITY)
    return root


# ---------------------------------------------------------------------------------------------
# Command line


def _size(text):
    try:
        w, h = (int(p) for p in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT (e.g. 64x48), got {text!r}")
    return w, h


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m experiments.train.data.generate",
        description="Write a small, learnable data set in the real on-disk format of CIFAR-10, "
                    "CIFAR-100, ImageNet (ImageFolder tree), Cityscapes, COCO-Stuff (stuff "
                    "pixel maps) or Mapillary Vistas.")
    p.add_argument("dataset", choices=sorted({**DEFAULTS, **SEGMENTATION_DEFAULTS}))
    p.add_argument("--out", required=True, type=Path,
                   help="CIFAR: the folder to hold cifar-10-batches-py/ or cifar-100-python/; "
                        "ImageNet, Cityscapes, COCO-Stuff, Vistas: the tree's root")
    p.add_argument("--train-per-class", type=int,
                   help="training images per class (default: cifar10 500, cifar100 50, "
                        "imagenet 100)")
    p.add_argument("--test-per-class", type=int,
                   help="test (ImageNet: val) images per class (default: cifar10 100, "
                        "cifar100 10, imagenet 20)")
    p.add_argument("--classes", type=int,
                   help=f"ImageNet only: number of classes (default 10, at most {MAX_CLASSES})")
    p.add_argument("--sizes", type=_size, nargs="+",
                   help="ImageNet, COCO-Stuff, Vistas: image sizes WIDTHxHEIGHT to draw from "
                        "(ImageNet default " + " ".join(f"{w}x{h}" for w, h in DEFAULT_SIZES)
                        + "); Cityscapes: the one image size (default 256x128)")
    p.add_argument("--train-images", type=int,
                   help="Cityscapes, COCO-Stuff, Vistas: training images (default 40)")
    p.add_argument("--val-images", type=int,
                   help="Cityscapes, COCO-Stuff, Vistas: validation images (default 10)")
    p.add_argument("--coarse-extra", type=int,
                   help="Cityscapes only: train_extra images with gtCoarse labels (default 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true",
                   help="replace a data set generated here earlier (a folder this tool did not "
                        "generate is never replaced)")
    args = p.parse_args(argv)
    segmentation = args.dataset in SEGMENTATION_DEFAULTS
    if args.dataset != "imagenet" and args.classes is not None:
        p.error(f"--classes applies to imagenet only ({args.dataset} has fixed classes"
                + (")" if segmentation else " and 32x32 images)"))
    if args.dataset in LAYOUTS and args.sizes is not None:
        p.error(f"--sizes applies to imagenet, cityscapes, cocostuff and vistas only "
                f"({args.dataset} has 32x32 images)")
    if args.dataset == "cityscapes" and args.sizes is not None and len(args.sizes) != 1:
        p.error("--sizes takes exactly one WIDTHxHEIGHT for cityscapes (all its images have "
                "one size)")
    if args.dataset != "cityscapes" and args.coarse_extra is not None:
        p.error(f"--coarse-extra applies to cityscapes only, not {args.dataset}")
    own, other = ((("--train-images", "--val-images"), ("--train-per-class", "--test-per-class"))
                  if segmentation else
                  (("--train-per-class", "--test-per-class"), ("--train-images", "--val-images")))
    for flag in other:
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            p.error(f"{flag} does not apply to {args.dataset} (use {' and '.join(own)})")
    defaults = (SEGMENTATION_DEFAULTS if segmentation else DEFAULTS)[args.dataset]
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def _generate_segmentation(args):
    """Run the segmentation generator of ``args.dataset``; returns the tree's root."""
    from . import generate_segmentation as seg  # loaded only for these data sets

    common = dict(seed=args.seed, overwrite=args.overwrite)
    if args.dataset == "cityscapes":
        if args.sizes:
            common["size"] = args.sizes[0]
        return seg.generate_cityscapes(args.out, args.train_images, args.val_images,
                                       coarse_extra=args.coarse_extra, **common)
    if args.sizes:
        common["sizes"] = args.sizes
    generate = seg.generate_cocostuff if args.dataset == "cocostuff" else seg.generate_vistas
    return generate(args.out, args.train_images, args.val_images, **common)


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        if args.dataset in SEGMENTATION_DEFAULTS:
            path = _generate_segmentation(args)
        elif args.dataset == "imagenet":
            path = generate_imagenet(args.out, args.classes, args.train_per_class,
                                     args.test_per_class, args.seed,
                                     args.sizes or DEFAULT_SIZES, overwrite=args.overwrite)
            classes = args.classes
        else:
            path = generate_cifar(args.out, args.dataset, args.train_per_class,
                                  args.test_per_class, args.seed, overwrite=args.overwrite)
            classes = LAYOUTS[args.dataset].num_classes
    except (ValueError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Last, so its presence says the data set is complete (the pipeline's output; plan.py).
    options = {key: str(value) if isinstance(value, Path) else value
               for key, value in vars(args).items()}
    write_json_atomic(Path(args.out) / GENERATED_STAMP, {"dataset": args.dataset,
                                                         "options": options})
    if args.dataset in SEGMENTATION_DEFAULTS:
        extra = f" + {args.coarse_extra} coarse extra" if args.coarse_extra else ""
        print(f"{args.dataset}: {args.train_images} train + {args.val_images} val{extra} images "
              f"in {path} ({time.perf_counter() - start:.1f} s)")
        return 0
    print(f"{args.dataset}: {classes} classes x ({args.train_per_class} train + "
          f"{args.test_per_class} test) images in {path} "
          f"({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
