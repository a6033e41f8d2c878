"""Tensor memory of one training step, by kind, on real tensors or simulated on the meta device.

:class:`TensorMemoryTracker` is a ``TorchDispatchMode`` that follows every tensor storage a torch
operation creates, from the operation to the storage's release, and knows what each one is:

* ``parameters`` (and buffers), ``gradients``, ``optimizer state``, ``batch`` (input and
  targets): what the step starts with (:meth:`TensorMemoryTracker.register`);
* ``saved for backward``: storages autograd holds for the backward pass (saved-tensor hooks),
  from when an operation saves them until autograd lets them go;
* ``kept after the step``: storages the step creates that outlive it (the shared storages of a
  memory-efficient DenseNet, a first step's gradients);
* ``transient``: everything else (outputs not saved, backward buffers, temporaries).

The peak is that of the sum over live storages; ``peak_by_kind`` splits it at the moment it
was reached. The same step runs on real tensors (CPU or CUDA: what the operations allocate)
or on the ``meta`` device (:func:`step_memory` of a model and batch built there, as
:func:`experiments.measure.step.simulated_step_memory` does): there every operation computes
only shapes, dtypes and strides, so a paper-sized network's step takes seconds on a CPU and no
memory. The layers of this project run there through their operators' fake
implementations (:mod:`layers.ops`).

What tensor memory does not include, on either path, and a GPU does: the CUDA caching
allocator's rounding (to 512-byte blocks, 2 MiB segments) and fragmentation, workspaces that
kernels allocate inside one operation (cuDNN convolution workspaces, the buffers inside oneDNN
or numba kernels), and the CUDA context. ``torch.cuda.max_memory_allocated`` sees the rounding
and the workspaces (they go through the caching allocator), fragmentation shows only in the
memory it reserves, and the context in neither; :data:`NOT_COUNTED` says what is left out in
every record made from these numbers.
"""
import dataclasses
import functools
import weakref
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import fast_meta

PARAMETERS = "parameters"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer state"
BATCH = "batch"
SAVED = "saved for backward"
KEPT = "kept after the step"
TRANSIENT = "transient"
KINDS = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, BATCH, SAVED, KEPT, TRANSIENT)

#: The ``memory`` method of a step simulated on the meta device, in every record that has one
#: (:mod:`experiments.report.analysis`, which does not import torch, spells it out too).
SIMULATED_METHOD = "simulated_meta_device"
#: What tensor memory leaves out, for every record and claim made from it.
NOT_COUNTED = ("tensor memory only: not the CUDA caching allocator's rounding and "
               "fragmentation, not workspaces allocated inside an operation (cuDNN, oneDNN, "
               "numba kernels), not the CUDA context")


def storage_key(tensor):
    """An identity of ``tensor``'s storage, shared by its views (real, fake or meta)."""
    return tensor.untyped_storage()._cdata


class _Saved:
    """What a saved-tensor hook hands autograd: the tensor, in an object whose release tells
    the tracker that autograd no longer holds it."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class TensorMemoryTracker(TorchDispatchMode):
    """Live and peak bytes of tensor storages, by kind (see the module docstring).

    Use as ``with tracker, tracker.saving(): step()``; storages that exist before (parameters,
    gradients, ...) are added with :meth:`register` first. A storage counts from the operation
    that creates it until it is freed; outputs that share an input's storage (views, in-place
    and ``out=`` operations) are not new.
    """

    def __init__(self):
        super().__init__()
        self._live = {}  # storage key -> [weak reference, bytes, kind]
        self._holders = Counter()  # storage key -> saved-tensor holders alive
        self._events = []  # (key, kind, bytes): + allocated or relabelled to, - the reverse
        self.total = 0
        self.peak = 0
        self._peak_at = 0

    # ------------------------------------------------------------------ bookkeeping
    def _change(self, key, kind, delta):
        self._events.append((key, kind, delta))
        self.total += delta
        if self.total > self.peak:
            self.peak, self._peak_at = self.total, len(self._events)

    def _track(self, storage, key, kind):
        nbytes = storage.nbytes()
        self._live[key] = [weakref.ref(storage, functools.partial(self._free, key)), nbytes,
                           kind]
        self._change(key, kind, nbytes)

    def _free(self, key, _ref):
        entry = self._live.pop(key, None)
        if entry is not None:
            self._change(key, entry[2], -entry[1])

    def _relabel(self, key, kind):
        entry = self._live.get(key)
        if entry is not None and entry[2] != kind:
            self._change(key, entry[2], -entry[1])
            entry[2] = kind
            self._change(key, kind, entry[1])

    def register(self, tensors, kind):
        """Count the storages of ``tensors`` (``None`` entries skipped) as ``kind``, from now;
        a storage already counted keeps its first kind."""
        check_kind(kind)
        for tensor in tensors:
            if tensor is not None and storage_key(tensor) not in self._live:
                self._track(tensor.untyped_storage(), storage_key(tensor), kind)

    # ------------------------------------------------------------------ operations
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = fast_meta.call(func, args, kwargs or {})
        inputs = {storage_key(t) for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                key = storage_key(tensor)
                if key not in inputs and key not in self._live:
                    self._track(tensor.untyped_storage(), key, TRANSIENT)
        return out

    # ------------------------------------------------------------------ saved tensors
    def saving(self):
        """The saved-tensor hooks that mark what autograd keeps for backward."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor):
        key = storage_key(tensor)
        holder = _Saved(tensor)
        self._holders[key] += 1
        weakref.finalize(holder, self._unsave, key)
        entry = self._live.get(key)
        if entry is not None and entry[2] == TRANSIENT:
            self._relabel(key, SAVED)
        return holder

    @staticmethod
    def _unpack(holder):
        return holder.tensor

    def _unsave(self, key):
        self._holders[key] -= 1
        if self._holders[key] <= 0:
            del self._holders[key]
            entry = self._live.get(key)
            if entry is not None and entry[2] == SAVED:
                self._relabel(key, TRANSIENT)

    # ------------------------------------------------------------------ results
    def live_by_kind(self):
        """Bytes alive now, by kind."""
        return _sum_by_kind(self._events, {})

    def peak_by_kind(self):
        """Bytes alive at the peak, by kind; storages alive now that were transient or saved
        then count as ``kept after the step``."""
        kept = {key for key, entry in self._live.items() if entry[2] in (TRANSIENT, SAVED)}
        return _sum_by_kind(self._events[:self._peak_at], kept)


def check_kind(kind):
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not supported; allowed: {', '.join(KINDS)}")


def _sum_by_kind(events, kept):
    """Replay ``events``; the storages in ``kept`` count as :data:`KEPT` whatever their kind
    was then (unless it was one of the step's starting kinds)."""
    totals = dict.fromkeys(KINDS, 0)
    for key, kind, delta in events:
        if key in kept and kind in (TRANSIENT, SAVED):
            kind = KEPT
        totals[kind] += delta
    return totals


# --------------------------------------------------------------------------- one step
@dataclasses.dataclass
class StepMemory:
    """The tensor memory of one training step (bytes)."""

    peak_bytes: int
    peak_by_kind: dict
    start_bytes: int
    end_bytes: int
    simulated: bool

    def record(self, prefix="tensor_"):
        """Flat fields for an artifact: ``<prefix>peak_bytes``, one ``<prefix>peak_<kind>_bytes``
        per kind, the method and what it does not count."""
        fields = {f"{prefix}peak_bytes": self.peak_bytes,
                  f"{prefix}start_bytes": self.start_bytes,
                  f"{prefix}end_bytes": self.end_bytes}
        for kind, value in self.peak_by_kind.items():
            fields[f"{prefix}peak_{kind.replace(' ', '_')}_bytes"] = value
        fields[f"{prefix}memory_method"] = (SIMULATED_METHOD if self.simulated
                                            else "tracked_real_step")
        fields[f"{prefix}memory_not_counted"] = NOT_COUNTED
        return fields


def optimizer_state(optimizer):
    """Every tensor of ``optimizer``'s state (momentum buffers, ...)."""
    return [value for state in optimizer.state.values() for value in state.values()
            if isinstance(value, torch.Tensor)]


def training_state_tracker(model, batch, optimizer=None):
    """A :class:`TensorMemoryTracker` that already counts what a training step starts with:
    ``model``'s parameters and buffers, their gradients, ``optimizer``'s state (if given) and
    the tensors of ``batch``, each as its kind."""
    params = list(model.parameters())
    tracker = TensorMemoryTracker()
    tracker.register([*params, *model.buffers()], PARAMETERS)
    tracker.register([p.grad for p in params], GRADIENTS)
    if optimizer is not None:
        tracker.register(optimizer_state(optimizer), OPTIMIZER_STATE)
    tracker.register(batch, BATCH)
    return tracker


def step_memory(model, batch, loss, optimizer):
    """Track one training step: ``optimizer.zero_grad(set_to_none=False)``, ``loss(model,
    *batch).backward()``, ``optimizer.step()``; return its :class:`StepMemory`.

    ``batch`` is a tuple of tensors (input, targets). First every parameter gets a zero
    gradient and the optimizer takes one step, untracked, so that gradients and optimizer state
    exist as in any step after the first (the steady state, which a budget must hold). On the
    meta device (``simulated`` in the result) nothing is computed.
    """
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
    optimizer.step()
    tracker = training_state_tracker(model, batch, optimizer)
    start = tracker.total
    with tracker, tracker.saving():
        optimizer.zero_grad(set_to_none=False)
        loss(model, *batch).backward()
        optimizer.step()
    simulated = any(t.is_meta for t in batch)
    return StepMemory(tracker.peak, tracker.peak_by_kind(), start, tracker.total, simulated)


def cap_cuda_memory(fraction, device):
    """Cap this process's CUDA caching allocator on ``device`` at ``fraction`` of the GPU
    (``torch.cuda.set_per_process_memory_fraction``), so that a larger GPU answers out of
    memory where a smaller one would.

    ``device`` may have no index (``torch.device("cuda")``, as ``--device cuda`` gives it): the
    setter takes only an index or an indexed device, so the current device's index is used.
    """
    index = torch.cuda.current_device() if device.index is None else device.index
    torch.cuda.set_per_process_memory_fraction(fraction, index)


__all__ = ["TensorMemoryTracker", "StepMemory", "step_memory", "training_state_tracker",
           "cap_cuda_memory", "optimizer_state", "KINDS", "NOT_COUNTED", "SIMULATED_METHOD",
           "storage_key"]
