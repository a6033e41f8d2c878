"""The training engine (``experiments.train``): schedules against their formulas, top-k and
ten-crop against hand-computed cases, checkpoints (atomic, ``weights_only``, named errors),
bit-identical resumption (in process after a crash, and after a real SIGKILL of a subprocess),
and 2 gloo ranks against one process on the whole batch, under ``torchrun`` and under the
pipeline's launcher (``experiments.train.launch``: ranks forked from one import), whose
refusals and failed ranks are checked too.

The runs are tiny (a two-convolution float64 network with ``layers.InPlaceABNSync``, 8 to 32
images of 8x8) and shared with ``tests/train_worker.py``, which the subprocesses run.
"""
import importlib.util
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numba
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from experiments.train import checkpoint, distributed, engine, launch, metrics, schedules

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
TIMEOUT_S = 180


def _load_worker():
    spec = importlib.util.spec_from_file_location("train_worker", HERE / "train_worker.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


W = _load_worker()


def _worker_env():
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                        env.get("PYTHONPATH")])))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


@pytest.fixture
def one_thread():
    """Pin torch and numba to one thread (as the workers are) and restore them afterwards."""
    torch_threads, numba_threads = torch.get_num_threads(), numba.get_num_threads()
    W.pin_threads()
    yield
    torch.set_num_threads(torch_threads)
    numba.set_num_threads(numba_threads)


def _state_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _optimizer_equal(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        for name, value in a["state"][key].items():
            assert torch.equal(value, b["state"][key][name]) if torch.is_tensor(value) else \
                value == b["state"][key][name], (key, name)


# --- schedules: hand-written values at given epochs / iterations --------------------------


@pytest.mark.parametrize("name, base, epochs, params, epoch, fraction, expected", [
    # step: x0.1 every 30 epochs (InPlace-ABN §4.1), constant within an epoch
    ("step", 0.1, 90, {}, 0, 0.0, 0.1),
    ("step", 0.1, 90, {}, 29, 0.99, 0.1),
    ("step", 0.1, 90, {}, 30, 0.0, 0.01),
    ("step", 0.1, 90, {}, 60, 0.5, 0.001),
    ("step", 0.1, 90, {}, 89, 0.0, 0.001),
    ("step", 1.0, 10, {"gamma": 0.5, "step_epochs": 4}, 9, 0.0, 0.25),
    # linear from 0.1 to 1e-6 over the run (WideResNet-38), per iteration
    ("linear", 0.1, 10, {}, 0, 0.0, 0.1),
    ("linear", 0.1, 10, {}, 0, 0.25, 0.097500025),
    ("linear", 0.1, 10, {}, 5, 0.0, 0.0500005),
    ("linear", 0.1, 10, {}, 9, 0.75, 0.002500975),
    # DenseNet cosine, lr(t) = 0.05 (cos(t pi / 100) + 1) per epoch
    ("cosine", 0.1, 100, {}, 0, 0.0, 0.1),
    ("cosine", 0.1, 100, {}, 25, 0.0, 0.08535533905932738),
    ("cosine", 0.1, 100, {}, 25, 0.9, 0.08535533905932738),
    ("cosine", 0.1, 100, {}, 50, 0.0, 0.05),
    ("cosine", 0.1, 100, {}, 99, 0.0, 2.467198171342e-05),
    # CIFAR DenseNet: x0.1 at 50% and 75% of 300 epochs
    ("cifar", 0.1, 300, {}, 149, 0.99, 0.1),
    ("cifar", 0.1, 300, {}, 150, 0.0, 0.01),
    ("cifar", 0.1, 300, {}, 224, 0.0, 0.01),
    ("cifar", 0.1, 300, {}, 225, 0.0, 0.001),
    ("cifar", 0.1, 300, {}, 299, 0.5, 0.001),
    # poly 0.9: 2 epochs of 5 iterations, max_iter 10
    ("poly", 2.5e-3, 2, {}, 0, 0.0, 2.5e-3),
    ("poly", 2.5e-3, 2, {}, 0, 0.2, 0.0022738314402074057),
    ("poly", 2.5e-3, 2, {}, 1, 0.0, 0.0013397168281703664),
    ("poly", 2.5e-3, 2, {}, 1, 0.8, 0.0003147313529485418),
])
def test_schedule_formula(name, base, epochs, params, epoch, fraction, expected):
    schedule = schedules.make_schedule(name, base, epochs, 5, **params)
    assert schedule(epoch, fraction) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_scheduler_steps_per_iteration_and_round_trips(tmp_path):
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=2.5e-3, momentum=0.9)
    schedule = schedules.make_schedule("poly", 2.5e-3, 2, 5)
    scheduler = schedules.make_scheduler(optimizer, schedule)
    seen = []
    for _ in range(7):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # iteration k runs at 2.5e-3 (1 - k / 10) ** 0.9
    assert seen == pytest.approx([2.5e-3 * (1 - k / 10) ** 0.9 for k in range(7)], rel=1e-12)
    torch.save(scheduler.state_dict(), tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    fresh_opt = torch.optim.SGD([param], lr=2.5e-3, momentum=0.9)
    fresh = schedules.make_scheduler(fresh_opt, schedule)
    fresh.load_state_dict(state)
    assert fresh.last_epoch == 7 and fresh.get_last_lr() == scheduler.get_last_lr()
    other = schedules.make_scheduler(fresh_opt, schedules.make_schedule("poly", 2.5e-3, 3, 5))
    with pytest.raises(ValueError, match="does not match"):
        other.load_state_dict(state)


@pytest.mark.parametrize("args, match", [
    (("exp", 0.1, 10, 5), "schedule='exp'"),
    (("step", 0.0, 10, 5), "base_lr"),
    (("step", 0.1, 0, 5), "epochs"),
    (("step", 0.1, 10, 5, {"step": 30}), "step_epochs"),
    (("cifar", 0.1, 10, 5, {"milestones": (0.5, 1.5)}), "milestones"),
])
def test_schedule_rejects_bad_arguments(args, match):
    params = args[4] if len(args) > 4 else {}
    with pytest.raises(ValueError, match=match):
        schedules.make_schedule(*args[:4], **params)


# --- metrics ------------------------------------------------------------------------------


def test_topk_correct_hand_case():
    logits = torch.tensor([[0.1, 0.5, 0.2, 0.9, 0.0, 0.3],    # ranks: 3, 1, 5, 2, 0, 4
                           [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],    # 0 first
                           [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]])   # 5, 4, 3, 2, 1, 0
    target = torch.tensor([1, 0, 0])  # rank 2, rank 1, rank 6
    assert metrics.topk_correct(logits, target) == [1, 2]
    assert metrics.topk_correct(logits, target, ks=(1, 2, 3, 6)) == [1, 2, 2, 3]
    # k above the number of classes counts every row
    assert metrics.topk_correct(logits[:, :3], torch.tensor([2, 1, 0]), ks=(5,)) == [3]
    with pytest.raises(ValueError, match="target"):
        metrics.topk_correct(logits, torch.tensor([1, 0]))


def test_ten_crop_averages_logits():
    # One crop very confident in class 0, nine mildly preferring class 1: averaged logits
    # pick class 0 (1.0 vs 0.9), averaged probabilities would pick class 1.
    crops = torch.tensor([[10.0, 0.0]] + [[0.0, 1.0]] * 9).unsqueeze(0)
    assert metrics.ten_crop_average(crops)[0].tolist() == pytest.approx([1.0, 0.9])
    assert F.softmax(crops, dim=2).mean(dim=1).argmax().item() == 1  # the case discriminates
    loader = [(crops, torch.tensor([0]))]
    result = metrics.evaluate(nn.Identity(), loader, "cpu", ten_crop=True)
    assert result["top1_error"] == 0.0 and result["count"] == 1
    assert result["loss"] == pytest.approx(math.log(1 + math.exp(-0.1)))


def test_evaluate_hand_case():
    ln3 = math.log(3)
    loader = [(torch.tensor([[ln3, 0.0]]), torch.tensor([0])),
              (torch.tensor([[ln3, 0.0], [1.0, 0.0], [0.0, 2.0]]), torch.tensor([1, 0, 1]))]
    model = nn.Identity()
    model.train()
    result = metrics.evaluate(model, loader, "cpu")
    # losses: ln(4/3), ln 4, ln(1 + e^-1), ln(1 + e^-2); top-1: right, wrong, right, right
    expected_loss = (math.log(4 / 3) + math.log(4) + math.log(1 + math.exp(-1))
                     + math.log(1 + math.exp(-2))) / 4
    assert result == pytest.approx({"loss": expected_loss, "count": 4, "top1_error": 0.25,
                                    "top5_error": 0.0})
    assert model.training  # mode restored


# --- distributed helpers ------------------------------------------------------------------


def test_per_rank_batch():
    assert distributed.per_rank_batch(256, 8) == 32
    with pytest.raises(distributed.IndivisibleBatchError,
                       match=r"batch_size=10 .*world size 4"):
        distributed.per_rank_batch(10, 4)


def test_engine_rejects_indivisible_batch_before_joining(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    recipe = engine.Recipe(epochs=1, batch_size=7, lr=0.1, schedule="step")
    with pytest.raises(distributed.IndivisibleBatchError, match=r"batch_size=7 .*world size 2"):
        engine.train(model=W.net(False), train_set=W.Images(8, 0), eval_sets={},
                     recipe=recipe, run_dir=tmp_path, metrics_csv=tmp_path / "m.csv", seed=0,
                     workers=0, device="cpu", desc="x")
    assert not torch.distributed.is_initialized()


# --- resumption -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted resume run (2 epochs), on one thread: ``(run_dir, report)``."""
    run_dir = tmp_path_factory.mktemp("reference")
    torch_threads, numba_threads = torch.get_num_threads(), numba.get_num_threads()
    W.pin_threads()
    try:
        _, report = W.resume_run(run_dir)
    finally:
        torch.set_num_threads(torch_threads)
        numba.set_num_threads(numba_threads)
    return run_dir, report


def _assert_same_run(run_dir, reference_dir):
    got = torch.load(run_dir / engine.CHECKPOINT_NAME, weights_only=True)
    want = torch.load(reference_dir / engine.CHECKPOINT_NAME, weights_only=True)
    assert got["epoch"] == want["epoch"] == W.RESUME_RECIPE.epochs
    _state_equal(got["model"], want["model"])
    _optimizer_equal(got["optimizer"], want["optimizer"])
    assert got["scheduler"] == want["scheduler"]
    for key in ("torch", "python"):
        assert str(got["rng"][0][key]) == str(want["rng"][0][key])
    deterministic = ("epoch", "lr", "train_loss", "train_top1_error", "val_top1_error",
                     "val_top5_error", "val_loss")
    assert [{k: r[k] for k in deterministic} for r in got["metrics"]] == \
        [{k: r[k] for k in deterministic} for r in want["metrics"]]


def test_report_checkpoint_and_csv(reference):
    run_dir, report = reference
    assert report["world_size"] == 1 and report["per_rank_batch"] == 8
    assert [r["epoch"] for r in report["epochs"]] == [1, 2]
    assert report["epochs"][0]["lr"] == pytest.approx(0.1)
    assert report["final"]["val"]["count"] == 12
    assert report["params"] == sum(p.numel() for p in W.net(True).parameters())
    for row in report["epochs"]:
        assert row["images_per_s"] > 0 and row["peak_memory_bytes"] > 0
        assert math.isfinite(row["train_loss"])
    lines = (run_dir / "metrics.csv").read_text().splitlines()
    assert lines[0].split(",") == ["epoch", "lr", "train_loss", "train_top1_error",
                                   "images_per_s", "peak_memory_bytes", "epoch_time_s",
                                   "val_top1_error", "val_top5_error", "val_loss"]
    assert len(lines) == 3
    state = torch.load(run_dir / engine.CHECKPOINT_NAME, weights_only=True)
    assert set(state) == set(checkpoint.KEYS)
    assert state["fingerprint"]["recipe"]["schedule"] == "linear"
    assert state["scheduler"]["last_epoch"] == 2 * W.RESUME_STEPS_PER_EPOCH
    # a finished run called again returns its report without training
    _, again = W.resume_run(run_dir)
    assert again["epochs"] == report["epochs"] and again["final"] == report["final"]


def test_resume_after_crash_is_bit_identical(tmp_path, reference, one_thread):
    crash_at = W.RESUME_STEPS_PER_EPOCH + 2  # mid epoch 2
    with pytest.raises(W.Crash):
        W.resume_run(tmp_path, criterion=W.TrapLoss(crash_at=crash_at))
    state = torch.load(tmp_path / engine.CHECKPOINT_NAME, weights_only=True)
    assert state["epoch"] == 1
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 2
    _, report = W.resume_run(tmp_path)
    _assert_same_run(tmp_path, reference[0])
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 3
    assert [r["epoch"] for r in report["epochs"]] == [1, 2]


def test_resume_with_workers_is_bit_identical(tmp_path, one_thread):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    W.resume_run(straight, workers=1)
    with pytest.raises(W.Crash):
        W.resume_run(crashed, workers=1,
                     criterion=W.TrapLoss(crash_at=W.RESUME_STEPS_PER_EPOCH + 3))
    W.resume_run(crashed, workers=1)
    _assert_same_run(crashed, straight)


def test_resume_after_sigkill_is_bit_identical(tmp_path, reference):
    marker = tmp_path / "hanging"
    cmd = [sys.executable, str(HERE / "train_worker.py"), "resume", str(tmp_path)]
    hang_at = W.RESUME_STEPS_PER_EPOCH + 2
    proc = subprocess.Popen([*cmd, str(hang_at), str(marker)], env=_worker_env(),
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + TIMEOUT_S
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"worker never reached epoch 2:\n{proc.communicate()[0].decode()}")
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert torch.load(tmp_path / engine.CHECKPOINT_NAME, weights_only=True)["epoch"] == 1
    result = subprocess.run(cmd, env=_worker_env(), cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resuming from" in result.stderr
    _assert_same_run(tmp_path, reference[0])


# --- checkpoints: corrupt and mismatched ------------------------------------------------------


def test_truncated_checkpoint_is_a_named_error(tmp_path, reference):
    data = (reference[0] / engine.CHECKPOINT_NAME).read_bytes()
    path = tmp_path / engine.CHECKPOINT_NAME
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(checkpoint.CorruptCheckpointError, match=str(path)):
        checkpoint.load(path)
    with pytest.raises(checkpoint.CorruptCheckpointError, match="truncated"):
        W.resume_run(tmp_path)
    assert path.read_bytes() == data[: len(data) // 2]  # left alone: no silent fresh start
    assert not (tmp_path / "metrics.csv").exists()


def test_foreign_file_is_a_named_error(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, path)
    with pytest.raises(checkpoint.CorruptCheckpointError, match="format"):
        checkpoint.load(path)


@pytest.mark.parametrize("change, match", [
    (dict(recipe=engine.Recipe(epochs=2, batch_size=8, lr=0.05, schedule="linear",
                               schedule_params={"final_lr": 1e-3})),
     r"recipe\.lr: 0\.1 in the checkpoint, 0\.05 now"),
    (dict(width=6), r"model\.parameters"),
])
def test_mismatched_checkpoint_is_a_named_error(tmp_path, reference, change, match):
    shutil.copy(reference[0] / engine.CHECKPOINT_NAME, tmp_path / engine.CHECKPOINT_NAME)
    with pytest.raises(checkpoint.CheckpointMismatchError, match=match):
        W.resume_run(tmp_path, **change)


def test_model_mismatch_names_the_keys(tmp_path):
    model = nn.Sequential(nn.Linear(3, 2))
    saved = {"0.weight": torch.zeros(2, 4), "0.bias": torch.zeros(2, dtype=torch.float64),
             "1.weight": torch.zeros(1)}
    with pytest.raises(checkpoint.CheckpointMismatchError,
                       match=r"keys the model lacks: \['1\.weight'\].*0\.weight: shape \(2, 4\)"
                             r".*0\.bias: dtype torch\.float64"):
        checkpoint.load_model(tmp_path / "x.pt", model, saved)


def test_rng_states_round_trip(tmp_path):
    import random

    import numpy as np
    states = checkpoint.capture_rng("cpu")
    torch.save(states, tmp_path / "rng.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(5), np.random.rand(5), random.random()
    checkpoint.restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True), "cpu")
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and (got[1] == expected[1]).all()
    assert got[2] == expected[2]


# --- two gloo ranks under torchrun and under the pipeline's launcher ----------------------------
#: How each launcher starts ``train_worker`` on two ranks: torchrun on the script (fresh
#: processes), and experiments.train.launch on the module (ranks forked from one import).
#: --standalone: the rendezvous picks its own free port (tests run side by side).
LAUNCHERS = {
    "torchrun": ["torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 str(HERE / "train_worker.py")],
    "launch": ["experiments.train.launch", "--standalone", "--nproc-per-node", "2", "-m",
               "train_worker"],
}


def _launch(launcher, *args):
    """``python -m <launcher> ... train_worker ARGS`` with the tests' directory importable."""
    env = _worker_env()
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
    return subprocess.run([sys.executable, "-m", *LAUNCHERS[launcher], *args], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)


def _two_rank_worker(launcher, mode, out):
    """Run ``train_worker MODE OUT`` on two ranks under ``launcher``; each rank's saved
    results."""
    result = _launch(launcher, mode, str(out))
    if result.returncode != 0:
        pytest.fail(f"{launcher} failed ({result.returncode}):\n{result.stdout[-4000:]}\n"
                    f"{result.stderr[-6000:]}")
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]


@pytest.fixture(scope="module")
def ddp_ranks(tmp_path_factory):
    """The DDP classification case on two ranks; each rank's saved results."""
    out = tmp_path_factory.mktemp("ddp")
    return _two_rank_worker("torchrun", "ddp", out), out


def test_two_ranks_equal_one_process_on_the_whole_batch(tmp_path, ddp_ranks):
    ranks, out = ddp_ranks
    model, single = W.ddp_run(tmp_path)
    reports = [r["report"] for r in ranks]
    assert [r["world_size"] for r in reports] == [2, 2]
    assert [r["per_rank_batch"] for r in reports] == [4, 4]
    assert single["world_size"] == 1 and single["per_rank_batch"] == 8
    # every rank holds the same weights and running statistics, bit for bit
    _state_equal(ranks[0]["state"], ranks[1]["state"])
    # ... equal to one process's on the whole batch (the sum order differs: float64 rounding)
    reference = model.state_dict()
    for key, value in ranks[0]["state"].items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=1e-10, msg=key)
    assert ranks[0]["state"]["1.num_batches_tracked"].item() == W.DDP_RECIPE.epochs
    for got, want in zip(reports[0]["epochs"], single["epochs"]):
        assert got["epoch"] == want["epoch"] and got["lr"] == want["lr"]
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-10)
        assert got["train_top1_error"] == want["train_top1_error"]
    for name in ("val", "crops"):
        got, want = reports[0]["final"][name], single["final"][name]
        assert got["count"] == want["count"] == (8 if name == "val" else 6)
        assert got["top1_error"] == want["top1_error"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-10)
    assert reports[1]["final"] == reports[0]["final"]
    state = torch.load(out / "run" / engine.CHECKPOINT_NAME, weights_only=True)
    assert len(state["rng"]) == 2 and state["fingerprint"]["world_size"] == 2
    assert len((out / "run" / "metrics.csv").read_text().splitlines()) == 1 + W.DDP_RECIPE.epochs


def test_two_rank_sync_segmentation_equals_one_process_on_the_whole_batch(tmp_path):
    ranks = _two_rank_worker("launch", "seg_ddp", tmp_path / "ranks")
    model, single = W.seg_ddp_run(tmp_path / "single")
    reports = [r["report"] for r in ranks]
    assert [r["per_rank_batch"] for r in reports] == [2, 2] and single["per_rank_batch"] == 4
    _state_equal(ranks[0]["state"], ranks[1]["state"])
    # Equal up to float64 rounding, which the 100-layer body amplifies from the different
    # summation orders (a per-rank normalisation or an unsynchronised layer differs by ~1e-2).
    reference = model.state_dict()
    for key, value in ranks[0]["state"].items():
        torch.testing.assert_close(value, reference[key], rtol=1e-6, atol=1e-8, msg=key)
    for got, want in zip(reports[0]["epochs"], single["epochs"]):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-8)
        assert got["train_top1_error"] is None
        assert got["val_miou"] == pytest.approx(want["val_miou"], rel=1e-8)
    assert reports[0]["final"]["val"]["count"] == single["final"]["val"]["count"] == 6
    assert reports[1]["final"] == reports[0]["final"]


def test_launch_fails_with_the_status_of_a_failed_rank(tmp_path):
    result = _launch("launch", "no-such-mode", str(tmp_path))
    assert result.returncode == 1
    assert "unknown mode 'no-such-mode'" in result.stderr
    assert "exitcode  : 1" in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("argv, message", [
    (["--standalone", "--nproc-per-node=2", "train.py"], "pass -m <module>"),
    (["--standalone", "--nproc-per-node=2", "--run-path", "-m", "json"], "--run-path"),
    (["--nproc-per-node=2", "-m", "json"], "pass --standalone"),
    (["--standalone", "--nproc-per-node=2", "-m", "json"], "json has no main(argv)"),
])
def test_launch_refuses_what_it_cannot_fork(argv, message):
    with pytest.raises(SystemExit) as stop:
        launch.main(argv)
    assert message in str(stop.value.code)


def test_eval_set_checks_its_arguments():
    with pytest.raises(ValueError, match="pass evaluate"):
        engine.EvalSet([], metrics=("miou",))
    with pytest.raises(ValueError, match="batch_size"):
        engine.EvalSet([], batch_size=0)
    with pytest.raises(ValueError, match="callable"):
        engine.EvalSet([], evaluate="mIoU", metrics=("miou",))


# --- recipe details ---------------------------------------------------------------------------


def test_norm_parameters_can_skip_weight_decay():
    import layers
    model = nn.Sequential(nn.Conv2d(3, 4, 3), layers.InPlaceABNSync(4), nn.Conv2d(4, 4, 1),
                          nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    recipe = engine.Recipe(epochs=1, batch_size=2, lr=0.1, schedule="step",
                           no_weight_decay_on_norms=True)
    decay, no_decay = engine._param_groups(model, recipe)
    norm_ids = {id(p) for i in (1, 3) for p in model[i].parameters()}
    assert {id(p) for p in no_decay["params"]} == norm_ids and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) == 6 and not norm_ids & {id(p) for p in decay["params"]}
    assert len(engine._param_groups(model, engine.Recipe(epochs=1, batch_size=2, lr=0.1,
                                                         schedule="step"))) == 1


def test_eval_every_leaves_cells_empty(tmp_path):
    recipe = engine.Recipe(epochs=3, batch_size=4, lr=0.1, schedule="cosine")
    report = engine.train(model=W.net(False), train_set=W.Images(8, 1),
                          eval_sets={"val": engine.EvalSet(W.Images(4, 2))}, recipe=recipe,
                          run_dir=tmp_path, metrics_csv=tmp_path / "m.csv", seed=0, workers=0,
                          device="cpu", desc="every", eval_every=2)
    assert ["val_loss" in row for row in report["epochs"]] == [False, True, True]
    assert [r["lr"] for r in report["epochs"]] == pytest.approx(
        [0.1, 0.05 * (math.cos(math.pi / 3) + 1), 0.05 * (math.cos(2 * math.pi / 3) + 1)])
    rows = (tmp_path / "m.csv").read_text().splitlines()
    assert rows[1].endswith(",,,") and not rows[2].endswith(",")


def test_a_diverged_run_stops_and_keeps_its_last_good_checkpoint(tmp_path):
    recipe = engine.Recipe(epochs=2, batch_size=4, lr=0.1, schedule="step")
    model = W.net(False)
    with torch.no_grad():
        next(model.parameters()).fill_(float("inf"))
    with pytest.raises(FloatingPointError, match="epoch 1 is nan"):
        engine.train(model=model, train_set=W.Images(8, 1), eval_sets={}, recipe=recipe,
                     run_dir=tmp_path, metrics_csv=tmp_path / "m.csv", seed=0, workers=0,
                     device="cpu", desc="diverge")
    assert not (tmp_path / engine.CHECKPOINT_NAME).exists()


@pytest.mark.parametrize("kwargs, match", [
    (dict(epochs=0), "Recipe.epochs"),
    (dict(schedule="exp"), "Recipe.schedule"),
    (dict(schedule_params={"gamma": -1}), "gamma"),
    (dict(momentum=0.0), "nesterov"),
])
def test_recipe_rejects_bad_values(kwargs, match):
    base = dict(epochs=2, batch_size=4, lr=0.1, schedule="step")
    with pytest.raises(ValueError, match=match):
        engine.Recipe(**{**base, **kwargs})
