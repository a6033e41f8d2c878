"""A spy on the ABN layers' backward: which calls wrote the outgoing gradient over the incoming
one (only the shared-storage layers may, over a gradient they made themselves; see
:func:`layers.functional.normalize_activate_backward`)."""
import layers


def spy_in_place_backward(monkeypatch):
    """The backward calls whose input gradient took the incoming gradient's memory, as a list
    (each entry: that memory's address) that fills as backward passes run.

    It watches what the backward returns, not which kernel ran, so it sees the in-place write
    on every path (the CPU backend's whole steps, the custom operators).
    """
    calls = []
    original = layers.functional.normalize_activate_backward

    def spying(z, dz, *args, **kwargs):
        incoming = dz.data_ptr()
        grads = original(z, dz, *args, **kwargs)
        if grads[0] is not None and grads[0].data_ptr() == incoming:
            calls.append(incoming)
        return grads

    monkeypatch.setattr(layers.functional, "normalize_activate_backward", spying)
    return calls
