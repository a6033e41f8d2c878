"""The networks the training experiments train, built by name.

:func:`build_model` maps a name and keyword arguments from a profile to one of the
:mod:`layers` constructors, with ``norm`` in ``bn``, ``iabn``, ``iabn_sync`` and the data set's
class count. Names are those of the papers' tables (``resnext101``, ``densenet264``, ...);
``densenet_bc`` is the CIFAR DenseNet-BC of DenseNet Fig. 2.
"""
import layers

#: name -> the ``layers`` constructor (looked up by name, so the table stays readable).
BUILDERS = {
    "densenet_bc": "densenet_bc",
    "densenet232": "densenet232",
    "densenet264": "densenet264",
    "resnext101": "resnext101",
    "resnext152": "resnext152",
    "wideresnet38": "wideresnet38",
}


def build_model(name, *, norm, num_classes, **kwargs):
    """``layers.<name>(norm=norm, num_classes=num_classes, **kwargs)``.

    Raises ``ValueError`` naming the argument for an unknown model or keyword (a profile's
    ``model_args`` typo must not pass silently).
    """
    if name not in BUILDERS:
        raise ValueError(f"model={name!r}: expected one of {sorted(BUILDERS)}")
    builder = getattr(layers, BUILDERS[name])
    try:
        return builder(norm=norm, num_classes=num_classes, **kwargs)
    except TypeError as error:
        raise ValueError(f"model_args={kwargs!r} for model={name!r}: {error}") from error


def parameter_count(model):
    """Number of parameters of ``model`` (the x-axis of DenseNet Fig. 6)."""
    return sum(p.numel() for p in model.parameters())


__all__ = ["BUILDERS", "build_model", "parameter_count"]
