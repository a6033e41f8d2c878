"""A killed training point resumes only with the options it was started with: a rerun with an
option that changes results (the data transforms, the evaluations, the norm, the thread count)
is refused with the option named, both values, in one line and no traceback, and the
checkpoint is kept for the rerun with the right options, which resumes from it.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.train.data import generate_imagenet

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """``(options, work_dir)``: an ImageNet point killed (SIGKILL) once its first checkpoint
    is written."""
    tmp = tmp_path_factory.mktemp("resume")
    data = tmp / "imagenet"
    generate_imagenet(data, classes=2, train_per_class=4, val_per_class=1, sizes=[(24, 24)])
    work = tmp / "work"
    options = ["experiments.iabn_table1_imagenet", "--data", str(data), "--model",
               "densenet_bc", "--model-arg", "depth=10", "--model-arg", "growth_rate=2",
               "--epochs", "30", "--batch", "4", "--schedule", "step", "--resize", "20",
               "--crop", "16", "--eval", "center=center:20:16", "--threads", "1",
               "--out", str(tmp / "p.json"), "--epochs-csv", str(tmp / "p.csv"),
               "--weights", str(tmp / "p.pt"), "--work-dir", str(work)]
    run = subprocess.Popen([sys.executable, "-m", *options], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (work / "last.pt").exists():
        assert run.poll() is None and time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.05)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    return options, work


#: (option, value of the killed run, value of the rerun): each changes the results.
CHANGES = [("--resize", "20", "24"), ("--crop", "16", "12"), ("--threads", "1", "2"),
           ("--eval", "center=center:20:16", "center=center:16:16")]


def test_a_resume_with_other_result_changing_options_is_refused_naming_each(killed):
    options, work = killed
    changed = list(options)
    for flag, saved, value in CHANGES:
        assert changed[changed.index(flag) + 1] == saved
        changed[changed.index(flag) + 1] = value
    changed += ["--norm", "iabn"]  # the killed run's bn: the same state-dict layout
    checkpoint = (work / "last.pt").read_bytes()
    done = subprocess.run([sys.executable, "-m", *changed], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(work / "last.pt") in lines[0], done.stderr[-3000:]
    differences = lines[0].split("; ")
    for flag, saved, value in CHANGES + [("--norm", "bn", "iabn")]:
        named = [d for d in differences if f"{flag}:" in d]
        assert len(named) == 1 and "in the checkpoint" in named[0], (flag, lines[0])
        if flag != "--eval":  # the evaluations are listed as (name, mode, resize, crop)
            assert f"{saved!r} in the checkpoint, {value!r} now".replace("'", "") in \
                named[0].replace("'", ""), named[0]
    assert (work / "last.pt").read_bytes() == checkpoint  # kept for the right rerun

    same = subprocess.run([sys.executable, "-m", *options], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert same.returncode == 0, same.stderr[-3000:]
    assert f"resuming from {work / 'last.pt'}" in same.stderr
    assert not work.exists()  # the finished point removed the folder it created


def test_the_imagenet_crop_style_is_part_of_the_resume_fingerprint(tmp_path):
    """Random-sized crops (DenseNet Fig. 6) train other weights than shorter-side crops: a
    resume with the other style is refused, and the artifact's config records the style."""
    from experiments.train import point

    (tmp_path / "data").mkdir()
    p = point.parser("densenet_fig6_imagenet", "")

    def parsed(*extra):
        return point.check(p, p.parse_args([
            "--dataset", "imagenet", "--data", str(tmp_path / "data"), "--model",
            "densenet264", "--epochs", "1", "--batch", "2", "--schedule", "step",
            "--out", "o.json", "--epochs-csv", "o.csv", "--weights", "o.pt",
            "--work-dir", str(tmp_path / "work"), *extra]))

    default, scaled = parsed(), parsed("--crop-style", "random_resized")
    assert point.resume_options(default)["--crop-style"] == "resize_crop"
    assert point.resume_options(scaled)["--crop-style"] == "random_resized"
    assert point.configuration(scaled, {})["crop_style"] == "random_resized"


def test_a_segmentation_resume_matches_the_pretrained_weights_by_content(tmp_path):
    """The body's ImageNet weights are what a segmentation point starts from: the same file
    moved elsewhere resumes, other weights under the same name do not; paths and --workers
    change no result and stay out."""
    from experiments.train import seg_point

    (tmp_path / "data").mkdir()
    weights = tmp_path / "body.pt"
    weights.write_bytes(b"weights one")
    p = seg_point.parser("iabn_table2_segmentation", "")

    def options(*extra):
        return seg_point.resume_options(seg_point.check(p, p.parse_args([
            "--dataset", "cityscapes", "--data", str(tmp_path / "data"), "--body",
            "resnext101", "--norm", "iabn", "--crops", "2", "--crop", "32", "--epochs", "1",
            "--out", "o.json", "--epochs-csv", "o.csv", "--weights", "o.pt",
            "--work-dir", str(tmp_path / "work"), "--pretrained", str(weights), *extra])))

    first = options()
    moved = tmp_path / "elsewhere.pt"
    weights.rename(moved)
    weights = moved
    assert options("--workers", "3") == first
    weights.write_bytes(b"weights two")
    assert options()["--pretrained"] != first["--pretrained"]
    assert {"--threads", "--crop", "--scale", "--eval", "--bootstrap-m"} <= set(first)
