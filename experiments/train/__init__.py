"""The training engine every training experiment shares (DenseNet Figs. 2 left and 6,
InPlace-ABN Table 1 left; segmentation builds on it).

- :mod:`.data`: the real data sets in their released on-disk formats (CIFAR's python batches,
  ImageNet as an ImageFolder tree), small learnable generated data sets in exactly those
  formats, the papers' augmentations and evaluation crops, and the loaders (distributed
  samplers under DDP).
- :mod:`.schedules`, :mod:`.metrics`, :mod:`.checkpoint`, :mod:`.distributed`: learning-rate
  schedules, top-k / ten-crop evaluation, atomic resumable checkpoints, torchrun setup.
- :mod:`.engine`: the loop (one process or ``torchrun`` ranks with DistributedDataParallel);
  :mod:`.launch`: ``torchrun`` with the ranks forked from one import of the experiment (the
  pipeline's multi-rank CPU points).
- :mod:`.models`: the networks the experiments train, by name; :mod:`.point`: the command line
  of one training point (a model, a data set, a recipe) and its artifacts; :mod:`.parity`:
  STD-BN vs InPlace-ABN trained side by side in float64.
- :mod:`.seg_point`, :mod:`.seg_plan`, :mod:`.segmentation`: InPlace-ABN Table 2's
  segmentation points, their plan, loss, metrics and inference; :mod:`.seg_predict`: a trained
  point's predictions written for the benchmark servers (:mod:`.segmentation.submission`).
"""
