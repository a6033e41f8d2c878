"""The papers' data augmentation and evaluation crops, as torchvision transforms.

**ImageNet** (InPlace-ABN §4.1: "we proportionally scale input images so that their smallest
side equals 256 pixels, before randomly taking 224×224 crops. RGB images are per-channel mean
and variance normalized and color augmentation is applied as described in [30]" (ResNeXt),
i.e. fb.resnet.torch's ``datasets/imagenet.lua``):

- :func:`imagenet_train`: shorter side to ``resize``, a random ``crop`` x ``crop`` crop,
  horizontal flip, :class:`ColorJitter` (brightness, contrast, saturation 0.4, in random
  order) and :class:`Lighting` (AlexNet-style PCA noise, ``alphastd`` 0.1, fb.resnet.torch's
  eigenvalues and eigenvectors), then per-channel normalisation. That is the paper's text.
  The authors' released script (mapillary/inplace_abn ``scripts/imagenet/utils.py``,
  ``create_transforms`` with the defaults of ``scripts/imagenet/config.py``: ``scale_train``
  -1, i.e. no resize) and fb.resnet.torch (``t.RandomSizedCrop(224)``, which the DenseNet
  paper's ImageNet runs used) take an Inception-style crop instead (8%-100% of the area,
  aspect 3/4-4/3, resized to 224): ``crop_style="random_resized"`` gives that.
- :func:`imagenet_eval`: shorter side to ``resize``, then the centre crop (``"center"``) or the
  ten crops (``"ten_crop"``: four corners and centre of the image and of its mirror,
  torchvision's ``TenCrop``, as the authors' ``scripts/imagenet/utils.py``
  ``create_test_transforms``). The paper's three columns are :data:`EVAL_SETTINGS`: 224 centre
  and 224 ten-crop from a 256 shorter side (the authors' ``test_imagenet.py`` defaults,
  ``--scale 256 --crop 224``), and 320 centre, which their README does not spell out; we take
  fb.resnet.torch's 320 test crop (shorter side 320, the central 320x320, so the whole
  shorter side is seen: facebookarchive/fb.resnet.torch issue 31), which their global-pooling
  networks accept.

**CIFAR** (DenseNet's recipe, fb.resnet.torch's ``datasets/cifar10.lua``, which the DenseNet
code builds on): normalise by the training set's per-channel mean and std, flip, pad by 4 with
zeros and take a random 32x32 crop. The padding comes after normalisation there, so padded
pixels are the mean colour; :func:`cifar_train` keeps that order.

Sizes are arguments, so a small profile can run the same pipeline on small images (for
example ``resize=40, crop=32``). Every transform is a module-level class, so datasets that hold
them can be pickled into DataLoader workers of any start method.
"""
import torch
from torchvision import transforms as T

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# fb.resnet.torch datasets/imagenet.lua ("pca"), also the InPlace-ABN release's
# scripts/imagenet/transforms.py: eigenvalues and eigenvectors (columns) of the RGB covariance.
IMAGENET_EIGVAL = (0.2175, 0.0188, 0.0045)
IMAGENET_EIGVEC = ((-0.5675, 0.7192, 0.4009),
                   (-0.5808, -0.0045, -0.8140),
                   (-0.5836, -0.6948, 0.4203))
# fb.resnet.torch datasets/cifar10.lua and cifar100.lua ("computed from entire training set").
CIFAR_MEAN = {"cifar10": (125.3 / 255, 123.0 / 255, 113.9 / 255),
              "cifar100": (129.3 / 255, 124.1 / 255, 112.4 / 255)}
CIFAR_STD = {"cifar10": (63.0 / 255, 62.1 / 255, 66.7 / 255),
             "cifar100": (68.2 / 255, 65.4 / 255, 70.4 / 255)}

CROP_STYLES = ("resize_crop", "random_resized")
EVAL_MODES = ("center", "ten_crop")
# The three evaluations of InPlace-ABN Table 1: name -> (mode, resize, crop).
EVAL_SETTINGS = {"center_224": ("center", 256, 224),
                 "ten_crop_224": ("ten_crop", 256, 224),
                 "center_320": ("center", 320, 320)}

_GRAY = (0.299, 0.587, 0.114)  # fb.resnet.torch's grayscale weights (ITU-R 601 luma)


def _grayscale(img):
    w = img.new_tensor(_GRAY).view(3, 1, 1)
    return (img * w).sum(0, keepdim=True)


class Lighting:
    """PCA colour noise of AlexNet as fb.resnet.torch implements it (``t.Lighting``).

    On a ``(3, H, W)`` RGB tensor in ``[0, 1]``: draw ``alpha ~ N(0, alphastd^2)`` per
    eigenvector and add ``sum_j eigvec[:, j] * alpha[j] * eigval[j]`` to every pixel. Uses
    torch's global generator, or ``generator`` if given. The result is not clamped, as in
    fb.resnet.torch.
    """

    def __init__(self, alphastd=0.1, eigval=IMAGENET_EIGVAL, eigvec=IMAGENET_EIGVEC,
                 generator=None):
        if alphastd < 0:
            raise ValueError(f"alphastd must be >= 0, got {alphastd}")
        self.alphastd = float(alphastd)
        self.eigval = torch.tensor(eigval, dtype=torch.float64)
        self.eigvec = torch.tensor(eigvec, dtype=torch.float64)
        if self.eigval.shape != (3,) or self.eigvec.shape != (3, 3):
            raise ValueError("eigval must have 3 entries and eigvec be 3x3, got shapes "
                             f"{tuple(self.eigval.shape)} and {tuple(self.eigvec.shape)}")
        self.generator = generator

    def __call__(self, img):
        if self.alphastd == 0:
            return img
        alpha = torch.normal(0.0, self.alphastd, (3,), generator=self.generator,
                             dtype=torch.float64)
        rgb = (self.eigvec * alpha * self.eigval).sum(dim=1)
        return img + rgb.to(img.dtype).view(3, 1, 1)

    def __repr__(self):
        return f"Lighting(alphastd={self.alphastd})"


class ColorJitter:
    """Brightness, contrast and saturation jitter in random order, as fb.resnet.torch.

    On a ``(3, H, W)`` RGB tensor: each factor is ``1 + U(-v, v)``; brightness blends with
    black, contrast with the mean of the grayscale image, saturation with the grayscale image
    (weights 0.299, 0.587, 0.114). Unlike ``torchvision.transforms.ColorJitter`` the result is
    not clamped to ``[0, 1]`` (fb.resnet.torch's and the InPlace-ABN release's behaviour).
    """

    def __init__(self, brightness=0.4, contrast=0.4, saturation=0.4):
        for name, v in (("brightness", brightness), ("contrast", contrast),
                        ("saturation", saturation)):
            if not 0 <= v <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        self.brightness, self.contrast, self.saturation = brightness, contrast, saturation
        self._ops = [op for op, v in ((self._brightness, brightness),
                                      (self._contrast, contrast),
                                      (self._saturation, saturation)) if v]

    @staticmethod
    def _factor(v):
        return 1.0 + (torch.rand(()).item() * 2 - 1) * v

    def _brightness(self, img):
        return img * self._factor(self.brightness)

    def _contrast(self, img):
        a = self._factor(self.contrast)
        return img * a + (1 - a) * _grayscale(img).mean()

    def _saturation(self, img):
        a = self._factor(self.saturation)
        return img * a + (1 - a) * _grayscale(img)

    def __call__(self, img):
        for i in torch.randperm(len(self._ops)).tolist():
            img = self._ops[i](img)
        return img

    def __repr__(self):
        return (f"ColorJitter(brightness={self.brightness}, contrast={self.contrast}, "
                f"saturation={self.saturation})")


class TenCropTensor:
    """PIL image -> ``(10, 3, crop, crop)`` tensor: torchvision's ``TenCrop``, each crop
    converted and normalised (corners and centre, then the same of the mirrored image)."""

    def __init__(self, crop, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        self.ten_crop = T.TenCrop(crop)
        self.finish = T.Compose([T.ToTensor(), T.Normalize(mean, std)])

    def __call__(self, image):
        return torch.stack([self.finish(c) for c in self.ten_crop(image)])

    def __repr__(self):
        return f"TenCropTensor({self.ten_crop.size[0]})"


def _check_sizes(resize, crop):
    for name, v in (("resize", resize), ("crop", crop)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if resize < crop:
        raise ValueError(f"resize (shorter side, {resize}) must be >= crop ({crop})")


def imagenet_train(resize=256, crop=224, *, crop_style="resize_crop", jitter=0.4,
                   lighting=0.1):
    """ImageNet training augmentation (PIL image in, normalised ``(3, crop, crop)`` out).

    ``crop_style="resize_crop"`` (default, the paper's text): shorter side to ``resize``, random
    ``crop`` crop; ``"random_resized"`` (the authors' release, fb.resnet.torch): Inception-style
    random-sized crop resized to ``crop`` (``resize`` unused). Then flip, :class:`ColorJitter`
    (``jitter`` for brightness, contrast and saturation; 0 turns it off), :class:`Lighting`
    (``alphastd=lighting``; 0 turns it off) and ImageNet mean/std normalisation.
    """
    _check_sizes(resize, crop)
    if crop_style == "resize_crop":
        geometry = [T.Resize(resize), T.RandomCrop(crop)]
    elif crop_style == "random_resized":
        geometry = [T.RandomResizedCrop(crop)]
    else:
        raise ValueError(f"crop_style must be one of {CROP_STYLES}, got {crop_style!r}")
    steps = geometry + [T.RandomHorizontalFlip(), T.ToTensor()]
    if jitter:
        steps.append(ColorJitter(jitter, jitter, jitter))
    if lighting:
        steps.append(Lighting(lighting))
    steps.append(T.Normalize(IMAGENET_MEAN, IMAGENET_STD))
    return T.Compose(steps)


def imagenet_eval(mode="center", resize=256, crop=224):
    """ImageNet evaluation: shorter side to ``resize``, then the centre ``crop`` (a
    ``(3, crop, crop)`` tensor) or, for ``mode="ten_crop"``, the ten crops (``(10, 3, crop,
    crop)``); normalised by the ImageNet mean/std. See :data:`EVAL_SETTINGS` for the paper's."""
    _check_sizes(resize, crop)
    if mode == "center":
        return T.Compose([T.Resize(resize), T.CenterCrop(crop), T.ToTensor(),
                          T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    if mode == "ten_crop":
        return T.Compose([T.Resize(resize), TenCropTensor(crop)])
    raise ValueError(f"mode must be one of {EVAL_MODES}, got {mode!r}")


def _cifar_stats(variant):
    if variant not in CIFAR_MEAN:
        raise ValueError(f"variant must be one of {sorted(CIFAR_MEAN)}, got {variant!r}")
    return CIFAR_MEAN[variant], CIFAR_STD[variant]


def cifar_train(variant="cifar10"):
    """CIFAR training augmentation (PIL image in, ``(3, 32, 32)`` out): normalise by
    ``variant``'s mean/std, flip, zero-pad by 4 (the mean colour, as normalised) and crop 32."""
    mean, std = _cifar_stats(variant)
    return T.Compose([T.ToTensor(), T.Normalize(mean, std), T.RandomHorizontalFlip(),
                      T.RandomCrop(32, padding=4)])


def cifar_eval(variant="cifar10"):
    """CIFAR evaluation: the image normalised by ``variant``'s mean/std, nothing else."""
    mean, std = _cifar_stats(variant)
    return T.Compose([T.ToTensor(), T.Normalize(mean, std)])


__all__ = ["CIFAR_MEAN", "CIFAR_STD", "CROP_STYLES", "ColorJitter", "EVAL_MODES",
           "EVAL_SETTINGS", "IMAGENET_EIGVAL", "IMAGENET_EIGVEC", "IMAGENET_MEAN",
           "IMAGENET_STD", "Lighting", "TenCropTensor", "cifar_eval", "cifar_train",
           "imagenet_eval", "imagenet_train"]
