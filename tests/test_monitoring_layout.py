"""The monitoring subpackage: modules that depend one way, and every public name where it was."""

import ast
from pathlib import Path

import fastnorm

PACKAGE = Path(fastnorm.__file__).parent / "monitoring"
# Each module may import only modules earlier in this order.
ORDER = [
    "series", "diagnosis", "plot", "layer_stats", "loggers", "optimizer", "values", "alerts", "monitor",
    "command",
]  # fmt: skip
# The same inside the diagnosis, whose modules each hold one part of it.
DIAGNOSIS = [
    "events", "robust", "advice", "schedule", "skips", "layers", "norm", "loss", "objective", "zeros",
    "diagnoser", "whole",
]  # fmt: skip
# What of fastnorm outside monitoring the monitoring modules may import: never the compute core.
OUTSIDE = {"fastnorm", "fastnorm._lazy", "fastnorm.checks"}


def imports(path):
    """Every module ``path`` imports, as written (``from a import b`` counts as ``a.b`` and ``a``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def siblings(path, package):
    """The modules of ``package`` (dotted) that ``path`` imports, by their last name."""
    prefix = package + "."
    return {name[len(prefix) :].split(".")[0] for name in imports(path) if name.startswith(prefix)}


def check_order(folder, package, order):
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    modules += sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
    assert sorted(modules) == sorted(order)
    for i, module in enumerate(order):
        path = folder / f"{module}.py"
        if not path.is_file():
            path = folder / module / "__init__.py"
        later = siblings(path, package) - set(order[: i + 1])  # a subpackage imports its own modules
        assert not later, f"{package}.{module} imports {sorted(later)}, which come after it"


def test_modules_depend_one_way():
    check_order(PACKAGE, "fastnorm.monitoring", ORDER)


def test_the_diagnosis_modules_depend_one_way():
    check_order(PACKAGE / "diagnosis", "fastnorm.monitoring.diagnosis", DIAGNOSIS)


def test_monitoring_never_imports_the_compute_core():
    def allowed(name):  # a module of OUTSIDE, or a name imported from one of them (fastnorm.checks.X)
        return name in OUTSIDE or any(name.startswith(f"{o}.") for o in OUTSIDE - {"fastnorm"})

    for path in PACKAGE.rglob("*.py"):
        outside = {
            name
            for name in imports(path)
            if name.startswith("fastnorm")
            and not name.startswith("fastnorm.monitoring")
            and not allowed(name)
        }
        assert not outside, f"{path.relative_to(PACKAGE)} imports {sorted(outside)}"


def test_the_diagnosis_imports_nothing_but_the_standard_library_and_checks():
    for path in (PACKAGE / "diagnosis").glob("*.py"):
        third_party = {
            name.split(".")[0]
            for name in imports(path)
            if not name.startswith(("fastnorm.monitoring.diagnosis", "fastnorm.checks", "__future__"))
            and name != "fastnorm"
        }
        allowed = {
            "bisect",
            "collections",
            "dataclasses",
            "itertools",
            "math",
            "typing",
        }
        assert third_party <= allowed, f"{path.name} imports {sorted(third_party - allowed)}"


def test_public_names_importable_from_fastnorm():
    from fastnorm import monitoring

    for name in monitoring.__all__:
        assert getattr(fastnorm, name) is getattr(monitoring, name)
        assert name in fastnorm.__all__
