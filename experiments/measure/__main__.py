"""``python -m experiments.measure``: one model's training step, see :mod:`experiments.measure.step`."""
from .step import main

main()
