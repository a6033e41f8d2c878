"""experiments.train.data: the real-format loaders on generated data, their errors for broken
trees, the papers' transforms, reproducible and sharded loading, and the generators."""
import os
import pickle
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from experiments.train.data import (CIFAR, DatasetLayoutError, ImageNet, ShardSampler,
                                    cifar_eval, cifar_train, generate_cifar, generate_imagenet,
                                    imagenet_eval, imagenet_train, make_loader)
from experiments.records.ownership import MARKER
from experiments.train.data import generate as gen
from experiments.train.data.transforms import (EVAL_SETTINGS, IMAGENET_EIGVAL, IMAGENET_EIGVEC,
                                               IMAGENET_MEAN, IMAGENET_STD, ColorJitter,
                                               Lighting)

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cifar10(tmp_path_factory):
    root = tmp_path_factory.mktemp("c10_")
    generate_cifar(root, "cifar10", train_per_class=100, test_per_class=30, seed=0)
    return root


@pytest.fixture(scope="module")
def cifar100(tmp_path_factory):
    root = tmp_path_factory.mktemp("c100_")
    generate_cifar(root, "cifar100", train_per_class=3, test_per_class=1, seed=0)
    return root


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet") / "tree"
    generate_imagenet(root, classes=4, train_per_class=5, val_per_class=3, seed=0)
    return root


def _copy_tree(src, dst):
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# Loaders on generated data of each format


@pytest.mark.parametrize("variant, train, n, classes", [
    ("cifar10", True, 1000, 10), ("cifar10", False, 300, 10),
    ("cifar100", True, 300, 100), ("cifar100", False, 100, 100)])
def test_cifar_dataset_and_loader(request, variant, train, n, classes):
    root = request.getfixturevalue(variant)
    ds = CIFAR(root, variant, train)
    assert len(ds) == n and len(ds.classes) == classes
    assert ds.data.shape == (n, 32, 32, 3) and ds.data.dtype == np.uint8
    assert sorted(set(ds.targets)) == list(range(classes))
    assert np.bincount(ds.targets).tolist() == [n // classes] * classes
    x, y = ds[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and 0 <= x.min() <= x.max() <= 1
    assert isinstance(y, int)
    if variant == "cifar100":
        assert len(ds.coarse_classes) == 20
        assert ds.coarse_targets == [t // 5 for t in ds.targets]
    ds.transform = (cifar_train if train else cifar_eval)(variant)
    loader = make_loader(ds, 16, train=train, workers=0, seed=0, device="cpu")
    x, y = next(iter(loader))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and 0 <= y.min() and y.max() < classes
    assert len(loader) == (n // 16 if train else -(-n // 16))


@pytest.mark.parametrize("variant", ["cifar10", "cifar100"])
def test_torchvision_reads_generated_cifar_identically(request, monkeypatch, variant):
    """torchvision's own CIFAR classes are the reference for the format (their MD5 check of
    the released files is switched off)."""
    root = request.getfixturevalue(variant)
    reference = {"cifar10": torchvision.datasets.CIFAR10,
                 "cifar100": torchvision.datasets.CIFAR100}[variant]
    monkeypatch.setattr(reference, "_check_integrity", lambda self: True)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    for train in (True, False):
        ours, theirs = CIFAR(root, variant, train), reference(root, train=train)
        assert ours.classes == theirs.classes
        assert np.array_equal(ours.data, theirs.data)
        assert ours.targets == theirs.targets
        image, label = theirs[3]
        assert np.array_equal(np.asarray(image), ours.data[3]) and label == ours[3][1]


def test_imagenet_dataset_matches_imagefolder_and_loads(imagenet):
    for split, per_class in (("train", 5), ("val", 3)):
        ds = ImageNet(imagenet, split)
        ref = torchvision.datasets.ImageFolder(imagenet / split)
        assert ds.classes == ref.classes == [f"n0000{k:04d}" for k in range(4)]
        assert ds.samples == ref.samples and ds.targets == ref.targets
        assert len(ds) == 4 * per_class
        for i in (0, len(ds) - 1):
            x, y = ds[i]
            assert y == ref[i][1] and x.dtype == torch.float32 and x.shape[0] == 3
            assert np.array_equal((x * 255).round().byte().permute(1, 2, 0).numpy(),
                                  np.asarray(ref[i][0]))
    sizes = {Image.open(p).size for p, _ in ImageNet(imagenet, "train").samples}
    assert len(sizes) > 1 and sizes <= set(gen.DEFAULT_SIZES)

    train = ImageNet(imagenet, "train", imagenet_train(resize=40, crop=32))
    x, y = next(iter(make_loader(train, 8, train=True, workers=0, seed=0, device="cpu")))
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and y.max() < 4
    val = ImageNet(imagenet, "val", imagenet_eval("ten_crop", resize=40, crop=32))
    batches = list(make_loader(val, 5, train=False, workers=0, seed=0, device="cpu"))
    assert [b[0].shape for b in batches] == [(5, 10, 3, 32, 32)] * 2 + [(2, 10, 3, 32, 32)]
    assert torch.cat([b[1] for b in batches]).tolist() == val.targets


def test_imagenet_grayscale_image_is_read_as_rgb(imagenet, tmp_path):
    root = _copy_tree(imagenet, tmp_path / "tree")
    path = root / "val" / "n00000000" / "gray.JPEG"
    Image.new("L", (40, 30), 128).save(path)
    ds = ImageNet(root, "val")
    x, _ = ds[ds.samples.index((str(path), 0))]
    assert x.shape == (3, 30, 40)


# ---------------------------------------------------------------------------------------------
# Broken trees: errors name the path and the expected layout


def _raises_layout(match_path, fn, *args, **kwargs):
    with pytest.raises(DatasetLayoutError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert str(match_path) in message and "Expected layout" in message, message
    return info.value


def test_imagenet_broken_trees(imagenet, tmp_path):
    _raises_layout(tmp_path / "nowhere", ImageNet, tmp_path / "nowhere", "train")
    with pytest.raises(ValueError, match="split"):
        ImageNet(imagenet, "test")

    no_val = _copy_tree(imagenet, tmp_path / "no_val")
    shutil.rmtree(no_val / "val")
    ImageNet(no_val, "train")
    _raises_layout(no_val / "val", ImageNet, no_val, "val")

    empty = _copy_tree(imagenet, tmp_path / "empty")
    for f in (empty / "train" / "n00000002").iterdir():
        f.unlink()
    (empty / "train" / "n00000002" / "notes.txt").write_text("not an image")
    _raises_layout(empty / "train" / "n00000002", ImageNet, empty, "train")

    extra = _copy_tree(imagenet, tmp_path / "extra")
    (extra / "val" / "n00000099").mkdir()
    shutil.copy(next((extra / "val" / "n00000000").iterdir()), extra / "val" / "n00000099")
    err = _raises_layout(extra / "val", ImageNet, extra, "val")
    assert "n00000099" in str(err) and "outside the class list" in str(err)

    missing = _copy_tree(imagenet, tmp_path / "missing")
    shutil.rmtree(missing / "val" / "n00000001")
    assert "n00000001" in str(_raises_layout(missing / "val", ImageNet, missing, "val"))

    flat = _copy_tree(imagenet, tmp_path / "flat")
    for d in (flat / "val").iterdir():
        for f in d.iterdir():
            f.rename(flat / "val" / f.name)
        d.rmdir()
    assert "class folders" in str(_raises_layout(flat / "val", ImageNet, flat, "val"))


def test_imagenet_corrupt_jpeg_names_the_file(imagenet, tmp_path):
    root = _copy_tree(imagenet, tmp_path / "corrupt")
    bad = sorted((root / "train" / "n00000001").iterdir())[2]
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG any more")
    ds = ImageNet(root, "train")  # the tree is fine; the file fails when read
    index = [p for p, _ in ds.samples].index(str(bad))
    _raises_layout(bad, ds.__getitem__, index)
    _raises_layout(bad, ImageNet, root, "train", verify=True)

    truncated = sorted((root / "train" / "n00000003").iterdir())[0]
    truncated.write_bytes(truncated.read_bytes()[:300])
    ds = ImageNet(root, "train")
    _raises_layout(truncated, ds.__getitem__, [p for p, _ in ds.samples].index(str(truncated)))


def _rewrite(path, change):
    with open(path, "rb") as f:
        obj = pickle.load(f, encoding="latin1")
    change(obj)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def test_cifar_broken_files(cifar10, cifar100, tmp_path):
    _raises_layout(tmp_path / "nowhere", CIFAR, tmp_path / "nowhere", "cifar10", True)
    _raises_layout(cifar10 / "cifar-100-python", CIFAR, cifar10, "cifar100", True)
    with pytest.raises(ValueError, match="variant"):
        CIFAR(cifar10, "cifar1000", True)

    def broken(name, src=cifar10, folder="cifar-10-batches-py"):
        return _copy_tree(src / folder, tmp_path / name / folder).parent

    root = broken("label")
    _rewrite(root / "cifar-10-batches-py" / "data_batch_3",
             lambda b: b["labels"].__setitem__(7, 10))
    err = _raises_layout(root / "cifar-10-batches-py" / "data_batch_3", CIFAR, root, "cifar10",
                         True)
    assert "label 10 of image 7" in str(err)
    CIFAR(root, "cifar10", False)  # the test batch is fine

    root = broken("coarse", cifar100, "cifar-100-python")
    _rewrite(root / "cifar-100-python" / "test", lambda b: b["coarse_labels"].__setitem__(0, 20))
    _raises_layout(root / "cifar-100-python" / "test", CIFAR, root, "cifar100", False)

    root = broken("truncated")
    path = root / "cifar-10-batches-py" / "test_batch"
    path.write_bytes(path.read_bytes()[:5000])
    assert "truncated" in str(_raises_layout(path, CIFAR, root, "cifar10", False))

    root = broken("missing")
    (root / "cifar-10-batches-py" / "batches.meta").unlink()
    _raises_layout(root / "cifar-10-batches-py" / "batches.meta", CIFAR, root, "cifar10", True)

    root = broken("shape")
    _rewrite(root / "cifar-10-batches-py" / "test_batch",
             lambda b: b.__setitem__("data", b["data"][:, :1000]))
    _raises_layout(root / "cifar-10-batches-py" / "test_batch", CIFAR, root, "cifar10", False)

    root = broken("dtype")
    _rewrite(root / "cifar-10-batches-py" / "test_batch",
             lambda b: b.__setitem__("data", b["data"].astype(np.float32)))
    _raises_layout(root / "cifar-10-batches-py" / "test_batch", CIFAR, root, "cifar10", False)

    root = broken("count")
    _rewrite(root / "cifar-10-batches-py" / "test_batch", lambda b: b["labels"].pop())
    _raises_layout(root / "cifar-10-batches-py" / "test_batch", CIFAR, root, "cifar10", False)

    root = broken("key")
    _rewrite(root / "cifar-10-batches-py" / "data_batch_5", lambda b: b.pop("labels"))
    assert "no key 'labels'" in str(_raises_layout(root / "cifar-10-batches-py" / "data_batch_5",
                                                   CIFAR, root, "cifar10", True))

    root = broken("names")
    _rewrite(root / "cifar-10-batches-py" / "batches.meta", lambda m: m["label_names"].pop())
    _raises_layout(root / "cifar-10-batches-py" / "batches.meta", CIFAR, root, "cifar10", True)

    root = broken("foreign")  # a pickle that would run code is refused, not run
    path = root / "cifar-10-batches-py" / "test_batch"
    path.write_bytes(pickle.dumps(os.system, protocol=2))
    assert "posix.system" in str(_raises_layout(path, CIFAR, root, "cifar10", False))


def test_layout_error_survives_a_worker(imagenet, tmp_path):
    """A worker's exception is re-raised in the main process as ``type(exc)(message)``
    (torch's ExceptionWrapper, which a real worker would use; done here in process, since a
    DataLoader whose worker failed takes seconds to shut down)."""
    root = _copy_tree(imagenet, tmp_path / "w")
    bad = sorted((root / "val" / "n00000000").iterdir())[0]
    bad.write_bytes(b"garbage")
    ds = ImageNet(root, "val")
    try:
        ds[0]
    except DatasetLayoutError:
        wrapped = torch._utils.ExceptionWrapper(sys.exc_info(), where="in DataLoader worker")
    with pytest.raises(DatasetLayoutError, match=bad.name):
        wrapped.reraise()


# ---------------------------------------------------------------------------------------------
# Transforms


def test_ten_crop_and_center_crop(imagenet):
    image = Image.open(ImageNet(imagenet, "val").samples[0][0]).convert("RGB")
    ten = imagenet_eval("ten_crop", resize=40, crop=32)(image)
    assert ten.shape == (10, 3, 32, 32) and ten.dtype == torch.float32
    resized = torchvision.transforms.Resize(40)(image)
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    top_left = (torchvision.transforms.functional.to_tensor(resized)[:, :32, :32] - mean) / std
    torch.testing.assert_close(ten[0], top_left)
    centre = imagenet_eval("center", resize=40, crop=32)(image)
    torch.testing.assert_close(centre, ten[4])  # TenCrop: 4 corners, then the centre
    torch.testing.assert_close(ten[5], ten[1].flip(-1))  # mirror's top left = top right
    assert EVAL_SETTINGS == {"center_224": ("center", 256, 224),
                             "ten_crop_224": ("ten_crop", 256, 224),
                             "center_320": ("center", 320, 320)}
    for args in (("center", 30, 32), ("corners", 40, 32), ("center", 40.0, 32)):
        with pytest.raises(ValueError):
            imagenet_eval(*args)


def _coordinate_image(size=200):
    """An RGB image whose red channel is each pixel's column and green its row."""
    xs, ys = np.meshgrid(np.arange(size), np.arange(size))
    return Image.fromarray(np.stack([xs, ys, np.zeros_like(xs)], -1).astype(np.uint8))


def _crop_extent(out):
    """``(width, height)`` in source pixels of a crop of a :func:`_coordinate_image` resized to
    ``out`` (PIL): output pixels k = 0 and n - 1 sample the source at ``(k + 0.5) w / n``."""
    rgb = np.asarray(out, dtype=np.float64)
    n = rgb.shape[0]
    return tuple((rgb[:, :, c].max() - rgb[:, :, c].min()) * n / (n - 1) for c in (0, 1))


def test_the_points_crop_style_option_gives_fb_resnet_torch_scale_augmentation(imagenet,
                                                                                tmp_path):
    """``--crop-style random_resized`` reaches the point's ImageNet training set: crops of
    8%-100% of the image's area at aspect 3/4-4/3 (fb.resnet.torch's RandomSizedCrop, DenseNet
    Fig. 6), resized to --crop, different from sample to sample; the default keeps InPlace-ABN's
    shorter side to --resize, then a random --crop crop."""
    from experiments.train import point

    def train_set(*style):
        args = point.parser("densenet_fig6_imagenet", "").parse_args(
            ["--dataset", "imagenet", "--data", str(imagenet), "--model", "densenet_bc",
             "--epochs", "1", "--batch", "2", "--schedule", "step", "--resize", "40",
             "--crop", "32", *style,
             "--eval", "c=center:40:32", "--out", str(tmp_path / "o.json"), "--epochs-csv",
             str(tmp_path / "o.csv"), "--weights", str(tmp_path / "o.pt"), "--work-dir",
             str(tmp_path / "w")])
        return point.datasets(args)[0]

    image = _coordinate_image()
    for style, expected in ((["--crop-style", "random_resized"], "RandomResizedCrop"),
                            ([], "Resize")):
        train = train_set(*style)
        assert train[0][0].shape == (3, 32, 32)
        geometry = train.transform.transforms[0]
        assert type(geometry).__name__ == expected
    geometry = train_set("--crop-style", "random_resized").transform.transforms[0]
    areas, aspects = [], []
    for seed in range(40):
        torch.manual_seed(seed)
        out = geometry(image)
        assert out.size == (32, 32)
        width, height = _crop_extent(out)
        areas.append(width * height / 200 ** 2)
        aspects.append(width / height)
    # Rounding to whole pixels and the resampling filter's edges: a few percent either side.
    assert 0.08 * 0.9 <= min(areas) and max(areas) <= 1.0 * 1.05
    assert 3 / 4 * 0.9 <= min(aspects) and max(aspects) <= 4 / 3 * 1.1
    assert max(areas) - min(areas) > 0.4, areas  # the scale varies over the 8%-100% range


def test_imagenet_train_transform_shapes_and_styles(imagenet):
    image = Image.open(ImageNet(imagenet, "train").samples[0][0]).convert("RGB")
    for style in ("resize_crop", "random_resized"):
        out = imagenet_train(resize=40, crop=32, crop_style=style)(image)
        assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    with pytest.raises(ValueError, match="crop_style"):
        imagenet_train(crop_style="inception")
    names = [type(t).__name__ for t in imagenet_train().transforms]
    assert names == ["Resize", "RandomCrop", "RandomHorizontalFlip", "ToTensor", "ColorJitter",
                     "Lighting", "Normalize"]
    assert imagenet_train().transforms[0].size == 256
    assert imagenet_train().transforms[1].size == (224, 224)


def test_lighting_against_hand_computation():
    img = torch.rand(3, 4, 5, dtype=torch.float64)
    out = Lighting(0.1, generator=torch.Generator().manual_seed(7))(img)
    alpha = torch.normal(0.0, 0.1, (3,), generator=torch.Generator().manual_seed(7),
                         dtype=torch.float64).tolist()
    rgb = [sum(IMAGENET_EIGVEC[i][j] * alpha[j] * IMAGENET_EIGVAL[j] for j in range(3))
           for i in range(3)]
    for c in range(3):
        torch.testing.assert_close(out[c], img[c] + rgb[c])
    assert Lighting(0.0)(img) is img


def test_color_jitter_is_fb_resnet_torch():
    img = torch.rand(3, 6, 6)
    ratio = ColorJitter(0.4, 0, 0)(img) / img
    assert torch.allclose(ratio, ratio.flatten()[0]) and 0.6 <= ratio.flatten()[0] <= 1.4
    gray = (img * torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)).sum(0)
    out = ColorJitter(0, 0, 0.4)(img)  # blend with the grayscale image: luma unchanged
    torch.testing.assert_close((out * torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)).sum(0),
                               gray)
    bright = ColorJitter(0.4, 0.4, 0.4)(torch.ones(3, 4, 4))  # not clamped to [0, 1]
    assert torch.isfinite(bright).all()


def test_cifar_transforms(cifar10):
    image = Image.fromarray(CIFAR(cifar10, "cifar10", True).data[0])
    x = cifar_eval()(image)
    mean = torch.tensor([125.3, 123.0, 113.9]).view(3, 1, 1) / 255
    std = torch.tensor([63.0, 62.1, 66.7]).view(3, 1, 1) / 255
    torch.testing.assert_close(x, (torchvision.transforms.functional.to_tensor(image) - mean) / std)
    torch.manual_seed(3)
    outs = [cifar_train()(image) for _ in range(20)]
    assert all(o.shape == (3, 32, 32) for o in outs)
    # Padding (pad 4, crop 32) is zero after normalisation, i.e. the mean colour.
    assert any((o[:, :, 0] == 0).all() or (o[:, 0, :] == 0).all() for o in outs)
    with pytest.raises(ValueError, match="variant"):
        cifar_train("svhn")


# ---------------------------------------------------------------------------------------------
# Reproducible, sharded loading


def _batches(loader, n=None):
    out = []
    for i, (x, y) in enumerate(loader):
        if n is not None and i == n:
            break
        out.append((x.clone(), y.clone()))
    return out


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x1, x2) and torch.equal(y1, y2)
                                    for (x1, y1), (x2, y2) in zip(a, b))


def test_same_seed_same_batches_any_workers(cifar10):
    ds = CIFAR(cifar10, "cifar10", True, transform=cifar_train())
    torch.manual_seed(123)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    first = _batches(make_loader(ds, 50, train=True, workers=0, seed=5, device="cpu"), 4)
    # Loading leaves the process's generators as they were.
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])
    torch.manual_seed(999)  # other consumers of the global RNG make no difference
    assert _same(first, _batches(make_loader(ds, 50, train=True, workers=0, seed=5,
                                             device="cpu"), 4))
    two = make_loader(ds, 50, train=True, workers=2, seed=5, device="cpu")
    assert _same(first, _batches(two, 4))
    two.sampler.set_epoch(0)  # the same epoch again, from the persistent workers
    assert _same(first, _batches(two, 4))
    assert not _same(first, _batches(make_loader(ds, 50, train=True, workers=0, seed=6,
                                                 device="cpu"), 4))


def test_epochs_differ_and_set_epoch_replays(cifar10):
    ds = CIFAR(cifar10, "cifar10", True, transform=cifar_train())
    loader = make_loader(ds, 100, train=True, workers=0, seed=1, device="cpu")
    epoch0, epoch1 = _batches(loader, 2), _batches(loader, 2)  # passes count as epochs
    assert not _same(epoch0, epoch1)
    fresh = make_loader(ds, 100, train=True, workers=0, seed=1, device="cpu")
    fresh.sampler.set_epoch(1)
    assert _same(epoch1, _batches(fresh, 2))
    # The same image in two epochs gets different augmentations.
    single = torch.utils.data.Subset(ds, [0] * 8)
    x = next(iter(make_loader(single, 8, train=True, workers=0, seed=0, device="cpu")))[0]
    assert len({tuple(v.flatten().tolist()) for v in x}) > 1


def test_shard_sampler_covers_every_index_once():
    for n in (0, 1, 5, 12, 13):
        for world in (1, 2, 3, 4):
            shards = [list(ShardSampler(n, world, r)) for r in range(world)]
            assert sorted(i for s in shards for i in s) == list(range(n))
            assert [len(ShardSampler(n, world, r)) for r in range(world)] == list(map(len, shards))
            assert max(map(len, shards)) - min(map(len, shards)) <= 1
    with pytest.raises(ValueError, match="rank"):
        ShardSampler(5, 2, 2)


def test_eval_loader_shards_and_train_loader_splits_ranks():
    data = torch.utils.data.TensorDataset(torch.arange(23))
    seen = []
    for rank in range(3):
        loader = make_loader(data, 4, train=False, workers=0, seed=0, device="cpu",
                             num_replicas=3, rank=rank)
        seen += [int(v) for (batch,) in loader for v in batch]
    assert sorted(seen) == list(range(23))
    per_rank = [[int(v) for (batch,) in make_loader(data, 3, train=True, workers=0, seed=4,
                                                    device="cpu", num_replicas=2, rank=r)
                 for v in batch] for r in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) == 9  # 11 per rank, 3 full batches
    assert not set(per_rank[0]) & set(per_rank[1])
    with pytest.raises(ValueError, match="fewer than one batch"):
        make_loader(data, 24, train=True, workers=0, seed=0, device="cpu")
    with pytest.raises(ValueError, match="batch_size"):
        make_loader(data, 0, train=True, workers=0, seed=0, device="cpu")
    loader = make_loader(data, 4, train=False, workers=0, seed=0, device="cpu")
    assert not loader.pin_memory and loader.dataset.dataset is data


# ---------------------------------------------------------------------------------------------
# Generators


def _tree_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


def test_generators_are_deterministic_and_atomic(tmp_path, monkeypatch):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        generate_cifar(tmp_path / name, "cifar100", 1, 1, seed=seed)
        generate_imagenet(tmp_path / name / "imagenet", 3, 2, 1, seed=seed)
    a, b, c = (_tree_bytes(tmp_path / n) for n in "abc")
    assert a == b and a.keys() == c.keys() and a != c
    assert sorted(k for k in a if "/" in k and not k.startswith("imagenet")) == [
        f"cifar-100-python/{MARKER}", "cifar-100-python/meta", "cifar-100-python/test",
        "cifar-100-python/train"]  # the released files, and the marker of a generated tree

    with pytest.raises(FileExistsError, match="overwrite"):
        generate_cifar(tmp_path / "a", "cifar100", 1, 1)
    generate_cifar(tmp_path / "a", "cifar100", 2, 1, overwrite=True)
    assert len(CIFAR(tmp_path / "a", "cifar100", True)) == 200

    calls = []

    def failing_render(*args):
        calls.append(1)
        if len(calls) > 5:
            raise RuntimeError("disk full")
        return np.zeros((args[1], args[2], 3), np.uint8)

    monkeypatch.setattr(gen, "render", failing_render)
    with pytest.raises(RuntimeError, match="disk full"):
        generate_imagenet(tmp_path / "half", 3, 2, 1)
    with pytest.raises(RuntimeError, match="disk full"):
        generate_cifar(tmp_path / "a", "cifar100", 1, 1, overwrite=True)
    assert not (tmp_path / "half").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # no temporaries
    assert len(CIFAR(tmp_path / "a", "cifar100", True)) == 200  # the old set is intact

    for bad in (dict(classes=0), dict(classes=gen.MAX_CLASSES + 1), dict(val_per_class=0),
                dict(sizes=[(4, 4)])):
        args = dict(classes=2, train_per_class=1, val_per_class=1) | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            generate_imagenet(tmp_path / "bad", **args)


def test_generated_classes_are_distinct():
    for n in (10, 100, gen.MAX_CLASSES):
        styles = [gen.class_style(k, n) for k in range(n)]
        assert len(set(styles)) == n
    assert len({gen.class_style(k, 10)[0] for k in range(10)}) == 10  # ten shapes
    # CIFAR-100 superclasses (fine // 5) share shape and texture and differ in hue.
    for c in range(20):
        styles = [gen.class_style(5 * c + i, 100) for i in range(5)]
        assert len({s[:2] for s in styles}) == 1 and len({s[2] for s in styles}) == 5


def test_cli(tmp_path, capsys):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.train.data.generate", "imagenet", "--out",
         str(tmp_path / "im"), "--classes", "2", "--train-per-class", "2",
         "--test-per-class", "1", "--sizes", "40x30", "--seed", "3"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "imagenet" in result.stdout and "Warning" not in result.stderr
    ds = ImageNet(tmp_path / "im", "val")
    assert len(ds) == 2 and {Image.open(p).size for p, _ in ds.samples} == {(40, 30)}

    assert gen.main(["cifar10", "--out", str(tmp_path / "c"), "--train-per-class", "1",
                     "--test-per-class", "1"]) == 0
    assert len(CIFAR(tmp_path / "c", "cifar10", True)) == 10
    assert gen.main(["cifar10", "--out", str(tmp_path / "c"), "--train-per-class", "1",
                     "--test-per-class", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gen.parse_args(["cifar10", "--out", "x", "--classes", "5"])
    assert "imagenet only" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Learnability


def test_generated_cifar10_is_learnable(cifar10):
    """A tiny CNN trained for about a second on generated CIFAR-10 is far above chance (10%)."""
    torch.manual_seed(0)
    train = CIFAR(cifar10, "cifar10", True, transform=cifar_eval())
    test = CIFAR(cifar10, "cifar10", False, transform=cifar_eval())
    model = torch.nn.Sequential(
        torch.nn.AvgPool2d(2),
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny convolutions: one thread is fastest, and fair to others
    try:
        start = time.perf_counter()
        for epoch in range(5):
            for x, y in make_loader(train, 50, train=True, workers=0, seed=epoch, device="cpu"):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        elapsed = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(x).argmax(1) == y).sum())
                          for x, y in make_loader(test, 100, train=False, workers=0, seed=0,
                                                  device="cpu"))
    finally:
        torch.set_num_threads(threads)
    accuracy = correct / len(test)
    assert accuracy > 0.5, (accuracy, elapsed)
