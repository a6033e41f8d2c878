"""Measurement: time per step (:mod:`.timing`), bytes autograd saves for backward
(:mod:`.saved_tensors`), the memory and time of one model's training step (:mod:`.step`, also
the command line ``python -m experiments.measure``) and the BN+ACT+CONV blocks of InPlace-ABN's
Table 1 (:mod:`.blocks`)."""
