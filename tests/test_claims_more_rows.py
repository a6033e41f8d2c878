"""The claims of both papers that issue 56 found without a row: parameter counts and ratios
(counted exactly from the architectures), the parameters that fit one 12 GB GPU, Fig. 1's
buffers of a residual block, Table 1's orderings, and the claims no planned point measures
(LuaTorch figures, per-operator shares, a ResNet never trained, the classification capacity,
ReLU vs leaky ReLU). Every criterion is shown failing on each side of each of its bounds."""
import pandas as pd
import yaml
import pytest

from experiments.report import claims
from test_experiments_claims import (GOOD, PAPER_LIKE, _outcomes, artifacts, fig4_frame,  # noqa: F401
                                     fig5_frame, iabn_frame, imagenet_frame, with_simulated, write)


def claim_of(artifacts, claim_id):
    return next(c for c in claims.load_claims(artifacts) if c["id"] == claim_id)


def judged(artifacts, claim_id, run, **changes):
    """The outcome of ``claim_id`` on ``run`` with ``changes`` to its YAML entry (a value on
    either side of a bound)."""
    claim = {**claim_of(artifacts, claim_id), **changes}
    return {r: outcome for r, _, outcome in claims.evaluate(claim, artifacts)}[run]


# --------------------------------------------------------------------------- parameter counts
@pytest.mark.parametrize("measured, claimed, ok", [
    (1.9, 1.8, True), (1.91, 1.8, False), (1.7, 1.8, True), (1.69, 1.8, False),
    (0.17, 0.16, True), (0.176, 0.16, False), (5.29, 6, True), (4.99, 6, False),
    (7.01, 6, False), (55.57, 55, True)])
def test_a_count_is_the_papers_within_one_unit_of_its_last_digit(measured, claimed, ok):
    assert claims._within_last_digit(measured, claimed)[0] is ok


def test_parameter_counts_are_counted_from_the_architectures(artifacts):
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", fig4_frame("cpu", PAPER_LIKE))
    write(artifacts, "densenet_fig6_imagenet", "smoke-cpu",
          pd.DataFrame({"device": ["cpu"], "env_device_name": ["a device"]}))
    imagenet = _outcomes(artifacts, "densenet_parameters_imagenet")["smoke-cpu"]
    assert imagenet.verdict == claims.BY_CONSTRUCTION
    # torchvision's DenseNet-161 and -201 (28,681,000 and 20,013,928 parameters).
    assert "densenet161_k48 28.681M" in imagenet.measured
    assert "densenet201_k32 20.014M" in imagenet.measured
    # The paper's 160K for the 40-layer model is 10% off DenseNet-BC-40's 176,122.
    fig4 = _outcomes(artifacts, "densenet_parameters_fig4")["smoke-cpu"]
    assert fig4.verdict == claims.NOT_REPRODUCED
    assert "differs: densenet_bc_40 0.176M vs 0.16M" in fig4.reason
    assert "densenet_bc_160" not in fig4.reason.split("differs:")[1]
    # 1.739M: within 0.1M of 1.7 and 1.8, not of 1.6 or 1.9.
    for value, verdict in (({"densenet_bc_160": 1.8}, claims.BY_CONSTRUCTION),
                           ({"densenet_bc_160": 1.7}, claims.BY_CONSTRUCTION),
                           ({"densenet_bc_160": 1.6}, claims.NOT_REPRODUCED),
                           ({"densenet_bc_160": 1.9}, claims.NOT_REPRODUCED),
                           ({"densenet_bc_160": 1.8, "densenet_bc_40": 0.3},
                            claims.NOT_REPRODUCED)):
        assert judged(artifacts, "densenet_parameters_fig4", "smoke-cpu",
                      value=value).verdict == verdict, value


@pytest.mark.parametrize("value, verdict", [
    ({"depth_ratio": 2.5, "parameter_ratio": 6}, claims.BY_CONSTRUCTION),
    ({"depth_ratio": 2.5, "parameter_ratio": 4}, claims.NOT_REPRODUCED),
    ({"depth_ratio": 2.5, "parameter_ratio": 7}, claims.NOT_REPRODUCED),
    ({"depth_ratio": 2.3, "parameter_ratio": 6}, claims.NOT_REPRODUCED),
    ({"depth_ratio": 2.7, "parameter_ratio": 6}, claims.NOT_REPRODUCED)])
def test_the_340_layer_models_ratios_are_the_architectures(artifacts, value, verdict):
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", fig4_frame("cpu", PAPER_LIKE))
    outcome = judged(artifacts, "densenet_340_layers_parameters", "smoke-cpu", value=value)
    assert outcome.verdict == verdict
    # 6,909,322 / 1,305,850 parameters (DenseNet-BC-340 and -136, k = 12).
    assert outcome.measured == "340 vs 136 layers: 2.50x as deep, 5.29x the parameters"


@pytest.mark.parametrize("blocks, verdict", [
    (None, claims.NOT_REPRODUCED),  # the footnote's own: 305 and 273 weighted layers
    ({"densenet264": [6, 12, 64, 48], "densenet232": [6, 12, 48, 48]}, claims.BY_CONSTRUCTION),
    ({"densenet264": [6, 12, 63, 48], "densenet232": [6, 12, 48, 48]}, claims.BY_CONSTRUCTION),
    ({"densenet264": [6, 12, 62, 48], "densenet232": [6, 12, 48, 48]}, claims.NOT_REPRODUCED),
    ({"densenet264": [6, 12, 65, 48], "densenet232": [6, 12, 48, 48]}, claims.NOT_REPRODUCED),
    ({"densenet264": [6, 12, 64, 48], "densenet232": [6, 12, 48, 49]}, claims.NOT_REPRODUCED)])
def test_footnote_10s_blocks_are_judged_by_their_depth(artifacts, blocks, verdict):
    """Blocks 6-12-64-48 give 265 weighted layers, 6-12-63-48 263 (both within one of 264),
    6-12-62-48 261 and 6-12-65-48 267 (not); 6-12-48-48 233, 6-12-48-49 235."""
    write(artifacts, "densenet_fig6_imagenet", "smoke-cpu",
          pd.DataFrame({"device": ["cpu"], "env_device_name": ["a device"]}))
    claim = claim_of(artifacts, "densenet_footnote10_blocks")
    value = claim["value"] if blocks is None else {
        name: {**spec, "blocks": blocks[name]} for name, spec in claim["value"].items()}
    outcome = judged(artifacts, "densenet_footnote10_blocks", "smoke-cpu", value=value)
    assert outcome.verdict == verdict
    if blocks is None:
        assert outcome.measured == ("densenet264 with blocks 6-32-64-48: 305 weighted layers; "
                                    "densenet232 with blocks 6-32-48-48: 273 weighted layers")


# --------------------------------------------------------------------------- 14M vs 4M
def single_gpu_frame(shared_m, naive_m, shared_capped=False):
    """A Fig. 4 CSV whose simulated searches found ``shared_m`` and ``naive_m`` million
    parameters at their deepest fitting depths."""
    frame = with_simulated(fig4_frame("cpu", PAPER_LIKE), {
        "shared": (496, shared_capped, None if shared_capped else 502),
        "naive": (250, False, 256)})
    simulated = frame["kind"] == "simulated_deepest"
    frame.loc[simulated, "param_count"] = frame.loc[simulated, "impl"].map(
        {"shared": shared_m * 1e6, "naive": naive_m * 1e6})
    return frame


@pytest.mark.parametrize("shared_m, naive_m, verdict", [
    (14.0, 4.0, claims.REPRODUCED),
    (11.3, 4.0, claims.NOT_REPRODUCED), (11.4, 4.0, claims.REPRODUCED),
    (16.9, 4.0, claims.REPRODUCED), (17.0, 4.0, claims.NOT_REPRODUCED),
    (14.0, 3.2, claims.NOT_REPRODUCED), (14.0, 3.3, claims.REPRODUCED),
    (14.0, 4.8, claims.REPRODUCED), (14.0, 4.9, claims.NOT_REPRODUCED)])
def test_14m_parameters_up_from_4m_is_two_sided_on_both(artifacts, shared_m, naive_m, verdict):
    """Bands 14 x 0.81-1.21 = 11.34-16.94M and 4 x 0.81-1.21 = 3.24-4.84M."""
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", single_gpu_frame(shared_m, naive_m))
    outcome = _outcomes(artifacts, "densenet_params_single_gpu")["smoke-cpu"]
    assert outcome.verdict == verdict
    assert f"shared: 496 layers, {shared_m:.1f}M parameters" in outcome.measured


def test_14m_parameters_needs_a_settled_simulated_search(artifacts):
    write(artifacts, "densenet_fig4_memory", "capped-cpu",
          single_gpu_frame(14.0, 4.0, shared_capped=True))
    write(artifacts, "densenet_fig4_memory", "far-cpu",
          single_gpu_frame(30.0, 4.0, shared_capped=True))
    write(artifacts, "densenet_fig4_memory", "none-cpu", fig4_frame("cpu", PAPER_LIKE))
    for run, budget in (("small-cpu", 6.0), ("large-cpu", 24.0)):
        write(artifacts, "densenet_fig4_memory", run,
              single_gpu_frame(14.0, 4.0).assign(memory_budget_gib=budget))
    outcomes = _outcomes(artifacts, "densenet_params_single_gpu")
    for run in ("small-cpu", "large-cpu"):
        assert outcomes[run].verdict == claims.NOT_MEASURED
        assert "not the claim's 12 GB" in outcomes[run].reason
    assert outcomes["capped-cpu"].verdict == claims.NOT_MEASURED
    assert "stopped at max_depth" in outcomes["capped-cpu"].reason
    assert outcomes["far-cpu"].verdict == claims.NOT_REPRODUCED  # already past the band
    assert outcomes["none-cpu"].verdict == claims.NOT_MEASURED


# --------------------------------------------------------------------------- not planned
NOT_PLANNED = {
    "densenet_luatorch_time_overhead": "densenet_fig5_time",
    "densenet_shared_gradient_no_time_cost": "densenet_fig5_time",
    "densenet_bn_time_share": "densenet_fig5_time",
    "densenet_luatorch_340_layers": "densenet_fig4_memory",
    "densenet_imagenet_vs_deepest_resnet": "densenet_fig6_imagenet",
    "iabn_imagenet_std_bn_capacity": "iabn_table1_imagenet",
    "iabn_leaky_relu_as_relu": "iabn_table1_imagenet",
}


def test_claims_no_point_measures_are_not_measured_and_say_what_it_takes(artifacts):
    assert {c["id"] for c in claims.load_claims(artifacts) if "not_planned" in c} == set(
        NOT_PLANNED) | {"iabn_table2_cityscapes_test", "iabn_table2_vistas_test",
                        "densenet_memory_160_layers", "densenet_naive_over_12gb_beyond_160_layers"}
    write(artifacts, "densenet_fig5_time", "paper-cuda", fig5_frame("cuda", {"shared": 18}))
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", with_simulated(
        fig4_frame("cpu", PAPER_LIKE), {"shared": (496, False, 502)}))
    write(artifacts, "densenet_fig6_imagenet", "smoke-cpu",
          pd.DataFrame({"device": ["cpu"], "env_device_name": ["a device"]}))
    write(artifacts, "iabn_table1_imagenet", "paper-cuda",
          imagenet_frame({"resnext101_bn_256": 77.04}))
    for claim_id, experiment in NOT_PLANNED.items():
        [outcome] = _outcomes(artifacts, claim_id).values()
        claim = claim_of(artifacts, claim_id)
        assert claim["experiment"] == experiment
        assert outcome.verdict == claims.NOT_MEASURED, claim_id
        assert outcome.reason == f"no planned point measures it: {claim['not_planned']}"
        assert "judging it takes" in claim["not_planned"], claim_id
    assert _outcomes(artifacts, "densenet_luatorch_time_overhead")["paper-cuda"].measured == (
        "PyTorch: DenseNet-BC-100, batch 64: shared storage +18.0% time over naive")
    assert _outcomes(artifacts, "densenet_luatorch_340_layers")["smoke-cpu"].measured == (
        "simulated tensor memory, 12 GiB: PyTorch shared fits 496 layers, not 502")
    for claim_id in ("densenet_shared_gradient_no_time_cost", "densenet_bn_time_share"):
        # no evaluator of their own: the run's points are not shown as their measurement
        assert _outcomes(artifacts, claim_id)["paper-cuda"].measured == "-", claim_id


# --------------------------------------------------------------------------- Fig. 1, Table 1
def test_a_residual_blocks_buffers_are_three_units(artifacts):
    write(artifacts, "iabn_table1_timing", "good-cpu", iabn_frame("cpu", GOOD))
    kept = {"standard": 2000, "checkpoint": 1000, "checkpoint_proposed": 1000,
            "inplace_abn_I": 2000, "inplace_abn_II": 1000}
    write(artifacts, "iabn_table1_timing", "kept-cpu", iabn_frame("cpu", GOOD, kept))
    fewer = {**kept, "standard": 1000, "inplace_abn_I": 1000}
    write(artifacts, "iabn_table1_timing", "fewer-cpu", iabn_frame("cpu", GOOD, fewer))
    outcomes = _outcomes(artifacts, "iabn_fig1_residual_block_buffers")
    assert outcomes["good-cpu"].verdict == claims.BY_CONSTRUCTION
    assert outcomes["good-cpu"].measured == ("buffers per block of 3 units: standard [6], "
                                             "inplace_abn_I [3], inplace_abn_II [3]")
    assert outcomes["kept-cpu"].verdict == claims.NOT_REPRODUCED   # 6 where the paper has 3
    assert outcomes["fewer-cpu"].verdict == claims.NOT_REPRODUCED  # 3 where the paper has 6


TABLE1 = {"resnext101_bn_256": 77.04, "resnext101_iabn_512": 78.08,
          "resnext152_iabn_256": 78.28, "wideresnet38_iabn_256": 79.72}


@pytest.mark.parametrize("changes, verdict", [
    ({}, claims.REPRODUCED), ({"resnext152_iabn_256": 77.0}, claims.NOT_REPRODUCED),
    ({"resnext101_bn_256": 78.1}, claims.NOT_REPRODUCED)])
def test_table1_more_memory_is_an_order(artifacts, changes, verdict):
    write(artifacts, "iabn_table1_imagenet", "paper-cuda", imagenet_frame({**TABLE1, **changes}))
    assert _outcomes(artifacts, "iabn_table1_order_more_memory")["paper-cuda"].verdict == verdict


@pytest.mark.parametrize("batch512, verdict", [
    (78.28, claims.REPRODUCED), (77.7, claims.NOT_REPRODUCED), (77.8, claims.REPRODUCED),
    (78.76, claims.REPRODUCED), (78.9, claims.NOT_REPRODUCED)])
def test_batch_512_is_similar_to_resnext152_either_side(artifacts, batch512, verdict):
    write(artifacts, "iabn_table1_imagenet", "paper-cuda",
          imagenet_frame({**TABLE1, "resnext101_iabn_512": batch512}))
    outcome = _outcomes(artifacts, "iabn_table1_batch512_like_resnext152")["paper-cuda"]
    assert outcome.verdict == verdict


def test_table1_orders_are_not_measured_off_the_setting_or_without_a_point(artifacts):
    write(artifacts, "iabn_table1_imagenet", "smoke-cpu", imagenet_frame(TABLE1, epochs=3))
    write(artifacts, "iabn_table1_imagenet", "short-cpu",
          imagenet_frame({"resnext101_bn_256": 77.04}))
    for claim_id in ("iabn_table1_order_more_memory", "iabn_table1_batch512_like_resnext152"):
        outcomes = _outcomes(artifacts, claim_id)
        assert outcomes["smoke-cpu"].verdict == claims.NOT_MEASURED
        assert "3 epochs" in outcomes["smoke-cpu"].reason
        assert outcomes["short-cpu"].verdict == claims.NOT_MEASURED
        assert "has no" in outcomes["short-cpu"].reason


# --------------------------------------------------------------------------- what judging takes
def to_judge_section(artifacts):
    text = claims.report(artifacts)
    return text.split("### What judging the claims not judged yet takes")[1].split("\n## ")[0]


def test_the_report_says_what_judging_each_open_claim_takes(artifacts):
    section = to_judge_section(artifacts)
    for claim in claims.load_claims(artifacts):  # nothing run: every claim is open
        listed = (f"- `{claim['id']}`: {claim['not_planned']}" if "not_planned" in claim
                  else f"`{claim['id']}`")
        assert listed in section, claim["id"]
    # Fig. 4 at the paper profile: 5 implementations x 25 depths, one GPU and 60 minutes each.
    fig4 = yaml.safe_load(claims.PAPER_PROFILE.read_text())["densenet_fig4_memory"]
    jobs = len(fig4["impls"]) * len(fig4["depths"])
    hours = jobs * fig4["cluster"]["runtime_min"] / 60
    row = next(line for line in section.splitlines() if line.startswith("| `densenet_fig4"))
    assert row.endswith(f"| cuda, 1 GPU(s) per job | none (generated tensors) | {jobs} | "
                        f"{hours:,.1f} |")
    table1 = next(line for line in section.splitlines()
                  if line.startswith("| `iabn_table1_imagenet`"))
    assert "| cuda, 1 or 4 GPU(s) per job | imagenet |" in table1


def test_judged_claims_leave_the_list_and_the_hours_follow_the_profile(artifacts, tmp_path):
    write(artifacts, "iabn_table1_timing", "paper-cuda", iabn_frame("cuda", GOOD))
    section = to_judge_section(artifacts)
    assert "`iabn_table1_timing`" not in section and "`iabn_time_overhead`" not in section
    profile = yaml.safe_load(claims.PAPER_PROFILE.read_text())
    profile["densenet_fig5_time"]["cluster"]["runtime_min"] = 90
    profile["densenet_fig5_time"]["depths"] = [100, 160]
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump(profile))
    rows = [(c, outcome) for c in claims.load_claims(artifacts)
            for _, _, outcome in claims.evaluate(c, artifacts)]
    lines = claims.to_judge(rows, path)
    fig5 = next(line for line in lines if line.startswith("| `densenet_fig5_time`"))
    assert fig5.endswith("| 2 | 3.0 |")  # two jobs of 1.5 hours on one GPU
