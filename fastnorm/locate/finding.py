"""What the locator found, on the host: plain numbers and names, the sentence, the logged keys.

Nothing here imports torch. A :class:`Site` is one watched place: a pass, a
module, a tensor role (``input`` of the model, ``output``, ``grad_output``:
the gradient entering the module's output, ``grad``: a parameter's gradient),
the tensor's dtype and the dtype whose range judges it (the autocast target
when it is narrower). A :class:`Finding` is the first site of a step, in
execution order, whose tensor held a non-finite value (or, for the
``overflow`` kind, a finite value beyond the overflow margin), with the frames
around it.

The logged keys (under the monitor's ``gradient_norm_`` prefix) are read back
by ``fastnorm diagnose``::

    locate_nonfinite/<pass>:<module>:<role>:<dtype>:<limit>                = the step
    locate_nonfinite_frames/<offset>/<pass>:<module>:<role>:<dtype>:<limit> = its max |x|

(``locate_overflow`` alike); ``<module>`` is ``-`` for the model itself,
``<offset>`` runs from ``-frames`` to ``+frames`` (0: the finding itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORWARD, BACKWARD = "forward", "backward"
NONFINITE, OVERFLOW = "nonfinite", "overflow"
KINDS = (NONFINITE, OVERFLOW)
PREFIX = "locate_"
ROOT = "-"  # the model itself, in a key
# The largest finite value of each dtype the locator judges by: a sentence names the limit it crossed.
LARGEST = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}
LARGEST["float64"] = 1.7976931348623157e308


@dataclass(frozen=True)
class Site:
    """One watched place: a pass, a module (its qualified name, ``""`` for the model), a tensor role.

    ``role`` is ``input``, ``output``, ``grad_output`` or ``grad``; ``index`` the
    tensor's place among the module's outputs (0 for a single tensor) or, for
    ``grad``, the parameter's own name (``weight``).
    """

    pass_: str
    module: str
    role: str
    index: int | str
    dtype: str
    limit: str

    def role_text(self) -> str:
        """The role in words: ``"gradient of its output"``, ``"its output 1"``."""
        if self.role == "grad":
            return f"gradient of its parameter `{self.index}`"
        n = f" {self.index}" if self.index else ""
        return {"input": f"its input{n}", "output": f"its output{n}"}.get(
            self.role, f"gradient of its output{n}"
        )

    def where(self) -> str:
        """``"backward, `blocks.3.mlp.fc2`, gradient of its output"``."""
        module = f"`{self.module}`" if self.module else "the model"
        return f"{self.pass_}, {module}, {self.role_text()}"

    def key(self) -> str:
        """The site as one segment of a logged key (see the module's description)."""
        role = self.role if self.index in (0, "") else f"{self.role}.{self.index}"
        return f"{self.pass_}:{self.module or ROOT}:{role}:{self.dtype}:{self.limit}"

    @staticmethod
    def from_key(key: str) -> Site:
        """The site a key segment names; ``ValueError`` when it names none."""
        pass_, module, role, dtype, limit = key.split(":")
        role, _, index = role.partition(".")
        if pass_ not in (FORWARD, BACKWARD) or role not in ("input", "output", "grad_output", "grad"):
            raise ValueError(f"not a located site: {key!r}")
        return Site(
            pass_,
            "" if module == ROOT else module,
            role,
            index if role == "grad" else int(index or 0),
            dtype,
            limit,
        )


@dataclass(frozen=True)
class Frame:
    """A site next to a finding, in execution order, and what its tensor held that step."""

    offset: int  # -1: the site just before the finding, 0: the finding, +1: just after
    site: Site
    max_abs: float  # the largest finite |x|
    nonfinite: float
    overflow: float
    subnormal: float

    def text(self) -> str:
        state = f"{self.nonfinite:.0f} non-finite" if self.nonfinite else "finite"
        return f"{self.offset:+d} {self.site.where()}, {self.site.dtype}: {state}, max |x| {self.max_abs:.3g}"


@dataclass(frozen=True)
class Finding:
    """The first site of a step, in execution order, that went non-finite (or overflowed).

    Attributes:
        kind (str): ``"nonfinite"`` or ``"overflow"`` (a finite value beyond the
            overflow margin of the limit dtype: its largest value / 16).
        site (Site): where.
        step (int): the step it happened at.
        frames (tuple of Frame): the sites before and after it (and itself, offset 0).
    """

    kind: str
    site: Site
    step: int
    frames: tuple[Frame, ...] = field(default_factory=tuple)

    @property
    def frame(self) -> Frame | None:
        """The finding's own frame (offset 0)."""
        return next((f for f in self.frames if f.offset == 0), None)

    def headline(self) -> str:
        """The one sentence: ``"first non-finite: backward, `fc2`, gradient of its output, float16, step 12;
        finite on its way in: ..."``."""
        what = "first non-finite" if self.kind == NONFINITE else "first overflow"
        text = f"{what}: {self.site.where()}, {self.site.dtype}, step {self.step}"
        own = self.frame
        if own is not None and self.kind == OVERFLOW:
            text += f" ({own.overflow:.0f} values beyond the margin, max |x| {own.max_abs:.3g})"
        elif own is not None:
            text += f" ({own.nonfinite:.0f} values)"
        before = next((f for f in self.frames if f.offset == -1), None)
        if before is not None:
            limit = before.site.limit
            text += (
                f"; finite on its way in ({before.site.where()}), max |x| {before.max_abs:.3g}"
                f" ({limit} overflows at {LARGEST.get(limit, float('nan')):.6g})"
            )
        return text

    def report(self) -> str:
        """The headline and the frames around it, one a line."""
        return "\n".join([self.headline(), *(f"    {f.text()}" for f in self.frames)])

    def metrics(self) -> dict[str, float]:
        """The finding as logged keys (see the module's description): the step, and each frame's max |x|."""
        found = {f"{PREFIX}{self.kind}/{self.site.key()}": float(self.step)}
        for f in self.frames:
            found[f"{PREFIX}{self.kind}_frames/{f.offset}/{f.site.key()}"] = f.max_abs
        return found


@dataclass(frozen=True)
class Located:
    """What one read of the locator found: the first non-finite and the first overflow, each or None."""

    nonfinite: Finding | None = None
    overflow: Finding | None = None

    def __bool__(self) -> bool:
        return self.nonfinite is not None or self.overflow is not None

    def report(self) -> str:
        """Each finding with its frames; a line saying there is none otherwise."""
        found = [f.report() for f in (self.nonfinite, self.overflow) if f is not None]
        return "\n".join(found) if found else "nothing non-finite and no overflow in the steps watched"

    def metrics(self) -> dict[str, float]:
        """Both findings as logged keys."""
        out: dict[str, float] = {}
        for f in (self.nonfinite, self.overflow):
            if f is not None:
                out.update(f.metrics())
        return out
