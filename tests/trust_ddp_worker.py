"""One rank of ``test_trust_gradients.test_ddp_with_a_kept_gradient``: ``DistributedDataParallel``
over gloo around a :class:`trust_harness.ConvNormHead` with an in-place norm, a tensor hook
keeping the norm output's gradient (as Grad-CAM does). Compares, on its own batch, the kept
gradient and the input gradient with the composite reference's, and the parameter gradients
(averaged over the ranks by DDP) with the reference's averaged likewise; writes
``rank<r>.json`` with the largest error of each.

Run as ``python trust_ddp_worker.py RANK WORLD_SIZE INIT_METHOD OUT_DIR``.
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import layers  # noqa: E402
from trust_harness import inputs, keep, layer_net  # noqa: E402


def step(model, norm, x, grad):
    """Input gradient and the norm output's gradient as a hook kept it."""
    seen = {}

    def hook(module, args, out):
        out.register_hook(keep(seen, "norm output grad"))
    norm.register_forward_hook(hook)
    x = x.clone().requires_grad_()
    model(x).backward(grad)
    return x.grad, seen["norm output grad"]


def main(rank, world_size, init_method, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    net, reference = layer_net(layers.InPlaceABN)
    x, grad = inputs(seed=10 + rank)
    got = step(DistributedDataParallel(net), net.norm, x, grad)
    want = step(reference, reference.norm, x, grad)
    errors = {name: (a - b).abs().max().item()
              for name, a, b in zip(("input grad", "kept grad"), got, want)}
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        averaged = q.grad.clone()
        dist.all_reduce(averaged)
        errors[f"grad {name}"] = (p.grad - averaged / world_size).abs().max().item()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(errors))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
