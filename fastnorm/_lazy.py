"""Public names resolved on first use, so that importing a package costs only what is used.

``fastnorm.diagnose`` needs no torch; ``fastnorm.total_norm`` imports the
compute core (and torch) the first time it is looked up. A package maps each
public name to ``"module"`` (the same name there) or ``"module:attribute"``;
``from fastnorm import X``, ``fastnorm.X`` and ``dir(fastnorm)`` then behave
as with eager imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def attach(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each of ``names`` is imported
    from its module when first looked up, then kept in the package's namespace."""

    def __getattr__(name: str) -> Any:
        try:
            module, _, attribute = names[name].partition(":")
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), attribute or name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(names))

    return __getattr__, __dir__
