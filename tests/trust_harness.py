"""What the trust tests share: a small float64 network around one normalization layer, its
independent reference (the same network with every ABN layer replaced by BN + activation
through PyTorch's own ops, ``test_densenet.with_composite_norms``), and one training step run
in a given way (hooks, ``autograd.grad``, anomaly mode, checkpointing, ``torch.compile``),
which records everything a user can observe: outputs, every gradient, every buffer, and what
the hooks saw.
"""
import copy

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from model_steps import randomize_norms
from test_densenet import with_composite_norms

TOL = 1e-10


#: How :class:`ConvNormHead` lays out the norm's input.
LAYOUTS = ("contiguous", "channels_last", "slice")


class ConvNormHead(nn.Module):
    """``head(norm(conv(x)))``: the norm's input comes from a convolution (as an in-place layer
    needs) and its output gradient from another one, as inside a network. ``layout`` hands the
    norm a contiguous input, a channels-last one, or a non-contiguous slice (every other
    channel of a convolution output twice as wide: a view, not of a leaf)."""

    def __init__(self, norm, layout="contiguous"):
        super().__init__()
        channels = norm.num_features
        self.conv = nn.Conv2d(3, channels * (2 if layout == "slice" else 1), 3, padding=1)
        self.norm = norm
        self.head = nn.Conv2d(channels, 2, 1)
        self.layout = layout

    def features(self, x):
        """The norm's input."""
        y = self.conv(x)
        if self.layout == "channels_last":
            return y.contiguous(memory_format=torch.channels_last)
        return y[:, ::2] if self.layout == "slice" else y

    def forward(self, x):
        return self.head(self.norm(self.features(x)))


def layer_net(cls, channels=4, layout="contiguous", training=True, seed=0, **kwargs):
    """A float64 :class:`ConvNormHead` around ``cls(channels, **kwargs)`` with norm weights of
    both signs, and its composite reference (same state)."""
    torch.manual_seed(seed)
    net = ConvNormHead(cls(channels, **kwargs), layout).double()
    randomize_norms(net, seed)
    net.train(training)
    return net, reference_of(net)


def reference_of(model):
    """``model`` with every ABN layer replaced by its composite twin, on a copy, in
    ``model``'s mode."""
    return with_composite_norms(copy.deepcopy(model)).train(model.training)


def inputs(shape=(2, 3, 5, 6), out_channels=2, seed=1):
    """An input and an output gradient for :class:`ConvNormHead` (float64)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, dtype=torch.float64, generator=generator)
    grad = torch.randn((shape[0], out_channels, *shape[2:]), dtype=torch.float64,
                       generator=generator)
    return x, grad


# --------------------------------------------------------------------------- ways to run
def plain(model, x, grad, seen):
    """``model(x).backward(grad)``."""
    out = model(x)
    out.backward(grad)
    return out


def keep(seen, name):
    """A hook that stores the gradient it receives in ``seen[name]`` (a reference, as Grad-CAM
    keeps it: a later write into that memory would show)."""
    return lambda g: seen.__setitem__(name, g)


def output_tensor_hook(name):
    """A way in which a tensor hook on the output of ``model.<name>`` keeps its gradient."""
    def run(model, x, grad, seen):
        def hook(module, args, out):
            out.register_hook(keep(seen, f"hook: {name} output grad"))
        model.get_submodule(name).register_forward_hook(hook)
        return plain(model, x, grad, seen)
    run.__name__ = f"{name}_output_tensor_hook"
    return run


norm_output_tensor_hook = output_tensor_hook("norm")


def norm_input_tensor_hook(model, x, grad, seen):
    """A tensor hook on the norm's input keeps its gradient."""
    def hook(module, args):
        args[0].register_hook(keep(seen, "hook: norm input grad"))
    model.norm.register_forward_pre_hook(hook)
    return plain(model, x, grad, seen)


def norm_output_retain_grad(model, x, grad, seen):
    """``retain_grad()`` on the norm's output."""
    outputs = []

    def hook(module, args, out):
        out.retain_grad()
        outputs.append(out)
    model.norm.register_forward_hook(hook)
    out = plain(model, x, grad, seen)
    seen["retained: norm output grad"] = outputs[0].grad
    return out


def full_backward_hook(name):
    """A way that keeps what a full backward hook on ``model.<name>`` receives."""
    def run(model, x, grad, seen):
        def hook(module, grad_input, grad_output):
            seen[f"{name} hook: grad_input"] = grad_input[0]
            seen[f"{name} hook: grad_output"] = grad_output[0]
        model.get_submodule(name).register_full_backward_hook(hook)
        return plain(model, x, grad, seen)
    run.__name__ = f"full_backward_hook_{name}"
    return run


def autograd_grad(create_graph):
    """A way that takes the gradients with ``torch.autograd.grad`` (``create_graph`` as
    given) and stores them in ``.grad`` as ``backward`` does."""
    def run(model, x, grad, seen):
        out = model(x)
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(out, [x, *params], grad, create_graph=create_graph)
        for tensor, g in zip([x, *params], grads):
            tensor.grad = g.detach()
        return out
    run.__name__ = f"autograd_grad_create_graph_{create_graph}"
    return run


def anomaly_mode(model, x, grad, seen):
    """The step under ``torch.autograd.set_detect_anomaly(True)``."""
    with torch.autograd.set_detect_anomaly(True):
        return plain(model, x, grad, seen)


def checkpointed(use_reentrant):
    """A way that runs the norm under ``torch.utils.checkpoint``."""
    def run(model, x, grad, seen):
        y = checkpoint(model.norm, model.features(x), use_reentrant=use_reentrant)
        out = model.head(y)
        out.backward(grad)
        return out
    run.__name__ = f"checkpoint_reentrant_{use_reentrant}"
    return run


EAGER_WAYS = [plain, norm_output_tensor_hook, norm_input_tensor_hook, norm_output_retain_grad,
              full_backward_hook("head"), full_backward_hook("norm"), autograd_grad(False),
              autograd_grad(True), anomaly_mode]


def compiled(backend, placement, dynamic=False, fullgraph=True):
    """A way that runs the step with part of it under ``torch.compile(backend=backend)``.

    ``placement``: ``"outside"`` compiles the norm alone (its input comes from outside the
    graph), ``"inside"`` the whole network, ``"returned"`` the convolution and the norm (the
    norm's output is the graph's output), ``"breaks"`` the whole network with a graph break
    before and after the norm (never ``fullgraph``, else as ``fullgraph`` says).
    """
    def run(model, x, grad, seen):
        torch._dynamo.reset()
        options = dict(backend=backend, fullgraph=fullgraph and placement != "breaks",
                       dynamic=dynamic)
        if placement == "outside":
            norm = torch.compile(model.norm, **options)
            out = model.head(norm(model.features(x)))
        elif placement == "inside":
            out = torch.compile(model, **options)(x)
        elif placement == "returned":
            out = model.head(torch.compile(lambda t: model.norm(model.features(t)), **options)(x))
        else:
            out = torch.compile(_with_graph_breaks(model), **options)(x)
        out.backward(grad)
        return out
    run.__name__ = f"compile_{backend}_{placement}" + ("_dynamic" if dynamic else "")
    return run


def _with_graph_breaks(model):
    """``model``'s forward with ``torch._dynamo.graph_break()`` before and after the norm."""
    def forward(x):
        y = model.features(x)
        torch._dynamo.graph_break()
        z = model.norm(y)
        torch._dynamo.graph_break()
        return model.head(z)
    return forward


# --------------------------------------------------------------------------- results
def observe(model, x, grad, way):
    """Everything one step of ``model`` run ``way`` lets a user see: output, input and
    parameter gradients, buffers, and what ``way``'s hooks kept (read after the step)."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    seen = {}
    out = way(model, x, grad, seen)
    result = {"output": out.detach().clone(), "input grad": x.grad}
    result.update({f"grad {n}": p.grad for n, p in model.named_parameters()})
    result.update({f"buffer {n}": b.clone() for n, b in model.named_buffers()})
    result.update(seen)
    return result


def assert_same(actual, expected, tol=TOL):
    """Every entry equal to ``tol`` (relative to its scale where that exceeds 1)."""
    assert actual.keys() == expected.keys()
    for key, e in expected.items():
        a = actual[key]
        assert (a is None) == (e is None), key
        if e is None:
            continue
        scale = max(1.0, e.abs().max().item())
        error = (a.double() - e.double()).abs().max().item()
        assert error <= tol * scale, f"{key}: max error {error:.3g}"
