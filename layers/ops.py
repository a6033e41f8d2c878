"""The numba kernels as PyTorch custom operators (``torch.ops.layers.*``).

Every kernel call of :mod:`layers.functional` goes through one of these operators
(:class:`KernelOperator`), in eager mode as under ``torch.compile``: a layer's whole forward
or backward as one operator (``forward_step_``, ``backward_step_``, ...: the kernels and the
per-channel arithmetic back to back in the kernel backend), or, for synchronised layers and
mixed per-channel dtypes (:func:`layers.functional.whole_steps`), one operator per kernel. As
operators they have what the numba calls alone lack:

* a *fake* implementation (output shapes, dtypes and devices, no data), so the layers run on
  ``FakeTensorMode`` tensors and on the ``meta`` device: the simulated-memory measurements of
  :mod:`experiments.measure.tensor_memory` run paper-sized networks without computing them;
* a schema that declares what each one mutates (the ``*_`` operators write their first
  argument in place, the ``*_out`` ones their ``out``), so ``torch.compile`` traces them as
  single graph nodes, functionalizes the mutating ones and never breaks the graph on a numba
  call.

On plain eager tensors the dispatcher adds nothing but its cost, and a :class:`KernelOperator`
calls the implementation directly (bumping the version counters of what it mutates, as the
operator would): the same function runs either way.

The operators work on the canonical kernel views of :mod:`layers.kernels.common` (``(N, C, S)``
contiguous, or ``(M, C)`` for channels-last tensors) with per-channel vectors as the kernel
backends take them. Autograd is not registered on them: it lives in the autograd functions of
:mod:`layers.functional`, whose forward and backward call these operators (and which
``torch.compile`` traces). ``torch.library.register_autograd`` takes functional operators only,
and the in-place forward, the point of InPlace-ABN, mutates its input.

``skip``: ``None`` or a ``(1,)`` bool tensor on the device, for the kernels that guard their
writes with it (the CUDA kernels, ``DEVICE_GUARD``): while it holds ``True`` they write nothing.
``poison``, of the backward steps: a flag of the same kind; while it holds ``True`` every
gradient is NaN.
"""
import functools
from typing import Optional

import torch
from torch.library import custom_op
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .kernels import backend

Tensor = torch.Tensor


def _channels(view):
    """The channel count of a canonical view: ``(N, C, S)`` or ``(M, C)``."""
    if view.dim() not in (2, 3):
        raise ValueError(f"a canonical kernel view has 2 or 3 dimensions, got shape "
                         f"{tuple(view.shape)}")
    return view.shape[1]


def _per_channel(view, rows=2):
    """A new ``(rows, C)`` float64 tensor on ``view``'s device (a fake one under fake mode)."""
    return view.new_empty((rows, _channels(view)), dtype=torch.float64)


class KernelOperator:
    """A kernel as a custom operator ``layers::<name>``, called directly where the dispatcher
    adds nothing.

    Calling the operator costs about as much as a small kernel (Python dispatch through the
    autograd, ``ADInplaceOrView`` and backend keys), several times per layer and step. Called
    on plain eager tensors (not fake, not on ``meta``, not under ``torch.compile`` or a
    ``TorchDispatchMode`` such as the memory tracker of
    :mod:`experiments.measure.tensor_memory`; :func:`runs_directly`), this runs the
    implementation directly and bumps the version counter of every mutated argument, as the
    operator's ``ADInplaceOrView`` kernel does (autograd's check that a saved tensor was not
    overwritten relies on it). Anywhere else it calls ``operator``, the registered custom operator.
    Called directly, the per-channel vectors may be numpy arrays, as the host steps of
    :mod:`layers.functional` pass them (:mod:`layers.kernels`).
    """

    def __init__(self, implementation, mutates_args):
        self.operator = custom_op(f"layers::{implementation.__name__}",
                                  mutates_args=mutates_args)(implementation)
        self.implementation = implementation
        parameters = implementation.__code__.co_varnames
        self._mutated = tuple((parameters.index(name), name) for name in mutates_args)
        functools.update_wrapper(self, implementation)

    def register_fake(self, fake):
        """Register ``fake`` as the operator's fake (shapes-only) implementation."""
        return self.operator.register_fake(fake)

    def __call__(self, *args, **kwargs):
        if not runs_directly(args[0]):
            return self.operator(*args, **kwargs)
        result = self.implementation(*args, **kwargs)
        # A loop rather than comprehensions (each a call of its own before Python 3.12): this
        # runs twice per layer and step, whose Python is most of a small tensor's time.
        written = []
        given = len(args)
        for index, name in self._mutated:
            mutated = args[index] if index < given else kwargs.get(name)
            if mutated is not None:  # an optional argument left out (running statistics)
                written.append(mutated)
        # The version counters of what the kernel wrote, bumped as the operator's
        # ADInplaceOrView kernel does: autograd's check that a tensor saved for backward was
        # not overwritten relies on it. One call for all (inference tensors, which have no
        # version counter, are skipped by torch).
        torch.autograd.graph.increment_version(written)
        return result


def runs_directly(tensor):
    """Whether kernel calls on ``tensor`` skip the dispatcher (:class:`KernelOperator`): a
    plain eager tensor with data (not fake, not on ``meta``), outside ``torch.compile`` and any
    ``TorchDispatchMode``."""
    return (type(tensor) is torch.Tensor and not tensor.is_meta  # noqa: E721 (fake: subclass)
            and not torch.compiler.is_compiling() and not is_in_torch_dispatch_mode())


def _operator(mutates_args):
    """Decorator: the kernel implementation below as a :class:`KernelOperator`."""
    return functools.partial(KernelOperator, mutates_args=mutates_args)


#: The keywords of a backend call without a device flag (:func:`_guard`); never modified.
_NO_FLAG = {}


def _guard(name, flag):
    """The device flag ``flag`` (``skip``, ``poison``, or ``None``) as the keywords of a
    backend call: only the CUDA backend takes them (``DEVICE_GUARD``), and only it is ever
    given one."""
    return _NO_FLAG if flag is None else {name: flag}


# --------------------------------------------------------------------------- statistics
@_operator(())
def moments(x: Tensor) -> Tensor:
    """Per-channel ``[mean, M2]`` of ``x`` (``(2, C)`` float64)."""
    return backend(x).moments(x)


@moments.register_fake
def _(x):
    return _per_channel(x)


# --------------------------------------------------------------------------- forward
@_operator(("x",))
def moments_normalize_act_(x: Tensor, gamma: Tensor, beta: Tensor, eps: float, act: int,
                           slope: float, skip: Optional[Tensor] = None) -> Tensor:
    """The training forward in place: returns the batch's ``[mean, M2]`` and writes
    ``x = act(gamma * (x - mean) / sqrt(M2 / count + eps) + beta)``."""
    return backend(x).moments_forward(x, x, gamma, beta, eps, act, slope, **_guard("skip", skip))


@moments_normalize_act_.register_fake
def _(x, gamma, beta, eps, act, slope, skip=None):
    return _per_channel(x)


@_operator(("out",))
def moments_normalize_act_out(x: Tensor, out: Tensor, gamma: Tensor, beta: Tensor, eps: float,
                              act: int, slope: float) -> Tensor:
    """The training forward into ``out`` (a view shaped like ``x``, not overlapping it):
    returns the batch's ``[mean, M2]``."""
    return backend(x).moments_forward(x, out, gamma, beta, eps, act, slope)


@moments_normalize_act_out.register_fake
def _(x, out, gamma, beta, eps, act, slope):
    return _per_channel(x)


@_operator(("x",))
def scale_shift_act_(x: Tensor, a: Tensor, b: Tensor, act: int, slope: float,
                     skip: Optional[Tensor] = None) -> None:
    """``x = act(x * a + b)`` per channel, in place (``a``, ``b`` in the compute dtype of
    ``x``: float32 for 16-bit data)."""
    backend(x).forward(x, x, a, b, act, slope, **_guard("skip", skip))


@scale_shift_act_.register_fake
def _(x, a, b, act, slope, skip=None):
    _channels(x)


@_operator(("out",))
def scale_shift_act_out(x: Tensor, out: Tensor, a: Tensor, b: Tensor, act: int,
                        slope: float) -> None:
    """``out = act(x * a + b)`` per channel (``out`` shaped like ``x``, not overlapping it)."""
    backend(x).forward(x, out, a, b, act, slope)


@scale_shift_act_out.register_fake
def _(x, out, a, b, act, slope):
    _channels(x)


# --------------------------------------------------------------------------- backward
@_operator(())
def backward_reduce(z: Tensor, dz: Tensor, x: Optional[Tensor], p: Tensor, q: Tensor, act: int,
                    slope: float, mode: int) -> Tensor:
    """Per-channel ``[sum dy, sum dy * v]`` (``(2, C)`` float64); ``x`` only in
    ``MODE_XHAT_FROM_X`` (``None``: ``v`` is recovered from ``z``)."""
    return backend(z).backward_reduce(z, dz, z if x is None else x, p, q, act, slope, mode)


@backward_reduce.register_fake
def _(z, dz, x, p, q, act, slope, mode):
    return _per_channel(z)


@_operator(())
def backward_input(z: Tensor, dz: Tensor, x: Optional[Tensor], p: Tensor, q: Tensor,
                   coef: Tensor, act: int, slope: float, mode: int) -> Tensor:
    """The input gradient ``dy * coef[0] + v * coef[1] + coef[2]``, a new tensor."""
    dx = torch.empty_like(z)
    backend(z).backward_input(z, dz, z if x is None else x, p, q, coef, act, slope, mode, dx)
    return dx


@backward_input.register_fake
def _(z, dz, x, p, q, coef, act, slope, mode):
    _channels(z)
    return torch.empty_like(z)


@_operator(("dz",))
def backward_input_(z: Tensor, dz: Tensor, x: Optional[Tensor], p: Tensor, q: Tensor,
                    coef: Tensor, act: int, slope: float, v_mode: int) -> None:
    """:func:`backward_input` written over ``dz``: every kernel reads an element of ``dz``
    before it writes the gradient to the same element, so the incoming gradient's memory is
    reused (for callers that own it: nothing else reads it afterwards). ``v_mode`` is
    ``backward_input``'s ``mode`` (a mutating operator may not name an argument ``mode``:
    torch's functionalization passes its own)."""
    backend(z).backward_input(z, dz, z if x is None else x, p, q, coef, act, slope, v_mode, dz)


@backward_input_.register_fake
def _(z, dz, x, p, q, coef, act, slope, v_mode):
    _channels(z)


# --------------------------------------------------------------------------- whole steps
# A layer's whole forward or backward (the kernels above and the per-channel arithmetic around
# them, :mod:`layers.kernels.per_channel`) as one operator: under fake tensors, ``meta``, a
# ``TorchDispatchMode`` or ``torch.compile`` a step is then one operator instead of a few
# kernel operators and a few dozen torch operators on vectors of C values (on ``meta`` many of
# those run torch's Python decompositions), which is what makes a simulated paper-sized step
# take seconds rather than minutes. ``weight``, ``bias``, ``running_mean``, ``running_var``:
# ``None`` or tensors of one dtype, float32 or float64 (:func:`layers.functional.whole_steps`).
def _state(view):
    """The (6, C) float64 per-channel state a forward step returns, as a fake tensor."""
    return _per_channel(view, rows=6)


@_operator(("x", "running_mean", "running_var"))
def forward_step_(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                  running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool,
                  momentum: float, eps: float, act: int, slope: float, abs_mode: bool,
                  skip: Optional[Tensor] = None) -> Tensor:
    """The forward of BN + activation in place (``x = act(gamma * x_hat + beta)``), the running
    statistics updated in training; returns the (6, C) float64 per-channel state (the
    backends' ``forward_step``)."""
    return backend(x).forward_step(x, x, weight, bias, running_mean, running_var, training,
                                   momentum, eps, act, slope, abs_mode, **_guard("skip", skip))


@forward_step_.register_fake
def _(x, weight, bias, running_mean, running_var, training, momentum, eps, act, slope,
      abs_mode, skip=None):
    return _state(x)


@_operator(("out", "running_mean", "running_var"))
def forward_step_out(x: Tensor, out: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                     running_mean: Optional[Tensor], running_var: Optional[Tensor],
                     training: bool, momentum: float, eps: float, act: int, slope: float,
                     abs_mode: bool) -> Tensor:
    """:func:`forward_step_` into ``out`` (a view shaped like ``x``, not overlapping it)."""
    return backend(x).forward_step(x, out, weight, bias, running_mean, running_var, training,
                                   momentum, eps, act, slope, abs_mode)


@forward_step_out.register_fake
def _(x, out, weight, bias, running_mean, running_var, training, momentum, eps, act, slope,
      abs_mode):
    return _state(x)


def _backward_step(z, dz, x, state, act, slope, v_mode, training, input_grad, param_dtype,
                   has_weight, has_bias, poison, out=None):
    """The backends' ``backward_step`` (the input gradient into ``out``, or over ``dz`` where
    ``out`` is None), with an empty tensor for a gradient left out (an operator returns
    tensors, never ``None``)."""
    dweight, dbias = backend(z).backward_step(z, dz, x, state, act, slope, v_mode, training,
                                              input_grad, param_dtype, has_weight, has_bias,
                                              out=out, **_guard("poison", poison))
    if dweight is None:
        dweight = state.new_empty(0, dtype=param_dtype)
    if dbias is None:
        dbias = state.new_empty(0, dtype=param_dtype)
    return dweight, dbias


@_operator(("dz",))
def backward_step_(z: Tensor, dz: Tensor, x: Optional[Tensor], state: Tensor, act: int,
                   slope: float, v_mode: int, training: bool, param_dtype: torch.dtype,
                   has_weight: bool, has_bias: bool,
                   poison: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The backward of BN + activation given the forward's ``state``: writes the input
    gradient over ``dz`` (which the caller owns) and returns ``(dweight, dbias)`` of
    ``param_dtype``, each empty where ``has_weight`` / ``has_bias`` is false. ``v_mode`` is
    the ``common.MODE_*`` code (see :func:`backward_input_` for the name)."""
    return _backward_step(z, dz, x, state, act, slope, v_mode, training, True, param_dtype,
                          has_weight, has_bias, poison)


@_operator(("out",))
def backward_step_out(z: Tensor, dz: Tensor, out: Tensor, x: Optional[Tensor], state: Tensor,
                      act: int, slope: float, v_mode: int, training: bool,
                      param_dtype: torch.dtype, has_weight: bool, has_bias: bool,
                      poison: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """:func:`backward_step_` with the input gradient written into ``out`` (a view shaped like
    ``dz``, not overlapping it) in the same pass that reads ``dz``, which is left as it was:
    for an incoming gradient that others may hold, without a copy of it first."""
    return _backward_step(z, dz, x, state, act, slope, v_mode, training, True, param_dtype,
                          has_weight, has_bias, poison, out)


@_operator(())
def parameter_gradients_step(z: Tensor, dz: Tensor, x: Optional[Tensor], state: Tensor,
                             act: int, slope: float, v_mode: int, training: bool,
                             param_dtype: torch.dtype, has_weight: bool, has_bias: bool,
                             poison: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """:func:`backward_step_` without the input gradient (nothing is written)."""
    return _backward_step(z, dz, x, state, act, slope, v_mode, training, False, param_dtype,
                          has_weight, has_bias, poison)


def _parameter_gradients(z, state, param_dtype, has_weight, has_bias):
    """The fake ``(dweight, dbias)`` of a backward step operator on the view ``z``."""
    _channels(z)
    return tuple(state.new_empty(state.shape[1] if present else 0, dtype=param_dtype)
                 for present in (has_weight, has_bias))


@backward_step_.register_fake
@parameter_gradients_step.register_fake
def _(z, dz, x, state, act, slope, v_mode, training, param_dtype, has_weight, has_bias,
      poison=None):
    return _parameter_gradients(z, state, param_dtype, has_weight, has_bias)


@backward_step_out.register_fake
def _(z, dz, out, x, state, act, slope, v_mode, training, param_dtype, has_weight, has_bias,
      poison=None):
    return _parameter_gradients(z, state, param_dtype, has_weight, has_bias)


#: Every per-kernel operator of this module, for tests and ``torch.library.opcheck``.
OPERATORS = (moments, moments_normalize_act_, moments_normalize_act_out, scale_shift_act_,
             scale_shift_act_out, backward_reduce, backward_input, backward_input_)
#: The whole-step operators.
STEP_OPERATORS = (forward_step_, forward_step_out, backward_step_, backward_step_out,
                  parameter_gradients_step)
