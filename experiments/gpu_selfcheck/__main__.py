"""``python -m experiments.gpu_selfcheck``: see :mod:`experiments.gpu_selfcheck.cli`."""
import sys

from .cli import main

sys.exit(main())
