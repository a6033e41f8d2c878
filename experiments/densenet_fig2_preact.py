"""DenseNet paper, Fig. 2 (left): CIFAR error of DenseNet-BC-100 (k = 12) with pre- vs
post-activation batch normalization.

Run as ``python -m experiments.densenet_fig2_preact --dataset cifar10 --data ROOT
--model-arg depth=100 --model-arg growth_rate=12 [--model-arg preact=false] --epochs 300
--batch 64 --schedule cifar --out ... --epochs-csv ... --weights ... --work-dir ...``; one point
is one data set and one activation order (:mod:`experiments.train.point` has every option).

The paper (p. 3, Sec. 2): "Without pre-activation, the CIFAR-10 error of a 100-layer
DenseNet-BC grows from 4.51 to 5.18. On CIFAR-100, the error grows from 22.27 to 24.30". Its
recipe is the DenseNet one (Huang et al.): SGD with Nesterov momentum 0.9, weight decay 1e-4,
batch 64, 300 epochs, learning rate 0.1 divided by 10 at 50% and 75% of the epochs, pad-4
random crops and horizontal flips. Post-activation layers (``preact=False``) apply BN and ReLU
after each convolution (:mod:`layers.densenet`).
"""
from .train import point

EXPERIMENT = "densenet_fig2_preact"


def main(argv=None):
    point.main(EXPERIMENT, "Train a DenseNet-BC on CIFAR with pre- or post-activation BN "
                           "(DenseNet paper, Fig. 2 left).", argv, model="densenet_bc",
               datasets=("cifar10", "cifar100"))


if __name__ == "__main__":
    main()
