"""Cross-rank reductions of InPlace-ABN^sync over a ``torch.distributed`` process group.

Both functions are the identity when ``group`` is ``None`` or ``torch.distributed`` is not
initialised, so the synchronised layer falls back to the single-process computation.
"""
import torch
import torch.distributed as dist


def active(group):
    """Whether reductions over ``group`` involve other ranks."""
    if group is None or not dist.is_available() or not dist.is_initialized():
        return False
    size = dist.get_world_size(group)
    if size < 0:
        raise ValueError(f"group: rank {dist.get_rank()} is not a member of this process group")
    return size > 1


def combine_moments(moments, count, group):
    """Global per-channel ``(mean, M2, count)`` from each rank's ``[mean, M2]`` and count.

    Ranks may hold different numbers of elements; the combination (Chan et al.) weights each
    rank by its count, so the result equals the statistics of the concatenated batch.
    """
    mean, m2 = moments
    if not active(group):
        return mean, m2, count
    local = torch.cat([torch.full_like(mean, float(count))[None], moments])
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    counts, means, m2s = torch.stack(gathered).unbind(1)
    total = counts.sum(0)
    global_mean = (counts * means).sum(0) / total
    global_m2 = (m2s + counts * (means - global_mean) ** 2).sum(0)
    return global_mean, global_m2, int(total[0].item())


def all_reduce_sum(tensor, group):
    """Sum ``tensor`` over the ranks of ``group``, in place; returns it."""
    if active(group):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor
