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
on the CPU the peak tensor memory above that before the step, tracked storage by storage:
deterministic, where a process's resident set zig-zags with the allocator; ``--no-peak``
skips it), ``lower_bound_bytes`` (what must persist for backward: convolution
outputs and per-channel statistics), ``param_count`` and the step's time (median/min/max over
``--repeats`` after ``--warmup``; cheap, the figure's subject is memory).

Memory budget (``--budget-gib``, the paper's 12 GB GPU): on CUDA the process's allocations are
capped at the budget (``torch.cuda.set_per_process_memory_fraction``), so a larger GPU answers
what fits a 12 GiB one; a step that does not fit is recorded with ``status = out_of_memory``
(the architecture's parameter count and lower bound are still given) instead of failing the
job. On the CPU the budget is recorded but not enforced (``budget_enforced = false``).

``--simulate`` (one point per implementation: ``--depths D ...`` instead of ``--depth``): the
paper's scale on any machine. Each depth's training step (forward, cross-entropy, backward, an
SGD step with momentum) is simulated on the meta device: the tensor memory by kind
(:mod:`experiments.measure.tensor_memory`), no compute, no memory. One ``kind = simulated_depth``
record per depth (``fits``: its peak within ``--budget-gib``), then the deepest depth 6n + 4
whose step fits (``kind = simulated_deepest``), found by interpolating the peak between the
depths around the budget and bisecting, up to ``--max-depth`` (``capped`` when even that
fits). The config's ``memory`` is ``simulated_meta_device``. Tensor memory leaves out the CUDA
caching allocator's rounding and fragmentation, cuDNN workspaces and the CUDA context
(``memory_not_counted``).
"""
import torch

from .measure import step as measure
from .measure import tensor_memory
from .records import point

EXPERIMENT = "densenet_fig4_memory"
GIB = 2 ** 30
OK = "ok"
OUT_OF_MEMORY = "out_of_memory"
#: measure()'s fields copied into the point's record.
MEMORY_FIELDS = ("saved_bytes", "saved_tensor_bytes", "saved_tensor_count",
                 "shared_storage_bytes", "saved_over_lower_bound", "excess_shared_storage_bytes",
                 "excess_feature_map_bytes", "excess_per_channel_bytes", "excess_not_saved_bytes",
                 "excess_tensors", "peak_bytes", "peak_baseline_bytes", "peak_method")


def parse_args(argv=None):
    p = point.parser(EXPERIMENT, "Memory of one DenseNet-BC training step at one depth, per "
                                 "implementation (DenseNet paper, Fig. 4).")
    p.add_argument("--impl", choices=measure.IMPLEMENTATIONS, required=True,
                   help="implementation (torchvision: its memory_efficient=True DenseNet)")
    p.add_argument("--depth", type=int, help="depth 6n+4 (40, 64, ..., 160, ...)")
    p.add_argument("--simulate", action="store_true",
                   help="simulate the steps on the meta device at --depths (tensor memory, no "
                        "compute) and search the deepest that fits --budget-gib")
    p.add_argument("--depths", type=int, nargs="+", help="--simulate: the depths 6n+4 to show")
    p.add_argument("--max-depth", type=int, default=1000,
                   help="--simulate: where the deepest-depth search stops (default: 1000)")
    p.add_argument("--growth-rate", type=int, default=12, help="k (default: 12)")
    p.add_argument("--batch", type=int, default=64, help="minibatch size (default: 64)")
    p.add_argument("--size", type=int, default=32, help="input height = width (default: 32)")
    p.add_argument("--budget-gib", type=float, default=None,
                   help="GPU memory budget in GiB, enforced on CUDA (default: none)")
    p.add_argument("--no-peak", action="store_true", help="skip the peak-memory measurement")
    args = p.parse_args(argv)
    point.check(p, args, positive=("depth", "growth_rate", "batch", "size", "max_depth"))
    if args.budget_gib is not None and not args.budget_gib > 0:
        p.error(f"--budget-gib {args.budget_gib}: must be > 0")
    if args.simulate:
        _check_simulated(p, args)
        return args
    if args.depth is None or args.depths is not None:
        p.error("--depth is required (and --depths only goes with --simulate)")
    try:
        args.spec, args.input_shape = measure.cifar_configuration(
            args.impl, args.depth, args.growth_rate, args.batch, args.size)
    except ValueError as error:
        p.error(str(error))
    return args


def _check_simulated(p, args):
    """The options of ``--simulate``."""
    if args.depth is not None or not args.depths:
        p.error("--simulate takes --depths (one or more), not --depth")
    if args.budget_gib is None:
        p.error("--simulate needs --budget-gib (what the deepest fitting depth is sought for)")
    if args.device != "cpu":
        p.error(f"--simulate runs on the meta device; --device {args.device} does not apply")
    for depth in [*args.depths, args.max_depth]:
        if (depth - 4) % 6 or depth < 10:
            p.error(f"depth {depth}: DenseNet-BC depths are 6n + 4 with n >= 1 (10, 16, ...)")
    if args.max_depth < max(args.depths):
        p.error(f"--max-depth {args.max_depth}: below the deepest of --depths")


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
        tensor_memory.cap_cuda_memory(budget / total, device)
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
    # The whole allocation (CUDA) or tensor memory (CPU) at the peak: model, gradients, input
    # and what the step adds.
    record["peak_total_bytes"] = (None if report["peak_bytes"] is None else
                                  report["peak_baseline_bytes"] + report["peak_bytes"])
    record.update({key: report["time"][key] for key in ("median_s", "min_s", "max_s")})
    return record, report


# --------------------------------------------------------------------------- simulated
def simulated_depth(args, depth, budget):
    """The ``simulated_depth`` record of one depth (its step simulated on the meta device)."""
    spec, shape = measure.cifar_configuration(args.impl, depth, args.growth_rate, args.batch,
                                              args.size)
    memory = measure.simulated_step_memory(spec, shape, point.DTYPES[args.dtype])
    arch = measure.architecture(spec, shape, point.DTYPES[args.dtype])
    return {"kind": "simulated_depth", "depth": depth, "param_count": arch["param_count"],
            "lower_bound_bytes": arch["lower_bound_bytes"], **memory.record(),
            "fits": memory.peak_bytes <= budget}


def _n(depth):
    """``n`` of DenseNet-BC's depth ``6n + 4`` (rounded down between two depths)."""
    return (depth - 4) // 6


def _depth(n):
    return 6 * n + 4


def _nearest_n(depth):
    """``n`` of the DenseNet-BC depth ``6n + 4`` nearest to ``depth`` (any number)."""
    return round((depth - 4) / 6)


def _interpolated(lo, hi, budget):
    """The depth strictly between the records ``lo`` (fits) and ``hi`` (does not) where the
    peak, interpolated linearly between them, meets the budget."""
    lo_peak, hi_peak = lo["tensor_peak_bytes"], hi["tensor_peak_bytes"]
    guess = lo["depth"] + (hi["depth"] - lo["depth"]) * (budget - lo_peak) / max(
        hi_peak - lo_peak, 1)
    return _depth(min(max(_nearest_n(guess), _n(lo["depth"]) + 1), _n(hi["depth"]) - 1))


def _beyond(records, lo, budget, max_depth):
    """A depth past ``lo`` (the deepest that fits, no deeper one simulated yet) likely not to
    fit: 10% past where the line through the two deepest fitting peaks meets the budget (or
    twice ``lo``'s depth), at most ``max_depth``."""
    below = [r for r in records if r["fits"] and r["depth"] < lo["depth"]]
    guess = 2 * lo["depth"]
    if below:
        prev = max(below, key=lambda r: r["depth"])
        slope = ((lo["tensor_peak_bytes"] - prev["tensor_peak_bytes"])
                 / (lo["depth"] - prev["depth"]))
        if slope > 0:
            guess = lo["depth"] + 1.1 * (budget - lo["tensor_peak_bytes"]) / slope
    return min(_depth(max(_nearest_n(guess), _n(lo["depth"]) + 1)), max_depth)


def deepest_fitting(args, budget, records):
    """Extend ``records`` (``simulated_depth`` ones) until the deepest fitting depth is known;
    return the ``simulated_deepest`` record."""
    def probe(depth):
        record = simulated_depth(args, depth, budget)
        records.append(record)
        return record

    def bracket():
        fits = [r for r in records if r["fits"]]
        fails = [r for r in records if not r["fits"]]
        lo = max(fits, key=lambda r: r["depth"]) if fits else None
        hi = min((r for r in fails if lo is None or r["depth"] > lo["depth"]),
                 key=lambda r: r["depth"], default=None)
        return lo, hi

    lo, hi = bracket()
    if lo is None:
        return {"kind": "simulated_deepest", "depth": None, "capped": False,
                "max_depth": args.max_depth, "first_failing_depth": hi["depth"]}
    while hi is None and lo["depth"] < args.max_depth:
        probe(_beyond(records, lo, budget, args.max_depth))
        lo, hi = bracket()
    # Alternately interpolate and bisect, so that a peak curved in depth still converges in a
    # few probes.
    probes = 0
    while hi is not None and _n(hi["depth"]) - _n(lo["depth"]) > 1:
        if probes % 2 == 0:
            probe(_interpolated(lo, hi, budget))
        else:
            probe(_depth((_n(lo["depth"]) + _n(hi["depth"])) // 2))
        probes += 1
        lo, hi = bracket()
    return {"kind": "simulated_deepest", "depth": lo["depth"], "param_count": lo["param_count"],
            "tensor_peak_bytes": lo["tensor_peak_bytes"], "capped": hi is None,
            "max_depth": args.max_depth,
            "first_failing_depth": None if hi is None else hi["depth"]}


def run_simulated(args):
    """The ``--simulate`` point: every depth of ``--depths``, then the deepest that fits."""
    point.setup(args)
    budget = int(args.budget_gib * GIB)
    records = [simulated_depth(args, depth, budget) for depth in sorted(set(args.depths))]
    deepest = deepest_fitting(args, budget, records)
    config = {"impl": args.impl, "model": "densenet_bc", "growth_rate": args.growth_rate,
              "batch": args.batch, "size": args.size, "memory_budget_gib": args.budget_gib,
              "budget_bytes": budget, "budget_enforced": False,
              "memory": tensor_memory.SIMULATED_METHOD,
              "memory_not_counted": tensor_memory.NOT_COUNTED}
    return config, [*sorted(records, key=lambda r: r["depth"]), deepest], None


# --------------------------------------------------------------------------- the point
def run(args):
    """Measure the point; return the artifact's ``(config, results)`` and the full report of
    :func:`experiments.measure.measure` (``None`` when out of memory)."""
    if args.simulate:
        return run_simulated(args)
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
    if config.get("memory") == tensor_memory.SIMULATED_METHOD:
        deepest = results[-1]
        found = ("no depth fits" if deepest["depth"] is None else
                 f"deepest fitting depth {deepest['depth']}"
                 + (f" (search capped at {deepest['max_depth']})" if deepest["capped"] else ""))
        peaks = ", ".join(f"{r['depth']}: {r['tensor_peak_bytes'] / GIB:.2f}"
                          for r in results[:-1])
        return (f"{config['impl']}, batch {config['batch']}, simulated tensor memory (GiB) by "
                f"depth: {peaks}; {found} within {config['memory_budget_gib']:g} GiB")
    if report is None:
        return f"{config['impl']} depth {config['depth']}: out of memory ({results[0]['error']})"
    return measure.format_summary(report)


def main(argv=None):
    point.main(EXPERIMENT, parse_args, run, summarize, argv)


if __name__ == "__main__":
    main()
