"""Argument checks shared by the core, ``StepClipper``, the monitor, the diagnosis
and the integrations: one rule per argument, one message naming it.

Pure Python (no torch), so that the diagnosis can use it without importing torch.
Each check returns the value normalised (``float``/``int``) or raises a
``TypeError`` (wrong kind of value) or ``ValueError`` (a value out of range)
whose message starts with the function or class it was given to (``owner``).

What comes from outside the program (a file's contents, a command's argument)
is checked where it is read, once, and a bad value raises :class:`InputError`,
whose message names the file or the argument: the fastnorm command turns it
into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import collections
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any


class InputError(ValueError):
    """A bad input from outside the program: a file that cannot be read as what it claims to be, a
    value logged in it that is out of range, a command's argument. Its message names the file (and
    where in it) or the argument; the fastnorm command prints it on one line and exits with 2."""


def number_argument(
    low: float, *, above: bool = False, finite: bool = True, integer: bool = False
) -> Callable[[str], Any]:
    """An argparse ``type=`` for a number argument: the text as a float (an int with ``integer``),
    refused with a message that says what is allowed unless it is >= ``low`` (> with ``above``),
    not NaN, and finite (unless not ``finite``: ``inf`` is then allowed)."""
    kind = "a whole number" if integer else ("a finite number" if finite else "a number")
    rule = f"{kind} {'>' if above else '>='} {low:g}"

    def parse(text: str) -> Any:
        try:
            value: Any = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}") from None
        bad = math.isnan(value) or (finite and math.isinf(value)) or (value <= low if above else value < low)
        if bad:
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value

    return parse


def _is_number(value: Any) -> bool:
    """A real number: int, float, NumPy scalars; never a bool or a string."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def max_norm(value: Any, owner: str, *, optional: bool = False) -> float | None:
    """A clipping threshold: a real number >= 0 (``inf`` never clips).

    Refused: NaN and negative values (they would poison or flip every gradient),
    bools and strings (``'1.0'`` and ``True`` are mistakes, not thresholds), and
    tensors (reading one on the host is a sync: pass ``float(t)`` once). With
    ``optional``, None is kept (no clipping threshold known).
    """
    if value is None and optional:
        return None
    if not _is_number(value):
        kind = "a number >= 0" + (" or None" if optional else "")
        hint = " (read it once with float(...))" if type(value).__name__ == "Tensor" else ""
        raise TypeError(f"{owner}: max_norm must be {kind}, got {value!r} ({type(value).__name__}){hint}")
    bound = float(value)
    if math.isnan(bound) or bound < 0:
        raise ValueError(
            f"{owner}: max_norm must be >= 0, got {value!r} (a negative or NaN max_norm "
            "would flip or poison every gradient)"
        )
    return bound


def norm_type(value: Any, owner: str) -> float:
    """torch's ``float(norm_type)``: any number, ``'inf'`` or ``'-inf'``; NaN is refused."""
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{owner}: norm_type must be a number, 'inf' or '-inf', got {value!r}") from None
    if math.isnan(p):
        raise ValueError(f"{owner}: norm_type must be a number, 'inf' or '-inf', got {value!r}")
    return p


def positive_int(value: Any, name: str, owner: str) -> int:
    """``value`` as an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    return int(value)


def positive_number(value: Any, name: str, owner: str) -> float:
    """``value`` as a float > 0."""
    if not _is_number(value) or not value > 0:
        raise ValueError(f"{owner}: {name} must be a number > 0, got {value!r}")
    return float(value)


def boolean(value: Any, name: str, owner: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be True or False, got {value!r}")
    return value


def loggers(value: Any, owner: str) -> list[Any]:
    """A list of loggers: objects with ``log_window`` and ``close``."""
    if isinstance(value, (str, bytes)) or hasattr(value, "log_window") or not isinstance(value, Sequence):
        raise TypeError(
            f"{owner}: loggers must be a sequence of Logger (e.g. [JsonlLogger(path)]), got {value!r}"
        )
    for logger in value:
        if not (callable(getattr(logger, "log_window", None)) and callable(getattr(logger, "close", None))):
            raise TypeError(
                f"{owner}: every logger needs log_window() and close() (subclass fastnorm.Logger), "
                f"got {logger!r}"
            )
    return list(value)


def names(value: Any, name: str, owner: str) -> list[str]:
    """A sequence of distinct strings (None: none)."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{owner}: {name} must be a sequence of str, got {value!r}")
    found = list(value)
    bad = [n for n in found if not isinstance(n, str)]
    if bad:
        raise TypeError(f"{owner}: {name} must be strings, got {bad[0]!r}")
    repeated = sorted(n for n, k in collections.Counter(found).items() if k > 1)
    if repeated:
        raise ValueError(f"{owner}: {name} must be distinct, repeated: {', '.join(repeated)}")
    return found


def diagnoser(value: Any, owner: str, kind: type) -> Any:
    """``diagnose=``: an instance of ``kind`` (the Diagnoser class, passed in so that this module imports
    nothing of fastnorm) is used as given; True makes a default one, False none (None is returned)."""
    if isinstance(value, kind):
        return value
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: diagnose must be a bool or a Diagnoser, got {value!r}")
    return kind() if value else None


# The precisions a run can be told to have: the plain-loop names, then Lightning's (``Trainer(precision=)``),
# each with what it is (the plain name) and whether it is Lightning's, for the advice's wording.
PRECISIONS = {
    "fp64": ("fp64", False),
    "fp32": ("fp32", False),
    "bf16": ("bf16", False),
    "fp16": ("fp16", False),
    "bf16-mixed": ("bf16-mixed", False),
    "fp16-mixed": ("fp16-mixed", False),
    "64-true": ("fp64", True),
    "32-true": ("fp32", True),
    "bf16-true": ("bf16", True),
    "16-true": ("fp16", True),
    "16-mixed": ("fp16-mixed", True),
}


def precision(value: Any, owner: str) -> str | None:
    """A run's precision: one of :data:`PRECISIONS` (case ignored; Lightning's ``32``, ``16``, ``64``
    and ``"32"``-style names are read as ``32-true``, ``16-mixed``, ``64-true``), or None (not known)."""
    if value is None:
        return None
    aliases = {"32": "32-true", "16": "16-mixed", "64": "64-true"}
    text = str(value).lower() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    text = aliases.get(text, text)
    if text not in PRECISIONS:
        raise ValueError(f"{owner}: precision must be one of {', '.join(PRECISIONS)} or None, got {value!r}")
    return text


def optimizer(value: Any, owner: str) -> Any:
    """An optimizer (anything with a list of ``param_groups`` dicts, as torch's), or None."""
    if value is None:
        return None
    groups = getattr(value, "param_groups", None)
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise TypeError(
            f"{owner}: optimizer must be a torch.optim.Optimizer (with param_groups), got {value!r}"
        )
    return value
