"""What autograd keeps for backward after one forward, storage by storage.

:func:`saved_storages` runs ``module(x)`` under ``torch.autograd.graph.saved_tensors_hooks``
and returns the size of every distinct storage a saved tensor lives in (a storage saved by
several operations, such as an in-place output that the next layer saves too, counts once).
The module's parameters and buffers are left out: they are resident whatever the strategy.
"""
import torch


def _storage_key(tensor):
    return tensor.device, tensor.untyped_storage().data_ptr()


def saved_storages(module, x):
    """``[nbytes, ...]`` (largest first) of the distinct storages saved by ``module(x)``."""
    resident = {_storage_key(t) for t in (*module.parameters(), *module.buffers())}
    saved = {}

    def pack(tensor):
        key = _storage_key(tensor)
        if key not in resident:
            saved[key] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = module(x)
    del out  # frees the graph and what it saved
    return sorted(saved.values(), reverse=True)


__all__ = ["saved_storages"]
