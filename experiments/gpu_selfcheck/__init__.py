"""The GPU self-check: what a user with a CUDA GPU runs first (``snakemake --cores all
gpu_selfcheck``, or ``python -m experiments.gpu_selfcheck [--out DIR] [--quick] [--jobs N]``).

On the machine's current CUDA device it runs the layer tests on CUDA tensors
(:mod:`.layer_tests`), compares the ``numba.cuda`` kernels with the CPU kernels and with
PyTorch's batch norm (cuDNN) + activation for every dtype, layout, activation, layer and mode:
outputs, gradients, running statistics (:mod:`.checks`), times the kernels against a
device-to-device copy and against ``F.batch_norm`` + activation (:mod:`.timing`), and writes
``artifacts/gpu_selfcheck/<gpu name>.json`` and a one-page ``<gpu name>.md``
(:mod:`.report`, a pure function of the JSON). The command line is :mod:`.cli`. Without a GPU
it says so and exits cleanly, writing nothing.
"""
