"""Autograd functions behind the ABN modules: ``abn`` and ``inplace_abn``.

``abn`` is batch normalization followed by an activation, out of place: it saves its input
``x`` and its output ``z`` for backward, as standard BN + activation does (Fig. 2(a) of the
InPlace-ABN paper).

``inplace_abn`` writes ``z = act(BN(x))`` into the storage of ``x`` and saves only ``z`` and
per-channel vectors (Algorithm 1). Its backward recovers what it needs from ``z`` by inverting
the activation (Algorithm 2), in one of the paper's two ways:

* ``variant="I"`` (Fig. 2(d)): ``x_hat = (y - beta) / gamma`` is recovered per element and the
  gradients are taken in ``x_hat``;
* ``variant="II"`` (Fig. 2(e), §3.3; the default): the gradients are written directly in
  ``y``, which folds the inversion of the affine step into per-channel constants. Both make
  the same passes over memory; ``python -m experiments.bench_kernels`` times the two.

Scale parametrization (``scale_mode``): with ``"abs"`` (the default, as in the authors' release)
the per-channel scale is ``gamma = |weight| + eps``, so it can always be inverted; the gradient
of ``weight`` is then ``sign(weight) * dL/dgamma``. With ``"bn"`` the scale is ``gamma = weight``
exactly as in ``nn.BatchNorm2d``, so weights trained with standard BN load unchanged; an
in-place layer then refuses (without touching its input) to run a differentiable forward in
which some ``|weight| < eps``, because such a scale cannot be inverted reliably in backward.
On the CPU kernels the check is immediate; on the CUDA kernels it runs on the device, without
a host synchronisation, and the error comes when the host can read the device's result: in the
backward or a later forward, or at once by :func:`check_pending` (see :class:`_DeviceCheck`).

With ``group`` set and ``torch.distributed`` initialised, ``inplace_abn`` (and ``abn``, out of
place) combines the batch statistics and the two backward reductions across the ranks of
``group``, weighted by each rank's element count, which gives the exact full-batch result
whatever the per-rank batch sizes (InPlace-ABN^sync). Each rank's ``weight``/``bias`` gradient
is its own share of the full-batch gradient, as with ``nn.SyncBatchNorm``: summing them over
ranks gives the full-batch gradient.

Dtypes: the input may be float64, float32, float16 or bfloat16. 16-bit inputs are read and
written as 16 bits and computed in float32 (:mod:`layers.kernels.codecs`), as
``nn.BatchNorm2d`` does under ``torch.autocast``: the output and the input gradient have the
input's dtype, the statistics and the backward reductions accumulate in float32 blocks summed
in float64, and the weight, bias and running statistics keep their own dtype (float32 in a
model trained under autocast). Layouts: contiguous and channels-last inputs are read in place
(the kernels' ``(N, C, S)`` and ``(M, C)`` views); any other layout, and an incoming gradient
laid out unlike the output, is copied once into a canonical view.

Two paths run the same kernels (:func:`whole_steps` picks one). Normally the forward and the
backward are one call each into the kernel backend (``forward_step``, ``backward_step``): the
kernels and the per-channel arithmetic of :mod:`layers.kernels.per_channel` back to back, as
compiled loops on the CPU and as kernels of their own on CUDA (2 to 4 launches each, no torch
operator in between). Synchronised layers, and layers whose per-channel tensors are not of one
dtype, float32 or float64, call the kernels one by one with the per-channel arithmetic as torch
operators between them (the reductions summed over the ranks there). Either way every call
goes through a custom operator of :mod:`layers.ops` (directly, without the dispatcher, on
plain eager tensors): the operators' fake implementations let these functions run on
``FakeTensorMode`` and ``meta`` tensors (shapes only) and under
``torch.compile(fullgraph=True)``. The value checks that need data (the ``scale_mode="bn"``
check above) are skipped on tensors without values and are operations of the graph under
``torch.compile``. An autograd function's incoming gradient is never written over (hooks may
hold it); in-place layers run on a copy of their input where PyTorch would otherwise lose a
gradient (:func:`_runs_on_a_copy`).
"""
import functools
import inspect
import math
import threading
import typing
import weakref

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.autograd import function as autograd_function
from torch.nn.modules._functions import BackwardHookFunction
from torch.utils.checkpoint import CheckpointFunction
from torch.utils.weak import WeakIdKeyDictionary

from . import distributed, ops
from .kernels import (STEP_VECTOR_DTYPES, backend, codecs, common, per_channel,
                      step_vector_dtype)

#: Activations of ``abn``; name -> (kernel code, default parameter).
ACTIVATIONS = {
    "leaky_relu": (common.ACT_LEAKY_RELU, 0.01),
    "elu": (common.ACT_ELU, 1.0),
    "identity": (common.ACT_IDENTITY, 0.0),
    "relu": (common.ACT_LEAKY_RELU, 0.0),  # leaky ReLU of slope 0
}
#: Activations of ``inplace_abn``: those that can be inverted.
INVERTIBLE_ACTIVATIONS = ("leaky_relu", "elu", "identity")
VARIANTS = ("I", "II")
SCALE_MODES = ("abs", "bn")
#: Input dtypes; float16 and bfloat16 compute in float32 (see the module docstring).
DTYPES = tuple(codecs.COMPUTE_DTYPES)


# --------------------------------------------------------------------------- validation
def check_activation(activation, activation_param, inplace):
    """Validate an activation name and parameter; return ``(kernel code, parameter)``."""
    allowed = INVERTIBLE_ACTIVATIONS if inplace else tuple(ACTIVATIONS)
    if activation not in allowed:
        reason = " (relu is not invertible: use leaky_relu)" if activation == "relu" else ""
        raise ValueError(
            f"activation={activation!r} is not supported{reason}; allowed: {', '.join(allowed)}"
        )
    code, default = ACTIVATIONS[activation]
    if activation == "relu" and activation_param not in (None, 0, 0.0):
        raise ValueError(f"activation_param={activation_param} for relu: relu takes none")
    param = default if activation_param is None else float(activation_param)
    if not -math.inf < param < math.inf:  # not math.isfinite: torch.compile cannot trace it
        raise ValueError(f"activation_param={activation_param} must be finite")
    if activation == "leaky_relu" and inplace and not param > 0:
        raise ValueError(
            f"activation_param={param} for leaky_relu is not invertible in place: "
            "the slope must be > 0"
        )
    if activation == "leaky_relu" and not param >= 0:
        # The backward kernels tell the branch from the output's sign, which a negative slope
        # flips for negative inputs.
        raise ValueError(f"activation_param={activation_param} for leaky_relu: the slope must "
                         "be >= 0")
    if activation == "elu" and not param > 0:
        raise ValueError(f"activation_param={param} for elu: alpha must be > 0")
    return code, param


def check_choice(name, value, allowed):
    """Raise a ValueError naming ``name`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; allowed: {', '.join(allowed)}")


def _check_input(x, weight, bias, running_mean, running_var, training, eps, momentum, group):
    """:func:`check_arguments` of a call on the tensor ``x``."""
    if not isinstance(x, torch.Tensor):
        raise _dtype_error(type(x).__name__)
    check_arguments(x.shape, x.dtype, x.device, weight, bias, running_mean, running_var,
                    training, eps, momentum, group)


def _dtype_error(got):
    allowed = ", ".join(str(d).replace("torch.", "") for d in DTYPES)
    return TypeError(f"input must be a tensor of one of {allowed}, got {got}")


def check_arguments(shape, dtype, device, weight, bias, running_mean, running_var, training,
                    eps, momentum, group=None):
    """Refuse, before anything is written, the arguments of a BN + activation call on an
    input of ``shape``, ``dtype`` and on ``device``: the per-channel tensors' shapes, devices
    and dtypes, ``eps``, ``momentum``, and a training call with one value per channel (checked
    here unless ``group`` synchronises: the global count is known once the ranks have combined
    theirs). The shared-storage routes check the concatenation they never materialise."""
    if dtype not in DTYPES:
        raise _dtype_error(dtype)
    if len(shape) < 2 or shape[1] < 1:
        raise ValueError(f"input must have shape (N, C, *) with C >= 1, got {tuple(shape)}")
    channels = shape[1]
    for name, t in (("weight", weight), ("bias", bias),
                    ("running_mean", running_mean), ("running_var", running_var)):
        if t is None:
            continue
        if t.shape != (channels,):
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}, expected ({channels},) for an input "
                f"with {channels} channels (input shape {tuple(shape)})"
            )
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, input on {device}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean and running_var must be given together")
    if not training and running_mean is None:
        raise ValueError("training=False needs running_mean and running_var")
    if not 0 < eps < math.inf:
        raise ValueError(f"eps={eps} must be finite and > 0")
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"momentum={momentum} must lie in [0, 1]")
    if training and not distributed.active(group):
        _check_count(math.prod(shape) // channels, shape)


def _check_inplace_input(x, weight, eps, scale_mode):
    """Refuse in-place calls whose gradient would be wrong, before ``x`` is overwritten.

    Returns ``(check, accepted)``: ``check`` the :class:`_DeviceCheck` of the
    ``|weight| >= eps`` check where it runs on the device (the forward must then guard its
    writes with its flag), else ``None``; ``accepted`` ``None`` where every check ran on the
    host, else a 0-d bool tensor (on the device, or of the graph under ``torch.compile``) that
    is ``True`` where the call is accepted, which the module's batch count adds instead of 1.
    """
    # A compiled graph is functionalized (AOTAutograd turns the in-place write into a new
    # value), so the hazards of an eager in-place write checked here do not arise there.
    eager = not torch.compiler.is_compiling()
    if eager:
        _check_writable(x)
    if not torch.is_grad_enabled():
        return None, None
    if x.requires_grad and eager:
        if x.is_leaf and not _in_reentrant_recomputation():
            raise ValueError(
                "input is a leaf tensor that requires grad: an in-place layer would overwrite "
                "it; pass a non-leaf tensor (e.g. the output of a convolution) or input.clone()"
            )
        base = x._base
        if base is not None and base.is_leaf and base.requires_grad:
            raise ValueError(
                "input is a view of a leaf tensor that requires grad (a slice of a parameter, "
                "say): an in-place layer would overwrite it; pass input.clone()"
            )
        if isinstance(x.grad_fn, _InPlaceABN._backward_cls):
            raise ValueError(
                "input is the output of another in-place ABN layer, which saved it for its "
                "backward; overwriting it would corrupt that layer's gradient: pass "
                "input.clone()"
            )
    differentiable = x.requires_grad or (weight is not None and weight.requires_grad)
    if not (differentiable and scale_mode == "bn" and weight is not None):
        return None, None
    if eager and has_values(weight) and getattr(backend(x), "DEVICE_GUARD", False):
        _settle_ready(weight)  # an earlier refusal the host can read now is raised now
        check = _DeviceCheck(weight, eps)
        return check, check.flag.logical_not().reshape(())
    return None, check_scale_where_readable(weight, eps)


def _runs_on_a_copy(x, weight, bias):
    """Whether an in-place call must run on a copy of its input ``x`` to keep its gradients
    right: where PyTorch itself wraps or traces ``x`` in a way that an in-place autograd
    function breaks.

    * Under ``torch.compile`` (a differentiable call): AOTAutograd mishandles the autograd of
      an in-place autograd function whose input is a graph input that requires grad (the
      compiled backward passes the incoming gradient on to that input unchanged). On a copy
      made in the graph it is exact, as for a layer whose input is made in the same graph;
      a compiled graph plans its own memory anyway.
    * Under a full backward hook on the layer (``register_full_backward_hook``): the module's
      input is then the output of torch's hook function, which refuses an in-place write.
    * Inside ``torch.utils.checkpoint(..., use_reentrant=False)``: the checkpoint recomputes
      the forward from the same input in backward, so that input must not be overwritten.
    * A view with tensor hooks (``register_hook``): an in-place write to a view moves its
      autograd history to its base, and the hooks registered on it would never run.
    * Grad mode off and an input that requires grad: it belongs to a graph that may read it
      again. ``torch.utils.checkpoint(..., use_reentrant=True)`` runs its first forward so and
      keeps that input for its recomputation.
    * That recomputation (run in the checkpoint's backward): its input is a detached leaf
      sharing the kept input's memory, which a second backward (``retain_graph=True``) reads
      again.

    The copy costs one pass over the input and keeps it: the call is then out of place.
    """
    if torch.compiler.is_compiling():
        return torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, weight, bias))
    return (isinstance(x.grad_fn, BackwardHookFunction._backward_cls)
            or (x._base is not None and bool(x._backward_hooks)) or _in_checkpoint()
            or (x.requires_grad and not torch.is_grad_enabled())
            or (x.is_leaf and _in_reentrant_recomputation()))


def _in_reentrant_recomputation():
    """Whether the current forward is the recomputation of a reentrant
    ``torch.utils.checkpoint``, which runs inside the backward of its autograd function."""
    return isinstance(torch._C._current_autograd_node(), CheckpointFunction._backward_cls)


#: The saved-tensor hooks that ``torch.utils.checkpoint(use_reentrant=False)`` installs while
#: it runs a forward and while it recomputes it (their pack functions' qualified names).
_CHECKPOINT_HOOKS = ("_checkpoint_hook.", "_recomputation_hook.")


def _in_checkpoint():
    """Whether the current forward runs inside a non-reentrant ``torch.utils.checkpoint``
    (first run or recomputation), told by the saved-tensor hooks it installs."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return hooks is not None and getattr(hooks[0], "__qualname__", "").startswith(
        _CHECKPOINT_HOOKS)


def _check_writable(x):
    """Refuse an input that an in-place write would corrupt or that torch forbids writing:
    an inference tensor outside inference mode, or one whose elements share memory (an
    expanded or ``as_strided`` tensor), where one output would overwrite another."""
    if x.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(
            "input is an inference tensor (made under torch.inference_mode) and an in-place "
            "layer cannot write it outside inference mode; pass input.clone()"
        )
    if _overlapping(x):
        raise ValueError(
            f"input has overlapping memory (shape {tuple(x.shape)}, strides {x.stride()}: "
            "an expanded or as_strided tensor) and an in-place layer would write several "
            "outputs to one place; pass input.clone()"
        )


def _overlapping(x):
    """Whether two elements of ``x`` may share memory: its dimensions of size > 1, taken by
    increasing stride, must each step over all the memory that the smaller ones span (a
    sufficient test, exact for every layout that views, slices and permutes make). A
    contiguous tensor, the common input, is answered without sorting its strides: this runs
    in every in-place forward."""
    if x.is_contiguous():
        return False
    span = 1
    for stride, size in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz > 1):
        if stride < span:
            return True
        span = stride * size
    return False


def has_values(tensor):
    """Whether ``tensor`` holds data: not a ``FakeTensorMode`` tensor, not on ``meta``."""
    return not (tensor.is_meta or is_fake(tensor))


def check_invertible_scale(weight, eps):
    """Raise unless every ``|weight| >= eps`` (``scale_mode="bn"``, in place, differentiable).

    The immediate check of the CPU kernels, where reading the weight costs no synchronisation.
    A NaN weight fails it too.
    """
    magnitude = weight.detach().abs()
    if not bool(magnitude.ge(eps).all()):
        raise _scale_error(magnitude, eps)


def check_scale_where_readable(weight, eps):
    """:func:`check_invertible_scale` wherever ``weight``'s values can be read: as an operation
    of the graph under ``torch.compile``, on the host for tensors with values, not at all on
    fake or meta tensors (shapes only).

    Returns ``None``, or under ``torch.compile`` the check's result as a 0-d bool tensor of the
    graph (``True``: accepted), for whatever the call writes outside the layer's kernels (the
    module's batch count) to depend on: the compiler may schedule such a write before the
    assertion, and one that adds the result instead of 1 writes nothing when it fails."""
    if torch.compiler.is_compiling():
        return _assert_invertible_scale_in_graph(weight, eps)
    if has_values(weight):
        check_invertible_scale(weight, eps)
    return None


def _assert_invertible_scale_in_graph(weight, eps):
    """:func:`check_invertible_scale` as an operation of a graph being compiled, which
    ``torch.compile`` traces (a test on the host would need the weight's values while
    tracing, which it has not): the compiled step raises a ``RuntimeError`` when it runs
    with some ``|weight| < eps``, ahead of the layer's kernels in the graph. Returns the
    checked condition (:func:`check_scale_where_readable`)."""
    accepted = weight.detach().abs().ge(eps).all()
    torch._assert_async(
        accepted,
        f"scale_mode='bn' needs |weight| >= eps={eps} to invert the scale in backward, but "
        "|weight| < eps in some channel of weight; use scale_mode='abs' or re-initialise "
        "weight")
    return accepted


def _scale_error(magnitude, eps, note=""):
    """The error of a failed check: ``eps``, the failing channels of ``weight`` and the
    smallest ``|weight|`` (``magnitude``: ``|weight|`` as checked)."""
    bad = torch.nonzero(~magnitude.ge(eps)).flatten().tolist()
    shown = ", ".join(str(c) for c in bad[:8]) + (f", ... ({len(bad)} in all)"
                                                  if len(bad) > 8 else "")
    smallest = magnitude.min().item()
    return ValueError(
        f"scale_mode='bn' needs |weight| >= eps={eps} to invert the scale in backward, but "
        f"|weight| < eps in channel(s) {shown} of weight (shape {tuple(magnitude.shape)}): "
        f"min |weight| = {smallest:.3g}; use scale_mode='abs' or re-initialise weight{note}"
    )


class _DeviceCheck:
    """``|weight| >= eps`` of one in-place forward, evaluated on the device (CUDA kernels).

    The host never waits for it in the forward: ``flag`` (a ``(1,)`` bool on the device,
    ``True``: refused) is computed by torch ops on the current stream before the kernels, which
    read it and write nothing when it is set, and the forward skips its running-statistics
    update the same way. A non-blocking copy of the flag to pinned host memory and an event
    follow, so the host can read the result without a synchronisation once the device has got
    that far. It is read (and the refusal raised, by :func:`_settle`):

    * in the layer's next differentiable forward, if ready (:func:`_settle_ready`);
    * in its backward, if ready; else the backward runs with NaN gradients where the flag is
      set (never silent garbage from an unwritten output) and the result is read at the end of
      the backward pass if ready by then. The host never waits for it: a host running ahead of
      the device raises the refusal in a later forward of the layer, when the result has
      arrived (the optimizer step in between applies the NaN gradients: the refused layer's
      parameters become NaN, so its later forwards are refused too and the loss is NaN);
    * by :func:`check_pending`, at once, waiting for the device if need be: call it before
      ``optimizer.step()`` to keep a refused step's NaN gradients from the parameters, at the
      cost of waiting for the device to finish that step's forward.

    Under ``LAYERS_KERNELS=cudasim`` the tensors are on the CPU: the same path runs, with the
    flag read where it lies (computed synchronously, so always ready).
    """

    def __init__(self, weight, eps):
        self.magnitude = weight.detach().abs()  # a copy: the weight as checked, for the error
        self.eps = eps
        self.flag = self.magnitude.ge(eps).all().logical_not().reshape(1)
        self.weight = weakref.ref(weight)
        self.failed = None  # the flag once read on the host
        if self.flag.is_cuda:
            self._host = torch.empty(1, dtype=torch.bool, device="cpu", pin_memory=True)
            self._host.copy_(self.flag, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(self.flag.device))
        else:
            self._host, self._event = self.flag, None
        with _lock:
            _pending.setdefault(weight, []).append(self)

    def error(self):
        return _scale_error(
            self.magnitude, self.eps,
            f". (Checked on {self.flag.device} without a host synchronisation: the refused "
            "forward wrote neither its input nor the running statistics, and any gradient "
            "computed through it is NaN.)")


#: weight -> its :class:`_DeviceCheck` objects whose result the host has not read yet.
_pending = WeakIdKeyDictionary()
_lock = threading.RLock()  # backward (and its final callbacks) may run on autograd's threads


def _ready(check):
    """Whether ``check``'s flag can be read on the host without waiting for the device."""
    return check._event is None or check._event.query()


def _wait(check):
    """Waits until the device has copied ``check``'s flag to the host."""
    if check._event is not None:
        check._event.synchronize()


def _settle(check, wait):
    """Reads ``check``'s result if ready (or, with ``wait``, after waiting); raises if it failed.

    Returns ``False`` if the result is not ready and ``wait`` is false, else ``True``.
    """
    if check.failed is None:
        if not _ready(check):
            if not wait:
                return False
            _wait(check)
        with _lock:
            # Host memory that the device has finished writing: no synchronisation.
            check.failed = bool(check._host.numpy()[0])
            weight = check.weight()
            checks = _pending.get(weight, []) if weight is not None else []
            if check in checks:
                checks.remove(check)
                if not checks:
                    _pending.pop(weight)
    if check.failed:
        raise check.error()
    return True


def _settle_ready(weight):
    """Raises the refusal of an earlier forward of ``weight`` if the host can read it now."""
    with _lock:
        mine = list(_pending.get(weight, ()))
    for check in mine:
        _settle(check, wait=False)


def _settle_after_backward(check):
    """Reads ``check`` when the running backward pass has finished, if the device has reported
    it by then; else it stays pending (:class:`_DeviceCheck`)."""
    torch.autograd.Variable._execution_engine.queue_callback(lambda: _settle(check, wait=False))


def check_pending():
    """Raise now the refusal of any in-place ``scale_mode="bn"`` forward whose device-side
    check the host has not read yet, waiting for the device if need be.

    On the CUDA kernels the ``|weight| >= eps`` check runs on the device and a refusal is
    raised when the host can read its result without waiting (see :class:`_DeviceCheck`);
    call this where you want it for certain, e.g. before ``optimizer.step()`` (so that a
    refused step's NaN gradients never reach the parameters) or after a forward that no
    backward follows. It waits for the device only as far as the checked forwards (an event,
    not a full synchronisation). Nothing to do on the CPU.
    """
    with _lock:
        checks = [check for checks in _pending.values() for check in checks]
    for check in checks:
        _settle(check, wait=True)


# --------------------------------------------------------------------------- layouts
def _layout(x):
    """``"ncs"`` for contiguous tensors, ``"mc"`` for channels-last ones, else ``None``."""
    for layout in ("ncs", "mc"):
        if _is_in(x, layout):
            return layout
    return None


def _is_in(x, layout):
    """Whether ``x``'s canonical view in ``layout`` is a view (not a copy)."""
    return (x if layout == "ncs" else x.movedim(1, -1)).is_contiguous()


def _view(x, layout):
    """The canonical kernel view of ``x`` in ``layout``, copying only if ``x`` is not in it (a
    3-D ``x`` in ``"ncs"`` is its own view). ``flatten`` makes the ``(N, C, S)`` view faster
    than ``view`` with the sizes spelled out, which counts on small tensors, three views a step
    (the small shapes of ``python -m experiments.bench_kernels`` measure it)."""
    if layout == "ncs":
        x = x.contiguous()
        return x.flatten(2) if x.dim() > 2 else x.unsqueeze(2)
    return x.movedim(1, -1).contiguous().view(-1, x.shape[1])


def _unview(view, layout, shape):
    """The ``(N, C, *)`` tensor of ``shape`` that a canonical ``view`` in ``layout`` holds."""
    if layout == "ncs":
        return view.view(*shape)  # unpacked: a torch.Size argument costs twice as much
    return view.view(shape[0], *shape[2:], shape[1]).movedim(-1, 1)


def _empty_like_layout(x, layout):
    """An uninitialised tensor shaped like ``x`` and laid out in ``layout``."""
    if layout == "ncs":
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return torch.empty(x.movedim(1, -1).shape, dtype=x.dtype, device=x.device).movedim(-1, 1)


# --------------------------------------------------------------------------- per-channel steps
# The per-channel arithmetic around the kernels (scale and shift, statistics, running averages,
# the backward's coefficients) is that of :mod:`layers.kernels.per_channel`, run one of two
# ways: inside the backend's whole forward or backward step (``forward_step``,
# ``backward_step`` of :mod:`layers.kernels.cpu`: one compiled loop over the channels; of
# :mod:`layers.kernels.cuda`: one kernel launch), or, for synchronised layers (which sum over
# their ranks between the kernels) and mixed per-channel dtypes, as torch operators on vectors
# of C values between the per-kernel operators. Each torch operator on a few dozen values
# costs microseconds of host time whatever its size (much more on ``meta``, where many run
# torch's Python decompositions); the two dozen of them, and the Python between separate kernel
# calls, cost more than the kernels on small tensors, and on a GPU at any size.
def whole_steps(group=None, vectors=()):
    """Whether a forward or backward runs as one whole step of its kernel backend (the kernels
    and the per-channel arithmetic back to back, one operator of :mod:`layers.ops`), not as
    the per-kernel operators with the per-channel steps as torch operators between them.

    It does unless ``group`` is synchronised (the per-channel steps then sum over the ranks
    between the kernels) or the per-channel ``vectors`` (weight, bias, running statistics;
    ``None`` where absent) are not of one dtype, float32 or float64 (the backends' steps read
    them as one dtype, :func:`layers.kernels.step_vector_dtype`).
    """
    if distributed.active(group):
        return False
    return step_vector_dtype(vectors) is not None


def scale_and_shift(weight, bias, channels, eps, scale_mode, like):
    """Per-channel ``gamma``, ``beta`` and ``d gamma / d weight`` (float64 tensors)."""
    options = dict(dtype=torch.float64, device=like.device)
    if weight is None:
        gamma = torch.ones(channels, **options)
        dgamma_dweight = torch.zeros(channels, **options)
    else:
        w = weight.detach().double()
        gamma = per_channel.scale(w, eps, scale_mode == "abs")
        dgamma_dweight = per_channel.scale_derivative(w, scale_mode == "abs")
    beta = torch.zeros(channels, **options) if bias is None else bias.detach().double()
    return gamma, beta, dgamma_dweight


def _check_count(count, shape):
    """Training needs more than one value per channel (the global count, when synchronised)."""
    if count <= 1:
        raise ValueError(
            f"expected more than 1 value per channel when training, got {count} "
            f"(input shape {tuple(shape)} on this rank)"
        )


def _batch_statistics(mean, m2, count, running_mean, running_var, momentum, eps, skip=None):
    """``rstd`` of the batch; updates the running statistics as ``nn.BatchNorm2d`` does
    (torch operators).

    ``skip``: ``None`` or a ``(1,)`` bool device flag; where it is set the update is a no-op.
    """
    if running_mean is not None:
        with torch.no_grad():
            for running, batch in ((running_mean, mean),
                                   (running_var, per_channel.unbiased_variance(m2, count))):
                updated = per_channel.running_average(running, batch.to(running.dtype),
                                                       momentum)
                if skip is None:
                    running.copy_(updated)
                else:
                    torch.where(skip, running, updated, out=running)
    return per_channel.batch_rstd(m2, count, eps)


def normalize_activate_into(x, out, weight, bias, running_mean, running_var, training, momentum,
                            eps, act, slope, scale_mode, group=None, skip=None):
    """Run the forward ``out = act(gamma * x_hat + beta)``; return the per-channel state.

    ``out`` may be ``x`` (in place). In training the batch statistics are used (combined over
    ``group``) and the running statistics, if given, updated as ``nn.BatchNorm2d`` does
    (unbiased variance); in eval the running statistics are used. Returns a (6, C) float64
    tensor of ``[gamma, beta, dgamma_dweight, mean, rstd, count]`` rows, everything backward
    needs besides the activation-sized tensors. ``skip`` (backends with ``DEVICE_GUARD``
    only): a ``(1,)`` bool device flag; where it is set, neither ``out`` nor the running
    statistics are written. The caller has refused bad arguments (:func:`check_arguments`)
    before anything was written; only a synchronised call's global count is checked here.
    """
    layout = _layout(x) or "ncs"  # any other layout runs on a contiguous copy
    view = _view(x, layout)
    out_view = view if out is x else _view(out, layout)
    channels = x.shape[1]
    count = view.numel() // channels
    if whole_steps(group, (weight, bias, running_mean, running_var)):
        step = (weight, bias, running_mean, running_var, training, momentum, eps, act, slope,
                scale_mode == "abs")
        if out_view is view:
            state = ops.forward_step_(view, *step, skip)
        else:
            state = ops.forward_step_out(view, out_view, *step)
        _write_back(out, out_view, layout)
        return state
    gamma, beta, dgamma_dweight = scale_and_shift(weight, bias, channels, eps, scale_mode, x)
    if not training:
        mean = running_mean.double()
        rstd = per_channel.batch_rstd(running_var.double(), 1, eps)
        applied = False
    elif not distributed.active(group):  # statistics and output in one pass over the input
        if out_view is view:
            stats = ops.moments_normalize_act_(view, gamma, beta, eps, act, slope, skip)
        else:
            stats = ops.moments_normalize_act_out(view, out_view, gamma, beta, eps, act, slope)
        mean, m2 = stats
        rstd = _batch_statistics(mean, m2, count, running_mean, running_var, momentum, eps,
                                 skip)
        applied = True
    else:
        # A rank of a synchronised layer may hold no element at all: it contributes nothing.
        moments = (ops.moments(view) if count else
                   torch.zeros(2, channels, dtype=torch.float64, device=view.device))
        mean, m2, count = distributed.combine_moments(moments, count, group)
        _check_count(count, view.shape)  # the same global count on every rank: all raise
        rstd = _batch_statistics(mean, m2, count, running_mean, running_var, momentum, eps,
                                 skip)
        applied = False
    counts = torch.full_like(mean, float(count))
    channel = torch.stack([gamma, beta, dgamma_dweight, mean, rstd, counts])
    if not applied:
        _apply(view, out_view, apply_coefficients(channel, view.dtype), act, slope, skip)
    _write_back(out, out_view, layout)
    return channel


def apply_coefficients(channel, dtype):
    """``(a, b)`` with ``act(x * a + b) = act(BN(x))`` for the per-channel state ``channel``
    (:func:`normalize_activate_into`), in the compute dtype of data of ``dtype``: what
    :func:`reapply_into` takes."""
    gamma, beta, _, mean, rstd, _ = channel
    compute = codecs.compute_dtype(dtype)
    return tuple(v.to(compute) for v in per_channel.scale_shift(gamma, beta, mean, rstd))


def reapply_into(x, out, coefficients, act, slope):
    """Recompute ``out = act(BN(x))`` with the statistics stored in a forward's state, given as
    its :func:`apply_coefficients` (per channel, so a caller recomputing a layer in channel
    slices makes them once and slices them).

    For layers that drop BN outputs and recompute them in backward (shared-storage DenseNet):
    nothing is re-estimated and the running statistics are left alone.
    """
    layout = _layout(x) or "ncs"
    view = _view(x, layout)
    out_view = view if out is x else _view(out, layout)
    _apply(view, out_view, coefficients, act, slope)
    _write_back(out, out_view, layout)


def _apply(view, out_view, coefficients, act, slope, skip=None):
    """``out = act(x * a + b)`` on canonical views, ``(a, b)`` the
    :func:`apply_coefficients` (``skip``: that of :func:`normalize_activate_into`, in place
    only)."""
    a, b = coefficients
    if out_view is view:
        ops.scale_shift_act_(view, a, b, act, slope, skip)
    else:
        ops.scale_shift_act_out(view, out_view, a, b, act, slope)


def _write_back(out, out_view, layout):
    """Copy ``out_view`` into ``out`` if it is a copy (``out`` not in a canonical layout)."""
    if out_view._base is not out and not _is_in(out, layout):
        out.copy_(_unview(out_view, layout, out.shape))


def _input_gradient_coefficients(channel, sums, training, variant_y):
    """Per-channel ``(k0, k1, k2)`` of ``dx = dy * k0 + v * k1 + k2`` (float64, (3, C)).

    ``sums`` are the global ``[sum dy, sum dy*v]``. With ``variant_y`` the value ``v`` is
    ``y`` (InPlace-ABN II), else ``x_hat`` (InPlace-ABN I and ABN).
    """
    gamma, beta, _, _, rstd, count = channel
    if not training:  # running statistics do not depend on x
        k0 = gamma * rstd
        zeros = torch.zeros_like(k0)
        return torch.stack([k0, zeros, zeros])
    sum_dy, sum_dy_v = sums
    return torch.stack(per_channel.input_gradient_coefficients(gamma, beta, rstd, count, sum_dy,
                                                               sum_dy_v, variant_y))


class BackwardSpec(typing.NamedTuple):
    """What the backward of a BN + activation needs besides tensors.

    ``mode`` is a ``common.MODE_*`` code (where ``v`` of the gradient comes from), ``act`` and
    ``slope`` the activation's kernel code and parameter, ``training`` whether batch statistics
    were used, ``group`` the process group the reductions are summed over (or ``None``). A
    named tuple rather than a frozen dataclass: one is made per forward, and a tuple is made in
    a fraction of the time.
    """

    mode: int
    act: int
    slope: float
    training: bool
    group: object = None
    has_weight: bool = True
    has_bias: bool = True
    param_dtype: torch.dtype = torch.float32

    @classmethod
    def of(cls, mode, act, slope, training, group, weight, bias):
        """A spec whose parameter flags and dtype follow ``weight`` and ``bias``."""
        present = weight if weight is not None else bias
        dtype = torch.float32 if present is None else present.dtype
        return cls(mode, act, slope, training, group, weight is not None, bias is not None,
                   dtype)


def normalize_activate_backward(z, dz, x, channel, spec, input_grad=True, poison=None,
                                dz_owned=False):
    """Gradients ``(dx, dweight, dbias)`` of ``z = act(BN(x))`` given ``dz``.

    ``channel`` is the per-channel state returned by :func:`normalize_activate_into`; ``x`` is
    only read in ``MODE_XHAT_FROM_X`` (pass ``None`` otherwise: ``v`` is recovered from ``z``).
    ``dx`` is ``None`` unless ``input_grad``. It is written over ``dz`` only where ``dz`` is
    provably this computation's own: the caller made it in the same backward and hands it
    over (``dz_owned``, the shared-storage layers' recomputed convolution gradients), or
    ``dz`` had to be copied into the kernels' layout here. An autograd function's incoming
    gradient is never written: tensor hooks, module backward hooks, ``retain_grad`` and the
    caller may hold it, through references that no use count shows at the time of the
    backward, so its memory is not reused. ``poison``: ``None`` or a ``(1,)`` bool device
    flag; where it is set every gradient is NaN (a forward refused on the device left ``z``
    unwritten), without a host synchronisation.
    """
    layout = _layout(z) or "ncs"
    z_view, dz_view = _view(z, layout), _view(dz, layout)
    dz_in_layout = _is_in(dz, layout)
    reuse_dz = dz_owned or not dz_in_layout  # owned, or a copy made here
    x_view = None if x is None else _view(x, layout)
    if whole_steps(spec.group) and spec.param_dtype in STEP_VECTOR_DTYPES:
        backward = (x_view, channel, spec.act, spec.slope, spec.mode, spec.training,
                    spec.param_dtype, spec.has_weight, spec.has_bias, poison)
        dx = None
        if not input_grad:
            dweight, dbias = ops.parameter_gradients_step(z_view, dz_view, *backward)
        elif reuse_dz:  # written over dz itself where dz is owned and in the layout
            dweight, dbias = ops.backward_step_(z_view, dz_view, *backward)
            dx = dz if dz_owned and dz_in_layout else _unview(dz_view, layout, z.shape)
        else:  # into a new tensor, in the pass that reads dz: no copy of dz first
            dx_view = torch.empty_like(dz_view)
            dweight, dbias = ops.backward_step_out(z_view, dz_view, dx_view, *backward)
            dx = _unview(dx_view, layout, z.shape)
        return (dx, dweight if spec.has_weight else None, dbias if spec.has_bias else None)
    compute = codecs.compute_dtype(z.dtype)
    variant_y = spec.mode == common.MODE_Y
    gamma, beta, dgamma_dweight, mean, rstd, _ = channel
    # v recovered from z unless from x; p, q only used by variant I then
    p, q = per_channel.value_coefficients(gamma, beta, mean, rstd,
                                          spec.mode == common.MODE_XHAT_FROM_X)
    p, q = p.to(compute), q.to(compute)
    local = ops.backward_reduce(z_view, dz_view, x_view, p, q, spec.act, spec.slope, spec.mode)
    if poison is not None:
        local = torch.where(poison, math.nan, local)
    coef = None
    if input_grad:
        sums = (distributed.all_reduce_sum(local.clone(), spec.group) if spec.training
                else local)
        coef = _input_gradient_coefficients(channel, sums, spec.training, variant_y)
        if poison is not None:  # dx = dy * k0 + v * k1 + k2: NaN wherever the k are
            coef = torch.where(poison, math.nan, coef)
        coef = coef.to(compute)
    dgamma = per_channel.scale_gradient(gamma, beta, local[0], local[1], variant_y)
    dweight = (dgamma * dgamma_dweight).to(spec.param_dtype) if spec.has_weight else None
    dbias = local[0].to(spec.param_dtype) if spec.has_bias else None
    dx = None
    if input_grad:
        args = (z_view, dz_view, x_view, p, q, coef, spec.act, spec.slope, spec.mode)
        if reuse_dz:
            ops.backward_input_(*args)
            dx_view = dz_view
        else:
            dx_view = ops.backward_input(*args)
        dx = _unview(dx_view, layout, z.shape)
    return dx, dweight, dbias


# --------------------------------------------------------------------------- functions
def input_names(forward):
    """``(names, variadic)`` of an autograd function's ``forward``: the names of its arguments
    after ``ctx``, and that of a final ``*args`` one (or ``None``), for :func:`needs_input_grad`.
    Taken once, where the function is defined: ``torch.compile`` traces a backward, and
    ``inspect`` is nothing it can trace."""
    arguments = list(inspect.signature(forward).parameters.values())[1:]
    variadic = [a.name for a in arguments if a.kind is inspect.Parameter.VAR_POSITIONAL]
    return (tuple(a.name for a in arguments if a.kind is not inspect.Parameter.VAR_POSITIONAL),
            variadic[0] if variadic else None)


def needs_input_grad(ctx, names):
    """``ctx.needs_input_grad`` as a dict keyed by the forward's argument names
    (:func:`input_names`; a ``*args`` argument's entry is the tuple of its flags): read by
    name, a backward stays right when an argument is added or moved."""
    fixed, variadic = names
    flags = ctx.needs_input_grad
    needs = dict(zip(fixed, flags))
    if variadic is not None:
        needs[variadic] = flags[len(fixed):]
    return needs


def once_differentiable(backward):
    """``torch.autograd.function.once_differentiable`` for a ``backward``, entering its
    ``no_grad`` context only where grad mode is on (a backward of ``create_graph=True``,
    which also gets torch's nodes that refuse a second differentiation). Grad mode is off in
    every other backward, where torch's wrapper would enter and leave the context for
    nothing: a microsecond, a visible part of a small tensor's step."""
    guarded = autograd_function.once_differentiable(backward)

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled():
            return guarded(ctx, *grads)
        return backward(ctx, *grads)
    return wrapper


# The two functions take their tensors one by one and their other arguments as one tuple
# (``options``): autograd's ``apply`` handles each argument in turn, and the fewer there are,
# the less host time a call costs (a microsecond of a small tensor's forward).
class _ABN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, options):
        training, momentum, eps, act, slope, scale_mode, group = options
        layout = _layout(x) or "ncs"
        out = _empty_like_layout(x, layout)
        channel = normalize_activate_into(x, out, weight, bias, running_mean, running_var,
                                          training, momentum, eps, act, slope, scale_mode, group)
        ctx.spec = BackwardSpec.of(common.MODE_XHAT_FROM_X, act, slope, training, group, weight,
                                   bias)
        ctx.save_for_backward(x, out, channel)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dz):
        x, z, channel = ctx.saved_tensors
        grads = normalize_activate_backward(z, dz, x, channel, ctx.spec,
                                            ctx.needs_input_grad[_ABN_X])
        return grads + (None,) * 3


class _InPlaceABN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, options):
        training, momentum, eps, act, slope, scale_mode, variant, group, check = options
        skip = None if check is None else check.flag
        channel = normalize_activate_into(x, x, weight, bias, running_mean, running_var,
                                          training, momentum, eps, act, slope, scale_mode, group,
                                          skip)
        mode = common.MODE_Y if variant == "II" else common.MODE_XHAT_FROM_Y
        ctx.spec = BackwardSpec.of(mode, act, slope, training, group, weight, bias)
        ctx.check = check
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, channel)
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, dz):
        z, channel = ctx.saved_tensors
        poison = None
        if ctx.check is not None and not _settle(ctx.check, wait=False):
            poison = ctx.check.flag  # not known on the host yet: read after this backward
            _settle_after_backward(ctx.check)
        grads = normalize_activate_backward(z, dz, None, channel, ctx.spec,
                                            ctx.needs_input_grad[_IN_PLACE_ABN_X],
                                            poison)
        return grads + (None,) * 3


#: Where ``x`` is among the forwards' inputs, for ``ctx.needs_input_grad``: found by name
#: once, so a backward stays right when an argument is added or moved, without building
#: :func:`needs_input_grad`'s dict per backward.
_ABN_X = input_names(_ABN.forward)[0].index("x")
_IN_PLACE_ABN_X = input_names(_InPlaceABN.forward)[0].index("x")


def abn(input, weight=None, bias=None, running_mean=None, running_var=None, training=True,
        momentum=0.1, eps=1e-5, activation="leaky_relu", activation_param=None,
        scale_mode="abs", group=None, on_accept=None):
    """Batch normalization + activation, out of place (saves ``input`` and the output).

    Arguments follow ``torch.nn.functional.batch_norm``; ``activation`` is one of
    ``leaky_relu`` (default slope 0.01), ``elu`` (default alpha 1), ``identity``, ``relu``,
    with its parameter ``activation_param``. ``scale_mode`` is ``"abs"`` (scale
    ``|weight| + eps``) or ``"bn"`` (scale ``weight``); see the module docstring. ``group``:
    a ``torch.distributed`` process group to synchronise the statistics over, as
    :func:`inplace_abn` (``None``: no synchronisation). ``on_accept``: ``None`` or a function
    called once every argument is accepted, before anything is written (the modules count
    the batch there, so a refused call leaves ``num_batches_tracked`` alone), with one
    argument: ``None``, or where a check runs on the device or in a compiled graph (the
    in-place ``scale_mode="bn"`` one) a 0-d bool tensor, ``True`` where the call is accepted.
    """
    act, slope = check_activation(activation, activation_param, inplace=False)
    check_choice("scale_mode", scale_mode, SCALE_MODES)
    _check_input(input, weight, bias, running_mean, running_var, training, eps, momentum, group)
    if on_accept is not None:
        on_accept(None)
    return _ABN.apply(input, weight, bias, running_mean, running_var,
                      (training, momentum, eps, act, slope, scale_mode, group))


def inplace_abn(input, weight=None, bias=None, running_mean=None, running_var=None,
                training=True, momentum=0.1, eps=1e-5, activation="leaky_relu",
                activation_param=None, scale_mode="abs", variant="II", group=None,
                on_accept=None):
    """In-place activated batch normalization: overwrites and returns ``input``.

    As :func:`abn`, with ``activation`` restricted to invertible ones (``leaky_relu`` with a
    positive slope, ``elu``, ``identity``), ``variant`` ``"I"`` or ``"II"`` choosing the
    backward pass, and ``group`` a ``torch.distributed`` process group to synchronise the
    statistics over (``None``: no synchronisation), ``on_accept`` as in :func:`abn`. It refuses,
    before writing anything, an input it cannot overwrite safely: a leaf that requires grad or
    a view of one, the output of another in-place layer, an inference tensor outside inference
    mode, an input whose elements share memory.
    """
    act, slope = check_activation(activation, activation_param, inplace=True)
    check_choice("variant", variant, VARIANTS)
    check_choice("scale_mode", scale_mode, SCALE_MODES)
    _check_input(input, weight, bias, running_mean, running_var, training, eps, momentum, group)
    check, accepted = _check_inplace_input(input, weight, eps, scale_mode)
    if on_accept is not None:
        on_accept(accepted)
    if _runs_on_a_copy(input, weight, bias):
        input = input.clone()
    return _InPlaceABN.apply(input, weight, bias, running_mean, running_var,
                             (training, momentum, eps, act, slope, scale_mode, variant, group,
                              check))


__all__ = ["abn", "inplace_abn", "check_pending", "ACTIVATIONS",
           "INVERTIBLE_ACTIVATIONS", "VARIANTS", "SCALE_MODES"]
