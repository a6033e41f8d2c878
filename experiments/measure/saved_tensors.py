"""What autograd keeps for backward after one forward, storage by storage.

:func:`saved_storages` runs ``module(x)`` under ``torch.autograd.graph.saved_tensors_hooks``
and returns the size (:func:`saved_storage_records`: and the shape) of every distinct storage
a saved tensor lives in (a storage saved by several operations, such as an in-place output
that the next layer saves too, counts once).
The module's parameters and buffers are left out: they are resident whatever the strategy.
"""
import torch


def _storage_key(tensor):
    return tensor.device, tensor.untyped_storage().data_ptr()


def saved_storage_records(module, x):
    """``[(nbytes, shape, dtype), ...]`` (largest first) of the distinct storages saved by
    ``module(x)``, each with the shape and dtype of the first saved tensor that lives in it."""
    resident = {_storage_key(t) for t in (*module.parameters(), *module.buffers())}
    saved = {}

    def pack(tensor):
        key = _storage_key(tensor)
        if key not in resident and key not in saved:
            saved[key] = (tensor.untyped_storage().nbytes(), tuple(tensor.shape), tensor.dtype)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = module(x)
    del out  # frees the graph and what it saved
    return sorted(saved.values(), key=lambda record: record[0], reverse=True)


def saved_storages(module, x):
    """``[nbytes, ...]`` (largest first) of the distinct storages saved by ``module(x)``."""
    return [nbytes for nbytes, _, _ in saved_storage_records(module, x)]


__all__ = ["saved_storage_records", "saved_storages"]
