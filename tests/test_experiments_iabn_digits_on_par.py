"""The small-scale "on par" check (experiments/iabn_digits_on_par.py): its real-image split, the
shared initial weights, one tiny point, its option checks, and the verdict of
``iabn_on_par_small_scale`` on each side of its bound."""
import json
import shutil
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits

import layers
from experiments import iabn_digits_on_par as digits
from experiments.report import claims

ROOT = Path(__file__).resolve().parents[1]
CLAIM = "iabn_on_par_small_scale"


def test_the_split_is_stratified_fixed_and_standardised_by_the_training_images():
    train, val = digits.digits_split(0.2)
    reference = load_digits()
    assert len(train) + len(val) == len(reference.target) == 1797
    assert len(val) == 360
    x, y = train.tensors
    assert x.shape[1:] == (3, 8, 8) and bool((x[:, 0] == x[:, 2]).all())
    assert abs(float(x.mean())) < 1e-5 and abs(float(x.std()) - 1) < 1e-3
    # Each class's share of the validation images is its share of the whole set (stratified).
    shares = np.bincount(val.tensors[1].numpy(), minlength=10) / len(val)
    whole = np.bincount(reference.target, minlength=10) / len(reference.target)
    assert np.abs(shares - whole).max() < 2 / len(val)
    # The same split every call: it does not follow torch's or numpy's global seed.
    again_train, _ = digits.digits_split(0.2)
    assert bool((again_train.tensors[1] == y).all())


def test_both_norms_start_from_the_seeds_weights():
    models = digits.same_init(4, seed=3)
    bn, iabn = (models[n].state_dict() for n in digits.NORMS)
    assert bn.keys() == iabn.keys() and all(bool((bn[k] == iabn[k]).all()) for k in bn)
    assert any(isinstance(m, layers.InPlaceABN) for m in models["iabn"].modules())
    assert not any(isinstance(m, layers.ABN) for m in models["bn"].modules())
    other = digits.same_init(4, seed=4)["bn"].state_dict()
    assert any(not bool((bn[k] == other[k]).all()) for k in bn if bn[k].is_floating_point())


def test_a_point_records_each_norms_validation_accuracy(tmp_path):
    out = tmp_path / "seed0.json"
    digits.main(["--seed", "0", "--epochs", "1", "--width", "4", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["config"]["seed"] == 0 and report["config"]["epochs"] == 1
    assert [r["norm"] for r in report["results"]] == ["bn", "iabn"]
    for record in report["results"]:
        assert record["val_images"] == 360 and record["train_images"] == 1437
        assert 0.1 < record["val_accuracy"] <= 1  # better than chance after one epoch


@pytest.mark.parametrize("args, message", [
    (["--seed", "-1"], "--seed -1: must be >= 0"),
    (["--seed", "0", "--width", "6"], "--width 6: must be a multiple of the cardinality 4"),
    (["--seed", "0", "--val-fraction", "1"], "--val-fraction 1.0: must lie strictly"),
    (["--seed", "0", "--lr", "0"], "--lr 0.0: must be > 0"),
    (["--seed", "0", "--epochs", "0"], "--epochs 0: must be >= 1"),
    (["--seed", "0", "--dtype", "float64"], "--dtype float64: the trained networks run in"),
])
def test_bad_options_are_refused_by_name(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        digits.parse_args([*args, "--out", str(tmp_path / "p.json")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


#: STD-BN's accuracies over three seeds; their sample standard deviation is the bound when
#: InPlace-ABN's are a shifted copy (the same spread).
BN_ACCURACIES = (0.90, 0.92, 0.94)
SPREAD = statistics.stdev(BN_ACCURACIES)


def frame(bn, iabn, iabn_seeds=None):
    """An aggregate CSV of the check: one row per (seed, norm)."""
    rows = [{"point": f"seed{seed}", "seed": seed, "norm": norm, "val_accuracy": accuracy,
             "epochs": 8, "env_device_name": "a device"}
            for norm, accuracies, seeds in (("bn", bn, range(len(bn))),
                                            ("iabn", iabn, iabn_seeds or range(len(iabn))))
            for seed, accuracy in zip(seeds, accuracies)]
    return pd.DataFrame(rows)


def outcome(tmp_path, table):
    shutil.copytree(ROOT / "artifacts" / "paper", tmp_path / "paper", dirs_exist_ok=True)
    table.to_csv(tmp_path / "iabn_digits_on_par.test-cpu.csv", index=False)
    claim = next(c for c in claims.load_claims(tmp_path) if c["id"] == CLAIM)
    ((run, _, result),) = claims.evaluate(claim, tmp_path)
    assert run == "test-cpu"
    return result


@pytest.mark.parametrize("shift, verdict", [
    (-1.05, claims.NOT_REPRODUCED), (-0.95, claims.CONSISTENT_SMALL_SCALE),
    (0.0, claims.CONSISTENT_SMALL_SCALE), (0.95, claims.CONSISTENT_SMALL_SCALE),
    (1.05, claims.NOT_REPRODUCED)])
def test_consistent_when_the_mean_difference_is_within_the_seeds_spread(tmp_path, shift,
                                                                         verdict):
    """Two-sided: InPlace-ABN's mean more than one standard deviation below or above
    STD-BN's is not "on par"."""
    iabn = [a + shift * SPREAD for a in BN_ACCURACIES]
    result = outcome(tmp_path, frame(BN_ACCURACIES, iabn))
    assert result.verdict == verdict
    assert f"difference {100 * shift * SPREAD:+.2f} pp vs spread {100 * SPREAD:.2f} pp" in (
        result.measured)
    assert result.measured.startswith("STD-BN 92.00% ± 2.00 [90.00, 94.00]; INPLACE-ABN")


def test_the_bound_is_the_wider_norms_spread(tmp_path):
    iabn = (0.88, 0.93, 0.98)  # mean 0.93, standard deviation 0.05 > STD-BN's 0.02
    result = outcome(tmp_path, frame(BN_ACCURACIES, iabn))
    assert result.verdict == claims.CONSISTENT_SMALL_SCALE
    assert "spread 5.00 pp" in result.measured


@pytest.mark.parametrize("bn, iabn, iabn_seeds, why", [
    ((0.9,), (0.9,), None, "at least two seeds of each norm"),
    (BN_ACCURACIES, (), None, "at least two seeds of each norm"),
    (BN_ACCURACIES, BN_ACCURACIES, (0, 1, 5), "the norms' seeds differ")])
def test_not_measured_without_two_seeds_of_each_norm_on_the_same_seeds(tmp_path, bn, iabn,
                                                                        iabn_seeds, why):
    result = outcome(tmp_path, frame(bn, iabn, iabn_seeds))
    assert result.verdict == claims.NOT_MEASURED
    assert why in result.reason
