"""One rank of the InPlaceABNSync test (``tests/test_sync.py``), and the data both share.

Run as ``python sync_worker.py RANK WORLD_SIZE INIT_METHOD OUT_DIR``: joins a gloo process group,
runs every case of :data:`CASES` for two forward/backward iterations on this rank's slice of the
batch, and saves the results to ``OUT_DIR/rank{RANK}.pt`` for the parent to compare against a
single process on the whole batch.

The cases run InPlaceABNSync over three groups, created in the same order on every rank:

* ``world``: ``group=None`` (the default world group);
* ``subgroup``: ``dist.new_group([0, 1])``, the same ranks as the world as a separate group;
* ``self``: a group holding only this rank (``dist.new_group([rank])``), so nothing is
  synchronised and the layer must act as InPlaceABN on the rank's slice alone; this shows the
  ``group`` argument is honoured rather than replaced by the world.

The world group also runs every case on bfloat16 data with float32 parameters (``bfloat16``).

It also trains each model of :data:`DDP_MODELS`, converted with
``layers.convert_sync_batchnorm(..., convert_batchnorm=True)`` and wrapped in
``DistributedDataParallel``, for two SGD steps on its slice of a batch.
"""
import datetime
import itertools
import os
import sys

import torch
import torch.nn as nn

C = 4
SPATIAL = (5, 6)
BATCH_SPLIT = (3, 5)  # per-rank batch sizes: unequal on purpose
#: Extreme splits run over the world group: one sample (one value per channel and spatial
#: position) on a rank, and an empty rank, which contributes nothing but must not fail.
EXTREME_SPLITS = ((1, 7), (0, 8))
ITERATIONS = 2
EPS = 1e-5
MOMENTUM = 0.1
DTYPE = torch.float64

VARIANTS = ("I", "II")
ACTIVATIONS = (("leaky_relu", 0.01), ("elu", 1.0))
GROUPS = ("world", "subgroup", "self")
CASES = tuple(itertools.product(VARIANTS, ACTIVATIONS))

RECORDED = ("output", "input_grad", "weight_grad", "bias_grad", "running_mean", "running_var",
            "num_batches_tracked")


def make_data():
    """Seeded ``(weight, bias, inputs, incoming gradients)``, the same in every process.

    ``weight`` has mixed signs (so the ``|weight| + eps`` scale and its ``sign`` gradient are
    exercised) and the input channels have different means and spreads.
    """
    g = torch.Generator().manual_seed(1234)
    n = sum(BATCH_SPLIT)
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=DTYPE)
    weight = (torch.rand(C, generator=g, dtype=DTYPE) + 0.3) * signs
    bias = torch.randn(C, generator=g, dtype=DTYPE)
    scale = torch.tensor([1.0, 2.5, 0.5, 1.5], dtype=DTYPE).view(1, C, 1, 1)
    shift = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=DTYPE).view(1, C, 1, 1)
    xs = [torch.randn(n, C, *SPATIAL, generator=g, dtype=DTYPE) * scale + shift
          for _ in range(ITERATIONS)]
    dzs = [torch.randn(n, C, *SPATIAL, generator=g, dtype=DTYPE) for _ in range(ITERATIONS)]
    return weight, bias, xs, dzs


def rank_slice(rank, split=BATCH_SPLIT):
    start = sum(split[:rank])
    return slice(start, start + split[rank])


def make_layer(cls, variant, activation, activation_param, weight, bias, **kwargs):
    layer = cls(C, eps=EPS, momentum=MOMENTUM, activation=activation,
                activation_param=activation_param, variant=variant, dtype=DTYPE, **kwargs)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    layer.train()
    return layer


def run_layer(layer, xs, dzs):
    """Forward + backward per iteration on a non-leaf copy of each input; the recorded values.

    Gradients are cleared between iterations, so each iteration's are its own.
    """
    history = []
    for x, dz in zip(xs, dzs):
        leaf = x.clone().requires_grad_()
        inp = leaf * 1  # a non-leaf: the in-place layer refuses leaves
        out = layer(inp)
        output = out.detach().clone()
        out.backward(dz)
        history.append(dict(
            output=output,
            input_grad=leaf.grad.detach().clone(),
            weight_grad=layer.weight.grad.detach().clone(),
            bias_grad=layer.bias.grad.detach().clone(),
            running_mean=layer.running_mean.detach().clone(),
            running_var=layer.running_var.detach().clone(),
            num_batches_tracked=layer.num_batches_tracked.detach().clone(),
        ))
        layer.zero_grad(set_to_none=True)
    return history


# --------------------------------------------------------------------------- DDP models
#: Models trained with DistributedDataParallel after ``layers.convert_sync_batchnorm``: a
#: sequence of every convertible kind (InPlaceABN, BN + LeakyReLU after a convolution,
#: ABN with relu) and a DenseNet-BC with InPlace-ABN in each implementation.
DDP_MODELS = ("sequential", "densenet-naive", "densenet-shared", "densenet-shared_inplace",
              "densenet-checkpoint")
DDP_CLASSES = 5
DDP_INPUT = (3, 8, 8)
DDP_LR = 0.1


def make_ddp_model(name):
    """The model ``name`` before conversion, float64, with seeded weights and statistics."""
    import layers

    torch.manual_seed(7)
    if name == "sequential":
        model = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), layers.InPlaceABN(4, activation="elu", variant="I"),
            nn.Conv2d(4, 6, 1), nn.BatchNorm2d(6), nn.LeakyReLU(0.1),
            nn.Conv2d(6, 6, 1), layers.ABN(6, activation="relu"),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, DDP_CLASSES))
    else:
        model = layers.densenet_bc(10, 4, num_classes=DDP_CLASSES, norm="iabn",
                                   impl=name.split("-")[1])
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, layers.NORM_TYPES):
                c = module.num_features
                signs = torch.where(torch.rand(c, generator=generator) < 0.3, -1.0, 1.0)
                module.weight.copy_(signs * (0.5 + torch.rand(c, generator=generator)))
                module.bias.copy_(torch.randn(c, generator=generator) * 0.2)
    return model.double()


def make_ddp_data():
    """Seeded inputs and gradients of the outputs, one per iteration, for the whole batch."""
    g = torch.Generator().manual_seed(99)
    n = sum(BATCH_SPLIT)
    xs = [torch.randn(n, *DDP_INPUT, generator=g, dtype=DTYPE) for _ in range(ITERATIONS)]
    dzs = [torch.randn(n, DDP_CLASSES, generator=g, dtype=DTYPE) for _ in range(ITERATIONS)]
    return xs, dzs


def train_steps(model, xs, dzs, loss_scale=1.0):
    """SGD steps on ``sum(model(x) * dz) * loss_scale``; the recorded values per step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=DDP_LR)
    history = []
    for x, dz in zip(xs, dzs):
        leaf = x.clone().requires_grad_()
        out = model(leaf)
        ((out * dz).sum() * loss_scale).backward()
        record = dict(output=out.detach().clone(), input_grad=leaf.grad.clone())
        record.update({f"grad {n}": p.grad.clone() for n, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        record.update({f"param {n}": p.detach().clone() for n, p in model.named_parameters()})
        record.update({f"buffer {n}": b.clone() for n, b in model.named_buffers()})
        history.append(record)
    return history


def run_ddp(rank):
    """This rank's slice of each DDP model's training (parameter names without ``module.``)."""
    from torch.nn.parallel import DistributedDataParallel

    import layers

    xs, dzs = make_ddp_data()
    part = rank_slice(rank)
    results = {}
    for name in DDP_MODELS:
        model = layers.convert_sync_batchnorm(make_ddp_model(name), convert_batchnorm=True)
        types = sorted({type(m).__name__ for m in model.modules()
                        if isinstance(m, layers.NORM_TYPES)})
        ddp = DistributedDataParallel(model)
        history = train_steps(ddp, [x[part] for x in xs], [dz[part] for dz in dzs])
        results[name] = dict(types=types, history=[
            {key.replace("module.", "", 1): value for key, value in step.items()}
            for step in history])
    return results


def main(rank, world_size, init_method, out_dir):
    import torch.distributed as dist

    import layers

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        # new_group must be called by every rank, in the same order, for every group.
        groups = {"world": None, "subgroup": dist.new_group([0, 1])}
        own = [dist.new_group([r]) for r in range(world_size)]
        groups["self"] = own[rank]

        weight, bias, xs_full, dzs_full = make_data()
        part = rank_slice(rank)
        xs = [x[part] for x in xs_full]
        dzs = [dz[part] for dz in dzs_full]

        results = {}
        for group_name in GROUPS:
            for variant, (activation, param) in CASES:
                layer = make_layer(layers.InPlaceABNSync, variant, activation, param, weight,
                                   bias, group=groups[group_name])
                results[(group_name, variant, activation)] = run_layer(layer, xs, dzs)
        for split in EXTREME_SPLITS:
            part = rank_slice(rank, split)
            for variant, (activation, param) in CASES:
                layer = make_layer(layers.InPlaceABNSync, variant, activation, param, weight,
                                   bias)
                results[(f"split{split}", variant, activation)] = run_layer(
                    layer, [x[part] for x in xs_full], [dz[part] for dz in dzs_full])
        # bfloat16 data with float32 parameters (as under autocast), over the world group.
        for variant, (activation, param) in CASES:
            layer = make_layer(layers.InPlaceABNSync, variant, activation, param, weight,
                               bias).float()
            results[("bfloat16", variant, activation)] = run_layer(
                layer, [x.bfloat16() for x in xs], [dz.bfloat16() for dz in dzs])
        results["world_group_is_world"] = (
            layers.InPlaceABNSync(C)._group() is dist.group.WORLD)
        results["ddp"] = run_ddp(rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
