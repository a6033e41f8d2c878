"""The source files a rule runs, for the Snakefile to name as the rule's inputs.

Snakemake reruns a job when an input is newer than its outputs (and its content changed), but
it does not see the code behind ``python -m experiments.<id>``: its ``code`` rerun trigger
covers the rule's own shell command and ``script:`` files only. So, as Snakemake's conventions
ask, every rule names the code it runs as inputs: :func:`module_sources` lists a module's file
and, transitively, every module of this project (``experiments``, ``layers``) it imports, with
the packages' ``__init__.py`` files that importing them runs; :func:`notebook_sources` does the
same for the imports of a notebook's code cells. Editing an experiment, or a shared module it
uses, then marks exactly the points that run that code out of date.

The imports are read from the source text (:mod:`ast`), never executed, so this is cheap and
imports no torch (the Snakefile calls it while it is parsed). Besides ``import`` statements,
nested ones included, it follows the two other ways this project loads its own code: a string
literal that names a module, such as ``"experiments.measure"`` in ``[sys.executable, "-m",
"experiments.measure"]`` (a package named so also brings its ``__main__.py``), and
``importlib.import_module(".cuda", __name__)``.
"""
import ast
import functools
import json
import os
import re
from pathlib import Path

#: The top-level packages of this project; imports of anything else (torch, numba) are not
#: followed.
PROJECT_PACKAGES = ("experiments", "layers")
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def _module_file(name, root):
    """The file of module ``name`` under ``root`` (a package's ``__init__.py``), or ``None``."""
    if name.split(".")[0] not in PROJECT_PACKAGES:
        return None
    base = Path(root, *name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _absolute(module, level, package):
    """The absolute name of ``from <level dots><module> import ...`` inside ``package``."""
    if not level:
        return module
    parts = package.split(".")[:len(package.split(".")) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def _names_in(tree, package, module_name):
    """The names of the modules the code ``tree`` (of module ``module_name`` in ``package``)
    may import. Candidates: ``from layers import InPlaceABN`` gives ``layers`` and
    ``layers.InPlaceABN``, and only names with a file (:func:`_module_file`) are modules."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # submodules
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            target = node.args[0].value
            level = len(target) - len(target.lstrip("."))
            if level and module_name is not None:  # import_module(".x", __name__)
                yield _absolute(target[level:], level, module_name)
            elif not level:
                yield target
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _MODULE_NAME.match(node.value)):
            yield node.value  # e.g. [sys.executable, "-m", "experiments.measure"]


def _with_parents(name, root):
    """The files importing ``name`` runs: its parent packages' ``__init__.py`` and its own
    file (and ``__main__.py`` for a package, which ``python -m`` runs)."""
    parts = name.split(".")
    files = [_module_file(".".join(parts[:i]), root) for i in range(1, len(parts) + 1)]
    main = Path(root, *parts, "__main__.py")
    return [f for f in files if f is not None] + ([main] if main.is_file() else [])


def _module_name(path, root):
    """The dotted name of the module at ``path`` under ``root``."""
    relative = Path(path).relative_to(root).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def _project_imports(path, mtime_ns, root):
    """The project modules the file ``path`` under ``root`` imports (cached per modification
    time: the Snakefile asks for the same shared modules once per rule)."""
    del mtime_ns  # the cache key only
    path, root = Path(path), Path(root)
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    # __name__ is "__main__" in a __main__.py: its import_module(".x", __name__) is not ours
    names = _names_in(tree, package, None if path.name == "__main__.py" else name)
    return tuple(dict.fromkeys(n for n in names if _module_file(n, root) is not None))


def _closure(names, root):
    """Every project file that importing (or running) the modules ``names`` runs, sorted."""
    root = Path(root).resolve()
    seen, pending = set(), [f for name in names for f in _with_parents(name, root)]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _project_imports(str(path), path.stat().st_mtime_ns, str(root)):
            pending += _with_parents(name, root)
    return sorted(seen)


def _shown(files, relative_to):
    """``files`` relative to ``relative_to`` where they lie below it, else absolute."""
    base = Path(relative_to or os.getcwd()).resolve()
    out = []
    for f in files:
        try:
            out.append(str(f.relative_to(base)))
        except ValueError:
            out.append(str(f))
    return out


def module_sources(*modules, root, relative_to=None):
    """The source files that running the modules ``modules`` (``"experiments.<id>"``) runs,
    found under the checkout ``root``: each module's file and every project module it
    imports, transitively. Paths are relative to ``relative_to`` (default: the current
    directory, Snakemake's working directory) where they lie below it, else absolute."""
    missing = [m for m in modules if _module_file(m, Path(root).resolve()) is None]
    if missing:
        raise ValueError(f"modules={missing}: no such module of {PROJECT_PACKAGES} under {root}")
    return _shown(_closure(modules, root), relative_to)


def notebook_sources(notebook, root, relative_to=None):
    """The project source files the code cells of ``notebook`` (a ``.ipynb``) import, as
    :func:`module_sources` lists them (IPython's ``%magic`` and ``!shell`` lines skipped)."""
    cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
    code = "\n".join(
        line for cell in cells if cell["cell_type"] == "code"
        for line in "".join(cell["source"]).splitlines()
        if not line.lstrip().startswith(("%", "!")))
    names = [name for name in _names_in(ast.parse(code, filename=str(notebook)), "", None)
             if _module_file(name, Path(root).resolve()) is not None]
    return _shown(_closure(names, root), relative_to)


__all__ = ["PROJECT_PACKAGES", "module_sources", "notebook_sources"]
