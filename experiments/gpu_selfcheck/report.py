"""The self-check's one-page Markdown report, a pure function of its recorded JSON.

:func:`render_markdown` takes the dict the self-check writes as JSON (read back or in memory)
and returns the report: a summary (checks passed / failed / skipped, the layer tests on CUDA,
timing goals met), the failures (or "none"), and the timing table against the floors and goals.
:func:`summarize` gives the same counts as a dict; :func:`artifact_stem` turns a GPU name into
the file name both files share. Nothing here needs torch or a GPU.
"""
import re
from collections import Counter

#: Rows of the failure table shown; the JSON holds every record.
MAX_FAILURE_ROWS = 25
MAX_FAILED_TESTS = 15
#: The ratio columns of the timing table: (ratio name, header).
RATIO_COLUMNS = (("forward_over_copy", "fwd / copy"), ("backward_I_over_copy", "bwd I / copy"),
                 ("backward_II_over_copy", "bwd II / copy"))


def artifact_stem(gpu_name):
    """A file-name stem for ``gpu_name``: runs of characters other than letters, digits, ``.``,
    ``_`` and ``-`` become ``_`` (``"NVIDIA H100 80GB HBM3"`` -> ``"NVIDIA_H100_80GB_HBM3"``);
    no leading or trailing ``.``/``_``/``-``; ``"unknown_gpu"`` if nothing is left."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", str(gpu_name or "")).strip("._-")
    return stem or "unknown_gpu"


def summarize(result):
    """Counts of a self-check result: ``checks`` (per status), ``layer_tests`` (``None`` if not
    run), ``goals`` (met / total), ``below_floor``, ``timing_errors``, and ``ok``: no check
    failed or errored, the layer tests did not fail (they passed, or could not run here) and
    every timing point ran."""
    checks = Counter({"pass": 0, "fail": 0, "error": 0, "skipped": 0})
    checks.update(r["status"] for r in result.get("checks", []))
    goals = {"met": 0, "total": 0}
    below_floor = 0
    timing_errors = 0
    for point in result.get("timings", []):
        if point.get("status") != "pass":
            timing_errors += 1
            continue
        for ratio in point["ratios"].values():
            goals["total"] += 1
            goals["met"] += bool(ratio["goal_met"])
            below_floor += bool(ratio["below_floor"])
    layer_tests = result.get("layer_tests")
    ok = (checks["fail"] + checks["error"] == 0 and timing_errors == 0
          and (layer_tests is None or layer_tests["status"] != "fail"))
    return {"checks": dict(checks), "layer_tests": layer_tests, "goals": goals,
            "below_floor": below_floor, "timing_errors": timing_errors, "ok": ok}


def _number(value, digits=3):
    return "-" if value is None else f"{value:.{digits}g}"


def _cell(text):
    """Text safe in a Markdown table cell (one line, no column separators)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _header(result):
    env = result.get("environment", {})
    gpu = env.get("gpu") or {}
    settings = result.get("settings", {})
    commit = (env.get("git_commit") or "unknown")[:12]
    parts = [f"torch {env.get('torch')}", f"CUDA {env.get('cuda_runtime')}",
             f"cuDNN {gpu.get('cudnn')}", f"numba {env.get('numba')}"]
    if gpu.get("capability"):
        parts.append(f"compute capability {gpu['capability']}")
    line = (f"{env.get('date_utc', 'date unknown')}, commit {commit}; " + ", ".join(parts)
            + ("; **quick run**" if settings.get("quick") else ""))
    return [f"# GPU self-check: {env.get('device_name') or 'unknown GPU'}", "", line, ""]


def _summary_lines(result, summary):
    checks = summary["checks"]
    total = sum(checks.values())
    failed = checks["fail"] + checks["error"]
    lines = [f"**{'PASSED' if summary['ok'] else 'FAILED'}.** "
             f"Checks: **{checks['pass']} of {total} passed, {failed} failed**"
             + (f" ({checks['error']} of them errors)" if checks["error"] else "")
             + (f", {checks['skipped']} skipped" if checks["skipped"] else "") + "."]
    tests = summary["layer_tests"]
    if tests is None:
        lines.append("Layer tests on CUDA: not run.")
    elif tests["status"] == "skipped":
        lines.append(f"Layer tests on CUDA: not run: {tests['reason']}.")
    else:
        env = " ".join(f"{k}={v}" for k, v in tests["environment"].items())
        files = " ".join(tests["test_files"])
        lines.append(f"Layer tests (`{env} pytest -m {tests['marker']} {files}`): "
                     f"**{tests['passed']} passed, "
                     f"{tests['failed'] + tests['errors']} failed**, {tests['skipped']} skipped"
                     + (" (timed out)" if tests.get("timed_out") else "")
                     + (f", pytest exit status {tests['returncode']}"
                        if tests["status"] != "pass" else "") + ".")
    goals = summary["goals"]
    timing = (f"Timing goals met: **{goals['met']} of {goals['total']}** (InPlace-ABN training "
              "forward <= 1.7 copies, backward <= 2.8 copies, on an H100-class GPU)")
    if summary["below_floor"]:
        timing += f"; {summary['below_floor']} ratio(s) below their floor (see the table)"
    if summary["timing_errors"]:
        timing += f"; {summary['timing_errors']} timing point(s) failed to run"
    lines.append(timing + ".")
    return [" ".join(lines[:1]), "", *(f"- {line}" for line in lines[1:]), ""]


def _failure_lines(result):
    failures = [r for r in result.get("checks", []) if r["status"] in ("fail", "error")]
    lines = ["## Failures", ""]
    if not failures:
        lines += ["none", ""]
    else:
        lines += ["| check | status | max abs error | max rel error | bound | message |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in failures[:MAX_FAILURE_ROWS]:
            lines.append(f"| {_cell(r['name'])} | {r['status']} | {_number(r['max_abs_error'])} "
                         f"| {_number(r['max_rel_error'])} | {_number(r['bound'])} "
                         f"| {_cell(r['message'] or '')} |")
        if len(failures) > MAX_FAILURE_ROWS:
            lines.append(f"\n... and {len(failures) - MAX_FAILURE_ROWS} more failures: see the "
                         "JSON file beside this report.")
        lines.append("")
    skipped = Counter(r["message"] for r in result.get("checks", []) if r["status"] == "skipped")
    for message, n in skipped.items():
        lines += [f"Skipped ({n} check(s)): {_cell(message)}", ""]
    tests = result.get("layer_tests")
    if tests is not None and tests["status"] == "fail":
        lines.append("Layer tests that failed on CUDA:"
                     + ("" if tests["failures"] else " (none reported; see `output_tail` in "
                        "the JSON)"))
        lines += [f"- `{t}`" for t in tests["failures"][:MAX_FAILED_TESTS]]
        if len(tests["failures"]) > MAX_FAILED_TESTS:
            lines.append(f"- ... and {len(tests['failures']) - MAX_FAILED_TESTS} more")
        lines.append("")
    return lines


def _ratio_cell(ratio):
    text = f"{ratio['value']:.2f} {'✓' if ratio['goal_met'] else '✗'}"
    return text + (" (below floor)" if ratio["below_floor"] else "")


def _timing_lines(result):
    settings = result.get("settings", {})
    floors = {n: b["floor"] for n, b in settings.get("bounds", {}).items()}
    goals = {n: b["goal"] for n, b in settings.get("bounds", {}).items()}
    lines = ["## Timing", "",
             f"Median of {settings.get('repeats')} runs after {settings.get('warmup')} warm-up "
             "runs, interleaved; ratios in copies (a device-to-device `copy_` of the tensor: "
             "one read, one write). Floors (the passes the kernels cannot avoid): forward "
             f"{floors.get('forward_over_copy', 1.5)}, backward "
             f"{floors.get('backward_I_over_copy', 2.5)}; goals: forward <= "
             f"{goals.get('forward_over_copy', 1.7)}, backward <= "
             f"{goals.get('backward_I_over_copy', 2.8)} (✓ met, ✗ not met). Speedup: "
             "`F.batch_norm` + leaky ReLU forward+backward time over InPlace-ABN's (I, II). "
             "`*`: the tensor fits in the L2 cache, so ratios may undercut the floors.", ""]
    points = result.get("timings", [])
    if not points:
        return lines + ["not run", ""]
    lines += ["| shape | dtype | layout | copy ms | copy GB/s | "
              + " | ".join(h for _, h in RATIO_COLUMNS) + " | speedup I | speedup II |",
              "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in RATIO_COLUMNS)
              + " | --- | --- |"]
    for p in points:
        shape = "x".join(map(str, p["shape"])) + ("*" if p.get("fits_in_l2") else "")
        head = f"| {shape} | {p['dtype']} | {p['layout']} |"
        if p.get("status") != "pass":
            lines.append(f"{head} error: {_cell(p.get('message'))} |"
                         + " |" * (3 + len(RATIO_COLUMNS)))
            continue
        speedups = p["speedup_vs_batch_norm_act"]
        lines.append(f"{head} {p['results']['copy']['median_s'] * 1e3:.3f} | "
                     f"{p['copy_bandwidth_GBps']:.0f} | "
                     + " | ".join(_ratio_cell(p["ratios"][name]) for name, _ in RATIO_COLUMNS)
                     + f" | {speedups['I']:.2f} | {speedups['II']:.2f} |")
    return lines + [""]


def render_markdown(result):
    """The one-page report of a self-check ``result`` (the dict written as JSON)."""
    summary = summarize(result)
    lines = _header(result) + _summary_lines(result, summary) + _failure_lines(result) \
        + _timing_lines(result)
    durations = result.get("durations_s")
    if durations:
        lines += ["Seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in durations.items()) + ".",
                  ""]
    return "\n".join(lines)


__all__ = ["artifact_stem", "render_markdown", "summarize"]
