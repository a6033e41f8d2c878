"""The self-check's numerical checks: the layers on a device against the CPU kernels and against
PyTorch's batch norm.

A :class:`Case` is one layer configuration (``ABN``, ``InPlaceABN`` variant I or II; an
activation; a dtype; a memory layout; training or eval). :func:`run_case` runs its forward and
backward on ``device`` and compares, quantity by quantity (output, input / weight / bias
gradients, running mean and variance), with two references:

* ``cpu_kernels``: the same layer, parameters, statistics and data on the CPU (the
  ``numba.njit`` kernels). For a 16-bit dtype the CPU runs that dtype where the layers accept
  it on the CPU (:func:`accepts`); otherwise it runs float32 on the same values (every 16-bit
  value is a float32) and the record says so in ``reference_dtype``.
* ``torch_batch_norm``: ``F.batch_norm`` (cuDNN, or PyTorch's own CUDA kernel, as PyTorch
  chooses) with the layer's scale ``|weight| + eps``, then the activation, differentiated by
  autograd, on ``device``.

Besides, every case records whether the output keeps the input's memory layout (``layout``) and,
for ``InPlaceABN``, whether it was written into the input's storage (``in_place``).

Each comparison is one record (:func:`compare`): ``max_abs_error``, ``max_rel_error`` (relative
to the largest ``|expected|``) and the tolerance ``atol + rtol * max|expected|`` of the data's
dtype (:data:`TOLERANCES`; the running statistics, kept in float32 for 16-bit data, take
float32's). Everything here is device-agnostic, so the tests run it on CPU tensors.
"""
import dataclasses
import itertools
import math
import traceback

import torch
import torch.nn.functional as F

import layers

#: name -> torch dtype of the inputs the self-check runs.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}
#: Memory layouts of the (N, C, H, W) inputs.
LAYOUTS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}
#: (activation, activation_param) of the checked layers.
ACTIVATIONS = (("leaky_relu", 0.01), ("elu", 1.0), ("identity", None))
#: (module name, variant) of the checked layers.
LAYERS = (("ABN", None), ("InPlaceABN", "I"), ("InPlaceABN", "II"))
MOMENTUM = 0.1
EPS = 1e-5

#: dtype name -> (atol, rtol): a comparison passes when ``max |actual - expected| <= atol + rtol
#: * max |expected|``. A few units in the last place of the dtype: float16 has an epsilon of
#: 9.8e-4, bfloat16 of 7.8e-3; float64 and float32 leave room for other summation orders.
TOLERANCES = {
    "float64": (1e-12, 1e-9),
    "float32": (1e-6, 1e-4),
    "float16": (1e-5, 5e-3),
    "bfloat16": (1e-4, 3e-2),
}
#: The quantities compared with each reference; the running statistics are float32 for 16-bit
#: data (the layers keep their parameters and statistics in float32 there).
QUANTITIES = ("output", "grad_input", "grad_weight", "grad_bias", "running_mean", "running_var")
STATISTICS = ("running_mean", "running_var")
REFERENCES = ("cpu_kernels", "torch_batch_norm")
STATUSES = ("pass", "fail", "error", "skipped")


# --------------------------------------------------------------------------- cases
@dataclasses.dataclass(frozen=True)
class Case:
    """One layer configuration of the check matrix."""

    layer: str                    # "ABN" or "InPlaceABN"
    variant: str | None           # "I" / "II" for InPlaceABN, None for ABN
    activation: str
    activation_param: float | None
    dtype: str                    # a key of DTYPES
    layout: str                   # a key of LAYOUTS
    training: bool

    @property
    def name(self):
        layer = self.layer if self.variant is None else f"{self.layer}-{self.variant}"
        mode = "train" if self.training else "eval"
        return f"{layer}/{self.activation}/{self.dtype}/{self.layout}/{mode}"

    def describe(self):
        """The case as a JSON-serialisable dict (its fields and its name)."""
        return {"name": self.name, **dataclasses.asdict(self)}


def cases(dtypes=tuple(DTYPES), layouts=tuple(LAYOUTS), activations=ACTIVATIONS,
          layer_kinds=LAYERS, modes=(True, False)):
    """Every combination of the given dtypes, layouts, activations, layers and modes."""
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
    for layout in layouts:
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r} is not supported; allowed: {', '.join(LAYOUTS)}")
    return [Case(layer, variant, act, param, dtype, layout, training)
            for dtype, layout, (act, param), (layer, variant), training
            in itertools.product(dtypes, layouts, activations, layer_kinds, modes)]


# --------------------------------------------------------------------------- comparison
def tolerance(dtype, quantity="output"):
    """``(atol, rtol)`` of ``quantity`` for data of dtype name ``dtype``."""
    if quantity in STATISTICS and dtype in ("float16", "bfloat16"):
        dtype = "float32"
    return TOLERANCES[dtype]


def compare(actual, expected, atol, rtol):
    """How far ``actual`` is from ``expected`` (tensors of any dtype and device).

    Returns ``dict(status, max_abs_error, max_rel_error, bound, atol, rtol, message)``: the
    status is ``"pass"`` when the shapes agree, the non-finite entries are the same and
    ``max |actual - expected| <= bound = atol + rtol * max |expected|``, else ``"fail"``.
    ``max_rel_error`` is the largest error over the largest ``|expected|`` (``None`` when that is
    0). Errors are taken over the entries that are finite in both.
    """
    out = {"status": "fail", "max_abs_error": None, "max_rel_error": None, "bound": None,
           "atol": atol, "rtol": rtol, "message": None}
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if a.shape != e.shape:
        out["message"] = f"shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        return out
    finite_a, finite_e = torch.isfinite(a), torch.isfinite(e)
    both = finite_a & finite_e
    scale = e[finite_e].abs().max().item() if finite_e.any() else 0.0
    max_abs = (a[both] - e[both]).abs().max().item() if both.any() else 0.0
    out["max_abs_error"] = max_abs
    out["max_rel_error"] = max_abs / scale if scale > 0 else None
    out["bound"] = atol + rtol * scale
    same_non_finite = (a.isnan() & e.isnan()) | (a == e)  # both NaN, or the same infinity
    mismatched = int(((finite_a != finite_e) | (~finite_a & ~finite_e & ~same_non_finite)).sum())
    if mismatched:
        out["message"] = f"{mismatched} non-finite value(s) where the reference differs"
        return out
    if not math.isfinite(max_abs) or max_abs > out["bound"]:
        return out
    out["status"] = "pass"
    return out


def record(case, reference, quantity, result, reference_dtype=None):
    """One check record: the case, what it is compared with, and :func:`compare`'s result."""
    return {
        "name": f"{case.name}: {quantity} vs {reference}",
        "case": case.describe(),
        "reference": reference,
        "reference_dtype": reference_dtype,
        "quantity": quantity,
        **result,
    }


def _flag(passed, message):
    """A record body for a yes/no check (no error to measure)."""
    return {"status": "pass" if passed else "fail", "max_abs_error": None, "max_rel_error": None,
            "bound": None, "atol": None, "rtol": None, "message": None if passed else message}


def _outcome(status, message):
    return {"status": status, "max_abs_error": None, "max_rel_error": None, "bound": None,
            "atol": None, "rtol": None, "message": message}


# --------------------------------------------------------------------------- data and layers
def make_data(shape, seed=0):
    """Float64 CPU tensors of one check: input, incoming gradient, parameters, statistics.

    Weights of both signs (the ``|weight| + eps`` scale's gradient has the weight's sign),
    away from 0; positive running variances.
    """
    generator = torch.Generator().manual_seed(seed)
    channels = shape[1]
    options = dict(dtype=torch.float64, generator=generator)
    signs = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(channels)[:channels]
    return {
        "x": torch.randn(shape, **options) * 2 + 0.5,
        "dz": torch.randn(shape, **options),
        "weight": torch.empty(channels, dtype=torch.float64).uniform_(0.5, 2, generator=generator)
        * signs,
        "bias": torch.randn(channels, **options),
        "running_mean": torch.randn(channels, **options) * 0.5,
        "running_var": torch.rand(channels, **options) + 0.5,
    }


def parameter_dtype(dtype):
    """The dtype of the layers' parameters and statistics for data of dtype ``dtype``:
    float64 for float64 data, float32 otherwise (16-bit data keeps them in float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def build_layer(case, data, device):
    """The case's module on ``device``, its parameters and statistics from ``data``."""
    cls = getattr(layers, case.layer)
    kwargs = dict(activation=case.activation, activation_param=case.activation_param,
                  momentum=MOMENTUM, eps=EPS)
    if case.variant is not None:
        kwargs["variant"] = case.variant
    layer = cls(data["weight"].numel(), **kwargs)
    layer.to(device=device, dtype=parameter_dtype(DTYPES[case.dtype]))
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(layer, name).copy_(data[name])
    return layer.train(case.training)


def _laid_out(t, case, device, dtype=None):
    """``t`` rounded to the case's dtype, then held in ``dtype`` (default: the case's), on
    ``device`` in the case's layout: the same values whatever ``dtype`` holds them."""
    t = t.to(DTYPES[case.dtype]).to(device=device, dtype=dtype)
    return t.contiguous(memory_format=LAYOUTS[case.layout])


def run_layer(case, data, device, dtype=None):
    """Forward and backward of the case's layer on ``device``, on the case's data (rounded to
    its dtype) held in ``dtype`` (default: the case's); returns ``(quantities, flags)``: the
    tensors of :data:`QUANTITIES` and the ``layout`` / ``in_place`` facts."""
    layer = build_layer(case, data, device)
    x = _laid_out(data["x"], case, device, dtype)
    dz = _laid_out(data["dz"], case, device, dtype)
    leaf = x.clone().requires_grad_()
    source = leaf.clone()  # a non-leaf, as an in-place layer needs; clone keeps the layout
    out = layer(source)
    flags = {"layout": out.is_contiguous(memory_format=LAYOUTS[case.layout]),
             "in_place": out.data_ptr() == source.data_ptr()}
    dx, dweight, dbias = torch.autograd.grad(out, [leaf, layer.weight, layer.bias], dz)
    quantities = {"output": out.detach(), "grad_input": dx, "grad_weight": dweight,
                  "grad_bias": dbias, "running_mean": layer.running_mean.detach().clone(),
                  "running_var": layer.running_var.detach().clone()}
    return quantities, flags


def activate(y, activation, param):
    """The activation as PyTorch's own functions compute it."""
    if activation == "leaky_relu":
        return F.leaky_relu(y, param)
    if activation == "elu":
        return F.elu(y, param)
    if activation == "identity":
        return y
    raise ValueError(f"activation {activation!r} has no reference here")


def torch_reference(case, data, device):
    """The case through ``F.batch_norm`` + the activation and autograd, on ``device``: the same
    :data:`QUANTITIES` as :func:`run_layer`."""
    dtype = DTYPES[case.dtype]
    options = dict(device=device, dtype=parameter_dtype(dtype))
    x = _laid_out(data["x"], case, device).requires_grad_()
    dz = _laid_out(data["dz"], case, device)
    weight = data["weight"].to(**options).requires_grad_()
    bias = data["bias"].to(**options).requires_grad_()
    running_mean = data["running_mean"].to(**options)
    running_var = data["running_var"].to(**options)
    scale = weight.abs() + EPS  # the layers' default scale_mode="abs"
    y = F.batch_norm(x, running_mean, running_var, scale, bias, case.training, MOMENTUM, EPS)
    z = activate(y, case.activation, case.activation_param)
    dx, dweight, dbias = torch.autograd.grad(z, [x, weight, bias], dz)
    return {"output": z.detach(), "grad_input": dx, "grad_weight": dweight, "grad_bias": dbias,
            "running_mean": running_mean, "running_var": running_var}


_ACCEPTS = {}


def accepts(device, dtype):
    """``(True, None)`` if the layers take inputs of ``dtype`` on ``device``, else ``(False,
    reason)``: the ``TypeError`` a tiny forward raises. Cached per device type and dtype."""
    key = (torch.device(device).type, dtype)
    if key not in _ACCEPTS:
        layer = layers.ABN(1).to(device=device, dtype=parameter_dtype(dtype))
        try:
            with torch.no_grad():
                layer(torch.ones(2, 1, 2, device=device, dtype=dtype))
            _ACCEPTS[key] = (True, None)
        except TypeError as error:
            _ACCEPTS[key] = (False, f"{type(error).__name__}: {error}")
    return _ACCEPTS[key]


def cpu_reference_dtype(dtype):
    """The dtype the CPU reference runs data of ``dtype`` in: ``dtype`` itself where the layers
    accept it on the CPU, else float32 (which holds every 16-bit value exactly)."""
    return dtype if accepts("cpu", dtype)[0] else torch.float32


def _error_text(error):
    return "".join(traceback.format_exception_only(type(error), error)).strip()


# --------------------------------------------------------------------------- one case
def run_case(case, data, device):
    """Every check record of ``case`` on ``device`` (see the module docstring)."""
    dtype = DTYPES[case.dtype]
    ok, reason = accepts(device, dtype)
    if not ok:
        return [record(case, reference, "run",
                       _outcome("skipped", f"the layers refuse {case.dtype} on "
                                f"{torch.device(device).type}: {reason}"))
                for reference in REFERENCES]
    try:
        actual, flags = run_layer(case, data, device)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)  # a kernel's asynchronous error belongs to this case
    except Exception as error:  # noqa: BLE001 - recorded, the self-check goes on
        return [record(case, "layer", "run", _outcome("error", _error_text(error)))]

    records = [record(case, "input", "layout",
                      _flag(flags["layout"], f"the output is not {case.layout}"))]
    if case.layer == "InPlaceABN":
        records.append(record(case, "input", "in_place", _flag(
            flags["in_place"], "the output is not written into the input's storage")))

    cpu_dtype = cpu_reference_dtype(dtype)
    references = {
        "cpu_kernels": (lambda: run_layer(case, data, "cpu", cpu_dtype)[0],
                        str(cpu_dtype).replace("torch.", "")),
        "torch_batch_norm": (lambda: torch_reference(case, data, device), case.dtype),
    }
    for reference, (compute, reference_dtype) in references.items():
        try:
            expected = compute()
        except Exception as error:  # noqa: BLE001
            records.append(record(case, reference, "run", _outcome("error", _error_text(error)),
                                  reference_dtype))
            continue
        for quantity in QUANTITIES:
            result = compare(actual[quantity], expected[quantity],
                             *tolerance(case.dtype, quantity))
            records.append(record(case, reference, quantity, result, reference_dtype))
    return records


def run_checks(shape, device, case_list=None, seed=0, progress=None):
    """The records of every case of ``case_list`` (default: :func:`cases`) on ``device``, all on
    the same data of ``shape`` (N, C, H, W). ``progress`` (optional) wraps the case list."""
    if len(shape) != 4:
        raise ValueError(f"shape {tuple(shape)}: the checks take (N, C, H, W) inputs "
                         "(channels_last needs 4 dimensions)")
    data = make_data(shape, seed)
    case_list = cases() if case_list is None else case_list
    records = []
    for case in (case_list if progress is None else progress(case_list)):
        try:
            records.extend(run_case(case, data, device))
        except Exception as error:  # noqa: BLE001 - e.g. a kernel that does not compile
            records.append(record(case, "layer", "run", _outcome("error", _error_text(error))))
    return records


def count(records):
    """``{status: number of records}`` for every status of :data:`STATUSES`."""
    counts = dict.fromkeys(STATUSES, 0)
    for r in records:
        counts[r["status"]] += 1
    return counts


__all__ = ["ACTIVATIONS", "Case", "DTYPES", "LAYERS", "LAYOUTS", "QUANTITIES", "REFERENCES",
           "STATUSES", "TOLERANCES", "accepts", "cases", "compare", "count", "cpu_reference_dtype",
           "make_data",
           "record", "run_case", "run_checks", "run_layer", "tolerance", "torch_reference"]
