"""Tensor memory by kind (experiments.measure.tensor_memory): the tracker against hand counts,
and the simulated (meta device) step against the tracked real step of every model family."""
import pytest
import torch
import torch.nn.functional as F

from experiments.measure import tensor_memory
from experiments.measure.step import ModelSpec, simulated_step_memory
from experiments.measure.tensor_memory import TensorMemoryTracker, step_memory
from layers import deeplabv3, densenet

FLOAT = 4


def test_tracker_counts_new_storages_views_in_place_and_frees():
    x = torch.zeros(1000)
    with TensorMemoryTracker() as tracker:
        y = x * 2  # new: 4000 bytes
        y.add_(1)  # in place: not new
        view = y[:10]  # a view: not new
        z = torch.cat([y, y])  # new: 8000
        assert tracker.total == 12000
        del z
        assert tracker.total == 4000
        del y, view
    assert (tracker.total, tracker.peak) == (0, 12000)
    assert tracker.peak_by_kind()[tensor_memory.TRANSIENT] == 12000


def test_tracker_marks_what_autograd_saves_until_it_lets_go():
    w = torch.randn(100, requires_grad=True)
    tracker = TensorMemoryTracker()
    tracker.register([w], tensor_memory.PARAMETERS)
    with tracker, tracker.saving():
        h = w * 3  # new, saved by nothing (mul by a constant saves no tensor)
        s = torch.sigmoid(h)  # new, saved by sigmoid's backward (its output)
        live = tracker.live_by_kind()
        assert live[tensor_memory.SAVED] == 100 * FLOAT
        assert live[tensor_memory.TRANSIENT] == 100 * FLOAT
        assert live[tensor_memory.PARAMETERS] == 100 * FLOAT
        s.sum().backward()  # frees the graph: sigmoid's output is no longer saved
        live = tracker.live_by_kind()
        assert live[tensor_memory.SAVED] == 0
        assert live[tensor_memory.TRANSIENT] == 3 * 100 * FLOAT  # h, s and the new w.grad
    del h, s


def test_register_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="kind='weights'"):
        TensorMemoryTracker().register([torch.zeros(1)], "weights")


def densenet_case(impl, norm):
    return (lambda: densenet.densenet_bc(16, 4, impl=impl, norm=norm), (4, 3, 16, 16), None)


def deeplab_case(body, norm):
    return (lambda: deeplabv3(body, num_classes=5, norm=norm, width=0.0625), (2, 3, 32, 32), 5)


CASES = {f"densenet-{impl}-{norm}": densenet_case(impl, norm)
         for impl in densenet.IMPLS for norm in ("bn", "iabn")
         if not (impl in densenet.INPLACE_IMPLS and norm == "bn")}
CASES.update({f"deeplabv3-{body}-{norm}": deeplab_case(body, norm)
              for body in ("resnext101", "wideresnet38") for norm in ("bn", "iabn")})


def one_step(build, shape, classes, device):
    torch.manual_seed(0)
    with torch.device(device):
        model = build().train()
        x = torch.randn(shape)
        labels = (torch.zeros(shape[0], dtype=torch.long) if classes is None
                  else torch.zeros((shape[0], *shape[2:]), dtype=torch.long))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9, weight_decay=1e-4)
    return step_memory(model, (x, labels), lambda m, x, t: F.cross_entropy(m(x), t),
                       optimizer)


@pytest.mark.parametrize("case", list(CASES))
def test_simulated_step_equals_the_tracked_real_step(case):
    build, shape, classes = CASES[case]
    real = one_step(build, shape, classes, "cpu")
    simulated = one_step(build, shape, classes, "meta")
    assert not real.simulated and simulated.simulated
    assert simulated.peak_bytes == pytest.approx(real.peak_bytes, rel=0.01)
    for kind in tensor_memory.KINDS:
        assert simulated.peak_by_kind[kind] == pytest.approx(real.peak_by_kind[kind], rel=0.01,
                                                             abs=1024), kind
    assert sum(real.peak_by_kind.values()) == real.peak_bytes


def test_step_kinds_follow_the_model():
    build, shape, classes = CASES["densenet-shared-iabn"]
    memory = one_step(build, shape, classes, "meta")
    with torch.device("meta"):
        model = build()
    param_bytes = sum(p.numel() for p in model.parameters()) * FLOAT
    kinds = memory.peak_by_kind
    assert kinds[tensor_memory.GRADIENTS] == param_bytes
    assert kinds[tensor_memory.OPTIMIZER_STATE] == param_bytes  # one momentum buffer each
    assert kinds[tensor_memory.BATCH] == 4 * 3 * 16 * 16 * FLOAT + 4 * 8
    # the two shared storages are made in the first (tracked) forward and outlive the step
    assert kinds[tensor_memory.KEPT] > 0
    assert kinds[tensor_memory.SAVED] > 0


def test_simulated_paper_scale_step_needs_no_memory():
    """DenseNet-BC-250 at batch 64: gigabytes simulated, nothing allocated."""
    memory = simulated_step_memory(ModelSpec("densenet_bc", 250, 24, impl="naive"),
                                   (64, 3, 32, 32))
    assert memory.simulated and memory.peak_bytes > 2 ** 30
    fields = memory.record()
    assert fields["tensor_memory_method"] == "simulated_meta_device"
    assert "CUDA caching allocator" in fields["tensor_memory_not_counted"]
