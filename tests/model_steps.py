"""What the model-level tests share: norm layers moved off their defaults, and one training
step's outputs, gradients and buffers, to compare two implementations of one network."""
import torch

import layers


def randomize_norms(model, seed=0, negative=0.2, bias_scale=0.1):
    """Give every affine norm layer weights of both signs (a share ``negative`` of them below
    zero, all with ``|w| >= 0.5``), biases of scale ``bias_scale`` and running statistics off
    their defaults; returns ``model``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, layers.NORM_TYPES) and module.affine:
                c = module.num_features
                sign = torch.where(torch.rand(c, generator=generator) < negative, -1.0, 1.0)
                module.weight.copy_(sign * (0.5 + torch.rand(c, generator=generator)))
                module.bias.copy_(torch.randn(c, generator=generator) * bias_scale)
                if module.running_mean is not None:
                    module.running_mean.copy_(torch.randn(c, generator=generator) * 0.1)
                    module.running_var.copy_(0.5 + torch.rand(c, generator=generator))
    return model


def step(model, x, grad):
    """Output, input and parameter gradients of one forward + backward, and the buffers."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    out = model(x)
    out.backward(grad)
    result = {"output": out.detach(), "input grad": x.grad}
    result.update({f"grad {n}": p.grad for n, p in model.named_parameters()})
    result.update({f"buffer {n}": b.clone() for n, b in model.named_buffers()})
    return result
