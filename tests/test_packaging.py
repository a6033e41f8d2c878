"""The conda environment and pyproject.toml list the same dependencies (every extra too)."""
import tomllib
from pathlib import Path

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
