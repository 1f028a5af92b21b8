"""The monitoring subpackage: modules that depend one way, and every public name where it was."""

import ast
from pathlib import Path

import fastnorm

PACKAGE = Path(fastnorm.__file__).parent / "monitoring"
# Each module may import only modules earlier in this order.
ORDER = ["series", "diagnosis", "plot", "loggers", "monitor", "command"]


def imported_siblings(module):
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "fastnorm.monitoring":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("fastnorm.monitoring."):
                found.add(node.module.rsplit(".", 1)[1])
        elif isinstance(node, ast.Import):
            found.update(
                a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith("fastnorm.monitoring.")
            )
    return found


def test_modules_depend_one_way():
    assert sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__") == sorted(ORDER)
    for i, module in enumerate(ORDER):
        later = imported_siblings(module) - set(ORDER[:i])
        assert not later, f"monitoring.{module} imports {sorted(later)}, which come after it"


def test_public_names_importable_from_fastnorm():
    from fastnorm import monitoring

    for name in monitoring.__all__:
        assert getattr(fastnorm, name) is getattr(monitoring, name)
        assert name in fastnorm.__all__
