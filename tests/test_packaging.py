"""The packaging: the conda environment and pyproject.toml list the same dependencies (every
extra too), the lock pins them within their ranges, CI runs what the README tells a newcomer."""
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_env_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = set(project["dependencies"]).union(*project["optional-dependencies"].values())
    declared = {d for d in declared if not d.startswith(project["name"] + "[")}  # extras of extras
    environment = yaml.safe_load((ROOT / "env.yml").read_text())
    pip_section = next(d["pip"] for d in environment["dependencies"] if isinstance(d, dict))
    listed = {entry for entry in pip_section if not entry.startswith("-e")}
    assert listed == declared, (
        f"only in env.yml: {sorted(listed - declared)}; "
        f"only in pyproject.toml: {sorted(declared - listed)}"
    )
    python = next(d for d in environment["dependencies"] if str(d).startswith("python="))
    assert project["requires-python"] == ">=" + python.split("=")[1]


def test_import_layers_is_fast_and_compiles_nothing():
    import subprocess
    import sys

    code = ("import sys, layers; "
            "print(bool({'layers.kernels.cpu', 'layers.kernels.cuda'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False", "importing layers must not load the kernels"


# --------------------------------------------------------------------------- the lock and CI
def _declared_requirements():
    """pyproject's requirements for the locked install ('.[dev]', with the export extra)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = [*project["dependencies"], *extras["dev"], *extras["export"]]
    return [Requirement(d) for d in declared if not d.startswith(project["name"] + "[")]


def test_lock_pins_every_requirement_within_its_range():
    from packaging.utils import canonicalize_name

    from experiments.records.lock import read_pins

    pins = {canonicalize_name(name): version for name, version in read_pins().items()}
    missing = [str(r) for r in _declared_requirements() if canonicalize_name(r.name) not in pins]
    outside = [f"{r} (locked {pins[canonicalize_name(r.name)]})"
               for r in _declared_requirements()
               if canonicalize_name(r.name) in pins
               and not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not missing, f"requirements.lock pins none of {missing}: run .ci/lock"
    assert not outside, f"requirements.lock is outside pyproject's ranges: {outside}"


def test_lock_reader_refuses_what_pip_freeze_never_writes(tmp_path):
    from experiments.records.lock import read_pins

    lock = tmp_path / "requirements.lock"
    lock.write_text("# comment\nnumpy==2.4.6  # trailing\n\npandas>=2.0\n")
    with pytest.raises(ValueError, match=r"requirements.lock:4: expected 'name==version'"):
        read_pins(lock)


def test_lock_differences_name_each_package_that_is_not_at_its_pin():
    from importlib import metadata

    from experiments.records.lock import differences

    installed = metadata.version("pytest")
    assert differences({"pytest": installed}) == []
    assert differences({"pytest": "0.0.1", "no-such-package-here": "1.0"}) == [
        "no-such-package-here: installed none, locked 1.0",
        f"pytest: installed {installed}, locked 0.0.1"]


def test_records_say_whether_the_install_is_the_locked_one():
    from experiments.records.environment import describe_environment
    from experiments.records.lock import differences, read_pins

    install = describe_environment()["install"]
    assert install["lock_file"] == "requirements.lock"
    assert install["differs_from_lock"] == differences(read_pins())
    assert install["matches_lock"] is (not install["differs_from_lock"])


def _quick_start_commands():
    """The shell lines of the README's first code block (the quick start)."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_set_up_and_test_commands_verbatim():
    """CI sees what a newcomer gets: the README's fresh environment, install and test command."""
    ci = (ROOT / ".ci" / "run").read_text()
    commands = _quick_start_commands()
    venv = next(c for c in commands if "venv" in c)
    test = next(c for c in commands if c.endswith("python -m pytest"))
    assert venv.startswith("python3 -m venv .venv")
    assert "fresh_venv .venv\n" in ci and "python3 -m venv \"$1\"" in ci
    assert test in ci
    assert "pip install -c requirements.lock -e '.[dev]'" in ci
    readme = (ROOT / "README.md").read_text()
    assert "pip install -c requirements.lock -e '.[dev]'" in readme
