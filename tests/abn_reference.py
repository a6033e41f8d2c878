"""Independent reference for the ABN layers: autograd through the composite PyTorch ops."""
import torch
import torch.nn.functional as F

#: (activation, activation_param) pairs exercised by the tests.
INVERTIBLE = [("leaky_relu", 0.01), ("leaky_relu", 0.3), ("elu", 1.0), ("elu", 0.5),
              ("identity", None)]


def activate(y, activation, param):
    """The activation as PyTorch's own ops compute it."""
    if activation == "leaky_relu":
        return F.leaky_relu(y, 0.01 if param is None else param)
    if activation == "elu":
        return F.elu(y, 1.0 if param is None else param)
    if activation == "relu":
        return F.relu(y)
    return y


def composite(x, weight, bias, running_mean, running_var, training, momentum, eps, activation,
              param, scale_mode="abs"):
    """``act(F.batch_norm(x, ..., weight=scale))`` with the layer's scale parametrization."""
    scale = None
    if weight is not None:
        scale = weight.abs() + eps if scale_mode == "abs" else weight
    y = F.batch_norm(x, running_mean, running_var, scale, bias, training, momentum, eps)
    return activate(y, activation, param)


def reference_step(x, weight, bias, running_mean, running_var, grad, training=True,
                   momentum=0.1, eps=1e-5, activation="leaky_relu", param=None,
                   scale_mode="abs"):
    """Output and gradients ``(z, dx, dweight, dbias)`` of the composite, on copies.

    The running statistics passed in are updated, as the layer under test updates its own.
    """
    x = x.detach().clone().requires_grad_()
    params = [p.detach().clone().requires_grad_() if p is not None else None
              for p in (weight, bias)]
    z = composite(x, params[0], params[1], running_mean, running_var, training, momentum, eps,
                  activation, param, scale_mode)
    inputs = [x] + [p for p in params if p is not None]
    grads = list(torch.autograd.grad(z, inputs, grad))
    dx = grads.pop(0)
    dweight = grads.pop(0) if weight is not None else None
    dbias = grads.pop(0) if bias is not None else None
    return z.detach(), dx, dweight, dbias
