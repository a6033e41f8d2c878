"""Never a user's file deleted: every command that removes or replaces a folder refuses a folder
that holds a file of the user's, says so naming it, and leaves the file as it was, byte for
byte.

The folders: a training point's ``--work-dir`` (removed once the point finishes), a generated
data set's root (replaced by ``--overwrite``; the Snakemake rule that generates it), and the
fork server's socket folder (removed when the workflow ends): all go through
:mod:`experiments.records.ownership`.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments.train.data import generate_cifar

ROOT = Path(__file__).resolve().parents[1]
USER_BYTES = b"my notes, not a checkpoint\n\x00\xff"


def _user_folder(path):
    """A folder of the user's: one file with bytes no tool writes, and an old time stamp (as a
    data set downloaded long ago: older than any code, so Snakemake sees it out of date)."""
    path.mkdir(parents=True)
    (path / "notes.txt").write_bytes(USER_BYTES)
    os.utime(path, (946684800, 946684800))  # 2000-01-01
    return path


def _intact(path):
    return sorted(p.name for p in path.iterdir()) == ["notes.txt"] and (
        path / "notes.txt").read_bytes() == USER_BYTES


def _python_m(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "cifar10"
    generate_cifar(root, "cifar10", train_per_class=2, test_per_class=1)
    return root


def _preact_point(data, tmp_path, work_dir):
    return _python_m("experiments.densenet_fig2_preact", "--dataset", "cifar10", "--data",
                     str(data), "--model-arg", "depth=10", "--model-arg", "growth_rate=2",
                     "--epochs", "1", "--batch", "10", "--schedule", "cifar",
                     "--out", str(tmp_path / "p.json"), "--epochs-csv", str(tmp_path / "p.csv"),
                     "--weights", str(tmp_path / "p.pt"), "--work-dir", str(work_dir))


def _segmentation_point(data, tmp_path, work_dir):
    return _python_m("experiments.iabn_table2_segmentation", "--dataset", "cityscapes",
                     "--data", str(data), "--body", "resnext101", "--norm", "bn", "--crops",
                     "2", "--crop", "32", "--epochs", "1",
                     "--out", str(tmp_path / "p.json"), "--epochs-csv", str(tmp_path / "p.csv"),
                     "--weights", str(tmp_path / "p.pt"), "--work-dir", str(work_dir))


@pytest.mark.parametrize("point", [_preact_point, _segmentation_point])
def test_a_training_point_refuses_a_work_dir_holding_a_users_file(cifar, tmp_path, point):
    """``--work-dir`` naming a folder of the user's (``--work-dir .`` in a project folder) was
    emptied once the point finished; now the point stops before training, naming it."""
    mine = _user_folder(tmp_path / "mine")
    done = point(cifar, tmp_path, mine)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--work-dir" in done.stderr and str(mine) in done.stderr
    assert "notes.txt" in done.stderr  # what is in the way, named
    assert "Traceback" not in done.stderr
    assert _intact(mine)
    assert not (tmp_path / "p.json").exists()  # refused before anything was written


def test_a_finished_point_keeps_the_empty_work_dir_it_was_given(cifar, tmp_path):
    """An existing empty ``--work-dir`` is the user's folder: the point uses it and, finished,
    removes its own checkpoint from it and leaves the folder."""
    given = tmp_path / "given"
    given.mkdir()
    done = _preact_point(cifar, tmp_path, given)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "p.json").is_file()
    assert given.is_dir() and list(given.iterdir()) == []


def test_the_generator_never_replaces_a_folder_it_did_not_generate(tmp_path):
    """``--overwrite`` replaces a data set generated here; a folder of the user's is refused
    (status 2, one line naming it) and left as it was."""
    mine = _user_folder(tmp_path / "imagenet")
    done = _python_m("experiments.train.data.generate", "imagenet", "--out", str(mine),
                     "--classes", "2", "--train-per-class", "1", "--test-per-class", "1",
                     "--overwrite")
    assert done.returncode == 2
    assert str(mine) in done.stderr and "not generated here" in done.stderr
    assert _intact(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imagenet"]  # no temporaries left


def test_the_pipeline_never_deletes_a_data_root_it_did_not_generate(tmp_path):
    """A profile whose data root names the user's folder while ``generate`` is still set: the
    generate job fails with an error naming the folder, and the folder survives (Snakemake
    deleted a ``directory()`` output before the job could refuse)."""
    mine = _user_folder(tmp_path / "my_imagenet")
    work = tmp_path / "work"
    work.mkdir()
    configfile = tmp_path / "mine.yaml"
    configfile.write_text(yaml.safe_dump({"profile": "smoke", "forkserver": False, "datasets": {
        "imagenet": {"root": str(mine), "generate": {"train_per_class": 1, "test_per_class": 1,
                                                     "classes": 2, "seed": 0}}}}))
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(work),
         "--nolock", "generate_imagenet", "--cores", "1", "--configfile", str(configfile)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert _intact(mine)
    log = (work / "artifacts" / "logs" / "data" / "imagenet.log").read_text()
    assert str(mine) in log and "not generated here" in log


def test_removal_refuses_a_folder_without_the_marker(tmp_path):
    """The one way the tools remove a folder (training work dirs, replaced data sets, the fork
    server's socket folder) refuses a folder it cannot prove it created, and an adopted empty
    folder loses only the tool's own files."""
    from experiments.records import ownership

    mine = _user_folder(tmp_path / "mine")
    with pytest.raises(ownership.NotOwnedError, match="mine"):
        ownership.remove(mine)
    assert _intact(mine)
    with pytest.raises(ownership.NotOwnedError, match="notes.txt"):
        ownership.claim(mine, "test", "--work-dir")
    assert _intact(mine)

    adopted = tmp_path / "adopted"
    adopted.mkdir()
    ownership.claim(adopted, "test", "--work-dir")
    (adopted / "last.pt").write_bytes(b"checkpoint")
    (adopted / "notes.txt").write_bytes(USER_BYTES)  # the user's, added while it ran
    ownership.remove(adopted, own=("last.pt",))
    assert _intact(adopted)
