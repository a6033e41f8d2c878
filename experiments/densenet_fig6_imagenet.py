"""DenseNet paper, Fig. 6: ImageNet top-1 error of the deep DenseNets that only the
memory-efficient implementation can train, against their parameter count.

Run as ``python -m experiments.densenet_fig6_imagenet --data ROOT --model densenet264
--model-arg growth_rate=48 --schedule cosine --epochs 100 --batch 256 --eval
center224=center:256:224 --out ... --epochs-csv ... --weights ... --work-dir ...`` (every option:
:mod:`experiments.train.point`); one point is one network and schedule.

The paper (p. 7, Sec. 5): DenseNet-264 (k = 32, 33M parameters) and DenseNet-232 (k = 48, 55M)
trained for 100 epochs "following the same procedure described in [9]" (Huang et al.: SGD,
Nesterov momentum 0.9, weight decay 1e-4, batch 256, learning rate 0.1 divided by 10 every 30
epochs), and two DenseNet-264 (k = 32 and 48, 73M) with the cosine schedule; single centred
crops; 8 Tesla M40 GPUs. The deepest cosine DenseNet reaches 20.26% top-1 error. The networks
use the shared-storage implementation (``impl="shared"``), the paper's subject.
"""
from .train import point

EXPERIMENT = "densenet_fig6_imagenet"


def main(argv=None):
    point.main(EXPERIMENT, "Train a deep DenseNet on ImageNet (DenseNet paper, Fig. 6).", argv,
               datasets=("imagenet",))


if __name__ == "__main__":
    main()
