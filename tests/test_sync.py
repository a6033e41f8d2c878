"""InPlaceABNSync across 2 gloo ranks against one process on the concatenated batch.

Two worker processes (``tests/sync_worker.py``) split one seeded (8, 4, 5, 6) float64 batch
3 + 5 and run InPlaceABNSync for two forward/backward iterations, over the world group, over
``dist.new_group([0, 1])`` and over a group holding only their own rank. The workers start once
per module (one process group serves every case) and the tests compare their saved results with
a single-process InPlaceABN, itself checked against ``F.batch_norm`` + activation under
autograd.
"""
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import layers

HERE = Path(__file__).resolve().parent


def _load_worker_module():
    spec = importlib.util.spec_from_file_location("sync_worker", HERE / "sync_worker.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


W = _load_worker_module()
WORLD_SIZE = len(W.BATCH_SPLIT)
TOL = dict(rtol=0.0, atol=1e-10)
WORKER_TIMEOUT_S = 120

CASE_PARAMS = [
    pytest.param(variant, activation, param, id=f"{variant}-{activation}")
    for variant, (activation, param) in W.CASES
]


def _launch(out_dir):
    """Start the ranks; return their ``(returncode, output)`` (killed if they hang)."""
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # everything is on 127.0.0.1
    env.setdefault("NUMBA_NUM_THREADS", "1")  # 2 ranks share the machine's cores
    env.setdefault("OMP_NUM_THREADS", "1")
    # A rendezvous file of this run's own: no port to pick, so no race with tests that run
    # beside it.
    init_method = (out_dir / "rendezvous").as_uri()
    procs = []
    for rank in range(WORLD_SIZE):
        log = open(out_dir / f"rank{rank}.log", "w+")
        cmd = [sys.executable, str(HERE / "sync_worker.py"), str(rank), str(WORLD_SIZE),
               init_method, str(out_dir)]
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT),
                      log))
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    results = []
    for proc, log in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for other, _ in procs:
                if other.poll() is None:
                    other.kill()
            proc.wait()
        log.seek(0)
        results.append((proc.returncode, log.read()))
        log.close()
    return results


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    """Each rank's saved results, keyed by ``(group, variant, activation)``."""
    out_dir = tmp_path_factory.mktemp("sync")
    outcome = _launch(out_dir)
    failed = [(rank, rc, log) for rank, (rc, log) in enumerate(outcome) if rc != 0]
    if failed:
        report = "\n".join(f"--- rank {rank} exited with {rc}:\n{log[-4000:]}"
                           for rank, rc, log in failed)
        pytest.fail(f"sync workers failed:\n{report}")
    return [torch.load(out_dir / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]


@pytest.fixture(scope="module")
def data():
    return W.make_data()


def _reference(data, variant, activation, param):
    """Single-process InPlaceABN on the whole batch."""
    weight, bias, xs, dzs = data
    layer = W.make_layer(layers.InPlaceABN, variant, activation, param, weight, bias)
    return W.run_layer(layer, xs, dzs)


def _composite(data, activation, param):
    """``F.batch_norm`` with scale ``|weight| + eps`` then the activation, under autograd."""
    weight0, bias0, xs, dzs = data
    weight = weight0.clone().requires_grad_()
    bias = bias0.clone().requires_grad_()
    running_mean = torch.zeros(W.C, dtype=W.DTYPE)
    running_var = torch.ones(W.C, dtype=W.DTYPE)
    history = []
    for step, (x, dz) in enumerate(zip(xs, dzs), start=1):
        leaf = x.clone().requires_grad_()
        y = F.batch_norm(leaf, running_mean, running_var, weight.abs() + W.EPS, bias,
                         training=True, momentum=W.MOMENTUM, eps=W.EPS)
        z = F.leaky_relu(y, param) if activation == "leaky_relu" else F.elu(y, param)
        z.backward(dz)
        history.append(dict(
            output=z.detach().clone(), input_grad=leaf.grad.clone(),
            weight_grad=weight.grad.clone(), bias_grad=bias.grad.clone(),
            running_mean=running_mean.clone(), running_var=running_var.clone(),
            num_batches_tracked=torch.tensor(step),
        ))
        weight.grad, bias.grad = None, None
    return history


def _close(actual, expected, what):
    torch.testing.assert_close(actual, expected, **TOL, msg=lambda m: f"{what}: {m}")


# --------------------------------------------------------------------------- reference


@pytest.mark.parametrize("variant, activation, param", CASE_PARAMS)
def test_reference_matches_composite_torch_ops(data, variant, activation, param):
    """The single-process reference is itself right: it equals F.batch_norm + activation."""
    reference = _reference(data, variant, activation, param)
    composite = _composite(data, activation, param)
    for step, (got, want) in enumerate(zip(reference, composite)):
        for key in W.RECORDED:
            _close(got[key], want[key], f"iteration {step} {key}")


# --------------------------------------------------------------------------- 2 ranks


def _check_against_reference(rank_results, group_name, reference, variant, activation):
    per_rank = [results[(group_name, variant, activation)] for results in rank_results]
    for step, want in enumerate(reference):
        got = [history[step] for history in per_rank]
        where = f"{group_name} iteration {step}"
        _close(torch.cat([g["output"] for g in got]), want["output"], f"{where} output")
        _close(torch.cat([g["input_grad"] for g in got]), want["input_grad"],
               f"{where} input grad")
        # Each rank holds its share of the parameter gradients; the shares add up.
        _close(sum(g["weight_grad"] for g in got), want["weight_grad"], f"{where} weight grad")
        _close(sum(g["bias_grad"] for g in got), want["bias_grad"], f"{where} bias grad")
        for rank, g in enumerate(got):
            for key in ("running_mean", "running_var"):
                _close(g[key], want[key], f"{where} rank {rank} {key}")
            assert int(g["num_batches_tracked"]) == step + 1 == int(want["num_batches_tracked"])


@pytest.mark.parametrize("split", W.EXTREME_SPLITS, ids=lambda s: "split-%d-%d" % s)
@pytest.mark.parametrize("variant, activation, param", CASE_PARAMS)
def test_sync_with_a_one_sample_or_empty_rank(rank_results, data, variant, activation, param,
                                              split):
    reference = _reference(data, variant, activation, param)
    _check_against_reference(rank_results, f"split{split}", reference, variant, activation)


@pytest.mark.parametrize("variant, activation, param", CASE_PARAMS)
def test_sync_two_ranks_matches_single_process(rank_results, data, variant, activation, param):
    reference = _reference(data, variant, activation, param)
    _check_against_reference(rank_results, "world", reference, variant, activation)
    # The check is not vacuous: each rank's own-batch statistics differ from the global ones,
    # so the shares of the unsynchronised layer (group of one rank) do not add up.
    unsynced = torch.cat([r[("self", variant, activation)][0]["output"] for r in rank_results])
    assert (unsynced - reference[0]["output"]).abs().max() > 1e-3


@pytest.mark.parametrize("variant, activation, param", CASE_PARAMS)
def test_sync_bfloat16_two_ranks_match_single_process(rank_results, data, variant, activation,
                                                      param):
    """16-bit data: the ranks' float64 moments and reductions combine as in float64; what
    differs from one process on the whole batch is the rounding of the bfloat16 output and
    input gradient (one unit in the last place at most, 2**-8 relative) and the float32
    block sums."""
    weight, bias, xs, dzs = data
    layer = W.make_layer(layers.InPlaceABN, variant, activation, param, weight, bias).float()
    reference = W.run_layer(layer, [x.bfloat16() for x in xs], [dz.bfloat16() for dz in dzs])
    for step, want in enumerate(reference):
        got = [r[("bfloat16", variant, activation)][step] for r in rank_results]
        where = f"bfloat16 {variant}-{activation} iteration {step}"
        for key in ("output", "input_grad"):
            joined = torch.cat([g[key] for g in got])
            assert joined.dtype == torch.bfloat16
            torch.testing.assert_close(joined.float(), want[key].float(), rtol=2 ** -7,
                                       atol=2 ** -7 * want[key].float().abs().max().item(),
                                       msg=lambda m: f"{where} {key}: {m}")
        for key in ("weight_grad", "bias_grad"):
            torch.testing.assert_close(sum(g[key] for g in got), want[key], rtol=1e-4,
                                       atol=1e-4 * want[key].abs().max().item(),
                                       msg=lambda m: f"{where} {key}: {m}")
        for rank, g in enumerate(got):
            for key in ("running_mean", "running_var"):
                torch.testing.assert_close(g[key], want[key], rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"{where} rank {rank} {key}: {m}")


@pytest.mark.parametrize("variant, activation, param", CASE_PARAMS)
def test_sync_subgroup_matches_world(rank_results, data, variant, activation, param):
    """``group=dist.new_group([0, 1])`` gives what the default world group gives."""
    reference = _reference(data, variant, activation, param)
    _check_against_reference(rank_results, "subgroup", reference, variant, activation)
    for results in rank_results:
        world = results[("world", variant, activation)]
        sub = results[("subgroup", variant, activation)]
        for step in range(W.ITERATIONS):
            for key in W.RECORDED:
                _close(sub[step][key], world[step][key], f"iteration {step} {key}")


@pytest.mark.parametrize("variant, activation, param", CASE_PARAMS)
def test_sync_group_of_one_rank_is_local(rank_results, data, variant, activation, param):
    """A group holding only the rank itself synchronises nothing: InPlaceABN on the slice."""
    weight, bias, xs, dzs = data
    for rank, results in enumerate(rank_results):
        part = W.rank_slice(rank)
        layer = W.make_layer(layers.InPlaceABN, variant, activation, param, weight, bias)
        local = W.run_layer(layer, [x[part] for x in xs], [dz[part] for dz in dzs])
        got = results[("self", variant, activation)]
        for step in range(W.ITERATIONS):
            for key in W.RECORDED:
                _close(got[step][key], local[step][key], f"rank {rank} iteration {step} {key}")


def test_default_group_is_world(rank_results):
    assert all(results["world_group_is_world"] for results in rank_results)


# --------------------------------------------------------------------------- no process group


@pytest.mark.parametrize("variant, activation, param", CASE_PARAMS)
def test_without_process_group_behaves_as_inplace_abn(data, variant, activation, param):
    assert not dist.is_initialized()
    weight, bias, xs, dzs = data
    sync = W.make_layer(layers.InPlaceABNSync, variant, activation, param, weight, bias)
    plain = W.make_layer(layers.InPlaceABN, variant, activation, param, weight, bias)
    assert sync._group() is None
    got, want = W.run_layer(sync, xs, dzs), W.run_layer(plain, xs, dzs)
    for step in range(W.ITERATIONS):
        for key in W.RECORDED:
            assert torch.equal(got[step][key], want[step][key]), f"iteration {step} {key}"
    assert sync.state_dict().keys() == plain.state_dict().keys()


# --------------------------------------------------------------------------- DDP
@pytest.mark.parametrize("name", W.DDP_MODELS)
def test_ddp_model_converted_by_convert_sync_batchnorm_matches_single_process(rank_results,
                                                                              name):
    """``layers.convert_sync_batchnorm`` + DistributedDataParallel on 2 ranks (batch split 3 +
    5) = the unconverted model on the whole batch in one process, over two SGD steps.

    The ranks' loss is the sum over their own samples; DDP averages the parameter gradients
    over the 2 ranks, so the single-process loss is divided by 2: the gradients, the updated
    parameters and the running statistics then agree, and each rank's input gradient is twice
    its slice of the single-process one.
    """
    xs, dzs = W.make_ddp_data()
    reference = W.train_steps(W.make_ddp_model(name), xs, dzs, loss_scale=1 / WORLD_SIZE)
    for results in rank_results:
        types = results["ddp"][name]["types"]
        assert "InPlaceABNSync" in types and "InPlaceABN" not in types and "ABN" not in types
        assert "BatchNorm2d" not in types
    for step, want in enumerate(reference):
        got = [results["ddp"][name]["history"][step] for results in rank_results]
        assert got[0].keys() == want.keys()
        where = f"{name} iteration {step}"
        _close(torch.cat([g["output"] for g in got]), want["output"], f"{where} output")
        _close(torch.cat([g["input_grad"] for g in got]), WORLD_SIZE * want["input_grad"],
               f"{where} input grad")
        for key in want:
            if key.startswith(("grad ", "param ", "buffer ")):
                for rank, g in enumerate(got):
                    _close(g[key].to(want[key].dtype), want[key], f"{where} rank {rank} {key}")
