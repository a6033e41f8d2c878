"""The self-check's timings: the InPlace-ABN kernels against a copy and against PyTorch's
batch norm + activation.

Per shape, dtype and layout, :func:`time_point` times these contenders interleaved
(:func:`experiments.measure.timing.time_interleaved`: one run of each per round, in a shuffled
order; ``torch.cuda.Event`` on a GPU), inputs prepared outside the timed region:

* ``copy``: ``dst.copy_(src)`` of one tensor of the shape, device to device: one read and one
  write of the tensor, the memory-traffic unit;
* ``forward``: the ``InPlaceABN`` training forward (batch statistics) in place, under
  ``torch.no_grad()``, on a buffer refilled from the source before each run. It must read the
  tensor twice (statistics, then normalisation) and write it once: at least 1.5 copies;
* ``backward_I`` / ``backward_II``: the backward of ``InPlaceABN`` variant I / II after an
  untimed forward. It must read ``z`` and ``dz`` twice (the reductions, then the input
  gradient) and write ``dx`` once: at least 2.5 copies;
* ``fwd_bwd_I`` / ``fwd_bwd_II`` and ``batch_norm_act``: forward + backward of ``InPlaceABN``
  and of ``F.batch_norm`` + ``F.leaky_relu``
  (:class:`experiments.bench_kernels.CompositeBatchNormAct`) through autograd.

The operations are those of ``experiments/bench_kernels.py`` (its :class:`Contenders`: leaky
ReLU 0.01, momentum 0.1, eps 1e-5; 16-bit data with float32 parameters and statistics; the
incoming gradient handed over as from a next layer, so the layers may write their input
gradient over it).
"""
import torch

from ..bench_kernels import Contenders
from ..measure.timing import time_interleaved
from .checks import DTYPES, LAYOUTS

#: Ratio name -> (floor, goal) in copies: the memory traffic the pass cannot avoid, and what an
#: H100-class GPU should reach.
BOUNDS = {
    "forward_over_copy": (1.5, 1.7),
    "backward_I_over_copy": (2.5, 2.8),
    "backward_II_over_copy": (2.5, 2.8),
}
#: The contender each ratio of :data:`BOUNDS` divides by the copy.
RATIO_OF = {"forward_over_copy": "forward", "backward_I_over_copy": "backward_I",
            "backward_II_over_copy": "backward_II"}
CONTENDERS = ("copy", "forward", "backward_I", "backward_II", "fwd_bwd_I", "fwd_bwd_II",
              "batch_norm_act")
SEED = 0


def contenders(shape, dtype, layout, device):
    """``(fns, setups)`` for :func:`time_interleaved`: the :data:`CONTENDERS` on tensors of
    ``shape``, dtype name ``dtype`` and layout name ``layout`` on ``device``."""
    generator = torch.Generator().manual_seed(SEED)
    torch_dtype = DTYPES[dtype]
    memory_format = LAYOUTS[layout]

    def tensor():
        t = torch.randn(shape, generator=generator, dtype=torch.float32)
        return t.to(device=device, dtype=torch_dtype).contiguous(memory_format=memory_format)

    c = Contenders(tensor(), tensor())

    def forward_output(module):
        def setup():
            x, box = c.fresh_input(module)()
            return module(x), box
        return setup

    def backward(inputs):
        c.backward(*inputs)

    fns = {
        "copy": c.copy,
        "forward": c.forward,
        "backward_I": backward,
        "backward_II": backward,
        "fwd_bwd_I": c.fwd_bwd(c.abn["I"]),
        "fwd_bwd_II": c.fwd_bwd(c.abn["II"]),
        "batch_norm_act": c.fwd_bwd(c.composite),
    }
    setups = {
        "forward": c.refill,
        "backward_I": forward_output(c.abn["I"]),
        "backward_II": forward_output(c.abn["II"]),
        "fwd_bwd_I": c.fresh_input(c.abn["I"]),
        "fwd_bwd_II": c.fresh_input(c.abn["II"]),
        "batch_norm_act": c.fresh_input(c.composite),
    }
    return fns, setups


def ratios(results):
    """The ratios of :data:`BOUNDS` (value, floor, goal, ``goal_met``, ``below_floor``) and the
    speedups of ``InPlaceABN`` forward + backward over ``F.batch_norm`` + activation."""
    copy = results["copy"]["median_s"]
    out = {}
    for name, (floor, goal) in BOUNDS.items():
        value = results[RATIO_OF[name]]["median_s"] / copy
        out[name] = {"value": value, "floor": floor, "goal": goal, "goal_met": value <= goal,
                     "below_floor": value < floor}
    speedups = {variant: results["batch_norm_act"]["median_s"]
                / results[f"fwd_bwd_{variant}"]["median_s"] for variant in ("I", "II")}
    return out, speedups


def time_point(shape, dtype, layout, device, warmup, repeats, l2_bytes=None):
    """One timing record: the contenders' times (seconds), the ratios and the speedups."""
    shape = tuple(shape)
    tensor_bytes = torch.Size(shape).numel() * DTYPES[dtype].itemsize
    fns, setups = contenders(shape, dtype, layout, device)
    results = time_interleaved(fns, warmup, repeats, device, setups=setups)
    bounds, speedups = ratios(results)
    return {
        "shape": list(shape),
        "dtype": dtype,
        "layout": layout,
        "tensor_bytes": tensor_bytes,
        # A tensor that fits in the L2 cache can be read again faster than from memory, so its
        # ratios may fall below the floors, which count memory traffic.
        "fits_in_l2": None if l2_bytes is None else tensor_bytes <= l2_bytes,
        "status": "pass",
        "results": results,
        "copy_bandwidth_GBps": 2 * tensor_bytes / results["copy"]["median_s"] / 1e9,
        "ratios": bounds,
        "speedup_vs_batch_norm_act": speedups,
    }


def run_timings(shapes, dtypes, layouts, device, warmup, repeats, l2_bytes=None, progress=None):
    """:func:`time_point` for every shape, dtype and layout; a point that raises (out of memory,
    a kernel error) is recorded with ``status: "error"`` and its message."""
    points = [(s, d, lay) for s in shapes for d in dtypes for lay in layouts]
    records = []
    for shape, dtype, layout in (points if progress is None else progress(points)):
        try:
            records.append(time_point(shape, dtype, layout, device, warmup, repeats, l2_bytes))
        except Exception as error:  # noqa: BLE001 - recorded, the self-check goes on
            records.append({"shape": list(shape), "dtype": dtype, "layout": layout,
                            "status": "error", "message": f"{type(error).__name__}: {error}"})
        finally:
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
    return records


__all__ = ["BOUNDS", "CONTENDERS", "contenders", "ratios", "run_timings", "time_point"]
