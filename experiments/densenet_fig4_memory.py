"""DenseNet paper, Fig. 4: the memory of a DenseNet-BC training step as a function of depth, per
implementation.

Run as ``python -m experiments.densenet_fig4_memory --impl naive|shared|checkpoint|torchvision
--depth D [--growth-rate K] [--batch N] [--size S] [--budget-gib G] [--no-peak]
[--device cpu|cuda] [--threads T] [--warmup W] [--repeats R] --out PATH``. One point is one
implementation at one depth, in a process of its own: on a GPU a point that does not fit stops
only itself, and the peak of one cannot inherit the allocator state of another.

The paper (p. 6, Sec. 5, Fig. 4) plots the GPU memory of DenseNet-BC (k = 12, 32x32 inputs)
against depth for a naive implementation (concatenation and batch-norm outputs stored per
layer: quadratic in depth) and for shared storages (linear): 160 naive layers take about ten
times the memory of 40, shared storage needs 22% of naive at 160 layers (LuaTorch), and the
efficient PyTorch code trains nearly 500 layers on one 12 GB GPU. Implementations
(:data:`experiments.measure.IMPLEMENTATIONS`): ``naive``, ``shared`` (the paper's method),
``checkpoint`` (``torch.utils.checkpoint`` per layer) from :mod:`layers.densenet`, and
``torchvision`` (torchvision's ``DenseNet(memory_efficient=True)`` with the same CIFAR stem and
weights), the outside reference.

Measured by :func:`experiments.measure.measure` (one training step, forward + backward):
``saved_bytes`` (what autograd keeps after the forward, saved-tensor hooks, plus the shared
storages), ``peak_bytes`` (on CUDA ``max_memory_allocated`` above the memory before the step;
on the CPU the peak resident set of a fresh subprocess above its resident set before the step;
``--no-peak`` skips it), ``lower_bound_bytes`` (what must persist for backward: convolution
outputs and per-channel statistics), ``param_count`` and the step's time (median/min/max over
``--repeats`` after ``--warmup``; cheap, the figure's subject is memory).

Memory budget (``--budget-gib``, the paper's 12 GB GPU): on CUDA the process's allocations are
capped at the budget (``torch.cuda.set_per_process_memory_fraction``), so a larger GPU answers
what fits a 12 GiB one; a step that does not fit is recorded with ``status = out_of_memory``
(the architecture's parameter count and lower bound are still given) instead of failing the
job. On the CPU the budget is recorded but not enforced (``budget_enforced = false``).
"""
import torch

from .measure import step as measure
from .records import point

EXPERIMENT = "densenet_fig4_memory"
GIB = 2 ** 30
OK = "ok"
OUT_OF_MEMORY = "out_of_memory"
#: measure()'s fields copied into the point's record.
MEMORY_FIELDS = ("saved_bytes", "saved_tensor_bytes", "saved_tensor_count",
                 "shared_storage_bytes", "saved_over_lower_bound", "peak_bytes",
                 "peak_baseline_bytes", "peak_method")


def parse_args(argv=None):
    p = point.parser(EXPERIMENT, "Memory of one DenseNet-BC training step at one depth, per "
                                 "implementation (DenseNet paper, Fig. 4).")
    p.add_argument("--impl", choices=measure.IMPLEMENTATIONS, required=True,
                   help="implementation (torchvision: its memory_efficient=True DenseNet)")
    p.add_argument("--depth", type=int, required=True, help="depth 6n+4 (40, 64, ..., 160, ...)")
    p.add_argument("--growth-rate", type=int, default=12, help="k (default: 12)")
    p.add_argument("--batch", type=int, default=64, help="minibatch size (default: 64)")
    p.add_argument("--size", type=int, default=32, help="input height = width (default: 32)")
    p.add_argument("--budget-gib", type=float, default=None,
                   help="GPU memory budget in GiB, enforced on CUDA (default: none)")
    p.add_argument("--no-peak", action="store_true", help="skip the peak-memory measurement")
    args = p.parse_args(argv)
    point.check(p, args, positive=("depth", "growth_rate", "batch", "size"))
    if args.budget_gib is not None and not args.budget_gib > 0:
        p.error(f"--budget-gib {args.budget_gib}: must be > 0")
    try:
        args.spec, args.input_shape = measure.cifar_configuration(
            args.impl, args.depth, args.growth_rate, args.batch, args.size)
    except ValueError as error:
        p.error(str(error))
    return args


def apply_budget(budget_gib, device):
    """Cap this process's CUDA allocations at ``budget_gib`` (if the GPU is larger); return the
    config fields ``budget_bytes``, ``budget_enforced`` and ``device_memory_bytes``.

    Call it before anything is allocated on the device. Without a budget, or on the CPU, nothing
    is enforced; a GPU smaller than the budget is its own, stricter, limit.
    """
    budget = None if budget_gib is None else int(budget_gib * GIB)
    if device.type != "cuda":
        return {"budget_bytes": budget, "budget_enforced": False, "device_memory_bytes": None}
    total = torch.cuda.get_device_properties(device).total_memory
    enforced = budget is not None and budget < total
    if enforced:
        torch.cuda.set_per_process_memory_fraction(budget / total, device)
    return {"budget_bytes": budget, "budget_enforced": enforced, "device_memory_bytes": total}


def measure_point(spec, input_shape, device, dtype, warmup, repeats, peak, threads):
    """The point's record: :func:`experiments.measure.measure`'s memory fields and time, or,
    when the step does not fit the CUDA device (or budget), ``status = out_of_memory`` with
    the fields that need no memory (parameters, lower bound) and the others ``None``."""
    record = {"status": OK, "error": None,
              **measure.architecture(spec, input_shape, dtype)}
    try:
        report = measure.measure(spec, input_shape, device, dtype, warmup, repeats, peak=peak,
                                 threads=threads)
    except torch.cuda.OutOfMemoryError as error:
        record.update(status=OUT_OF_MEMORY, error=str(error).splitlines()[0],
                      **dict.fromkeys(MEMORY_FIELDS), peak_total_bytes=None, median_s=None,
                      min_s=None, max_s=None)
        return record, None
    record.update({key: report[key] for key in MEMORY_FIELDS})
    cuda_peak = report["peak_method"] == "cuda_max_memory_allocated"
    # On CUDA the whole allocation at the peak (model, gradients, input and the step); on the
    # CPU the resident set also holds the libraries, so no total is given.
    record["peak_total_bytes"] = (report["peak_baseline_bytes"] + report["peak_bytes"]
                                  if cuda_peak else None)
    record.update({key: report["time"][key] for key in ("median_s", "min_s", "max_s")})
    return record, report


def run(args):
    """Measure the point; return the artifact's ``(config, results)`` and the full report of
    :func:`experiments.measure.measure` (``None`` when out of memory)."""
    device, dtype = point.setup(args)
    budget = apply_budget(args.budget_gib, device)
    record, report = measure_point(args.spec, args.input_shape, device, dtype, args.warmup,
                                   args.repeats, not args.no_peak, args.threads)
    config = {"impl": args.impl, "model": args.spec.model, "depth": args.depth,
              "growth_rate": args.growth_rate, "batch": args.batch, "size": args.size,
              "memory_budget_gib": args.budget_gib, **budget, "peak": not args.no_peak}
    return config, [record], report


def summarize(config, results, report):
    """The measurement's summary, or the out-of-memory error."""
    if report is None:
        return f"{config['impl']} depth {config['depth']}: out of memory ({results[0]['error']})"
    return measure.format_summary(report)


def main(argv=None):
    point.main(EXPERIMENT, parse_args, run, summarize, argv)


if __name__ == "__main__":
    main()
