"""Draws a run: GB/s per workload and contender against the roofline, and the training steps.

Works from the JSON alone, so an older run (or one cut short by Ctrl-C) can be
redrawn::

    python -m fastnorm.bench.plot bench-results/cpu.json [out.png]

The upper panel: GB/s over the least bytes each kind must move (one read for
the norm and a clip that does not clip, three passes' worth for a clip that
clips), so a bar at the roofline line means "as fast as a plain read of the
same bytes". The lower panel (the ``step-*`` workloads): each step's time over
the bare fused AdamW step's in the same rounds, against the target.

Every contender has its own colour and hatch, the same in both panels. A
disturbed figure (too few quiet rounds, or faster than the roofline) is not a
result: it is drawn hollow and cross-hatched in its contender's colour, never as
a plain bar.
Each bar's ``gid`` is ``"<workload> <dtype> <contender>"``, followed by
``" disturbed"`` where it is one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastnorm.bench.harness import disturbed
from fastnorm.bench.report import fmt_bytes, is_step

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Colours by group, distinct within and across groups; a group with more
# contenders than colours adds a hatch.
COLORS = {
    "fastnorm": (
        "#1b5e20", "#66bb6a", "#00838f", "#c0ca33", "#1565c0",
        "#4dd0e1", "#827717", "#00bfa5", "#283593", "#90caf9",
    ),
    "torch": ("#b71c1c", "#ef6c00", "#f48fb1", "#fbc02d", "#6d4c41", "#ff8a65"),
    "other": ("#6a1b9a", "#ba68c8", "#5c6bc0"),
}  # fmt: skip
HATCHES = ("", "//", "..", "\\\\")
DISTURBED_HATCH = "xxx"
DISTURBED_COLOR = "#616161"
BARE_STEP = "adamw.step"


def styles(names: list[str], groups: dict[str, str]) -> dict[str, tuple[str, str]]:
    """(colour, hatch) of each contender, distinct for all of them: the i-th of a
    group takes the group's i-th colour, with a hatch once its colours are used."""
    used: dict[str, int] = {}
    out = {}
    for name in names:
        palette = COLORS.get(groups[name], COLORS["other"])
        i = used.get(groups[name], 0)
        used[groups[name]] = i + 1
        out[name] = (palette[i % len(palette)], HATCHES[(i // len(palette)) % len(HATCHES)])
    return out


def _label(record: dict[str, Any]) -> str:
    """The tick label: the workload, its dtype and the size it ran at."""
    tensors = f"{record['tensors']} tensor{'s' * (record['tensors'] != 1)}"
    return f"{record['workload']}\n{record['dtype']}\n{tensors}\n{fmt_bytes(record['bytes'])}"


def _bars(ax: Any, x: int, record: dict[str, Any], values: dict[str, float], style: dict[str, Any]) -> None:
    """One workload's bars, in the order of ``style``: each contender in its colour
    and hatch; a disturbed figure hollow and cross-hatched in its colour."""
    names = [name for name in style if name in values]
    results = {r["contender"]: r for r in record["results"]}
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        color, hatch = style[name]
        where, gid = x - 0.4 + (i + 0.5) * width, f"{record['workload']} {record['dtype']} {name}"
        if disturbed(record, results[name]):
            (bar,) = ax.bar(
                where, values[name], width, facecolor="none", edgecolor=color, hatch=DISTURBED_HATCH
            )
            bar.set_linestyle("--")
            gid += " disturbed"
        else:
            (bar,) = ax.bar(
                where, values[name], width, color=color, hatch=hatch, edgecolor="white" if hatch else color
            )
        bar.set_gid(gid)


def _contenders(records: list[dict[str, Any]]) -> tuple[list[str], dict[str, str]]:
    """The contenders drawn (not the references, not the bare step: a line), in order of appearance."""
    names: list[str] = []
    groups: dict[str, str] = {}
    for rec in records:
        for r in rec["results"]:
            name = r["contender"]
            if r["group"] != "reference" and name != BARE_STEP and name not in groups:
                names.append(name)
                groups[name] = r["group"]
    return names, groups


def figure(run: dict[str, Any]) -> Figure:
    """The run's figure (needs matplotlib): the norm workloads above, the training steps below."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from fastnorm.bench.goals import FOLDED_OVER_STEP

    norms = [rec for rec in run["workloads"] if not is_step(rec)]
    steps = [rec for rec in run["workloads"] if is_step(rec)]
    names, groups = _contenders(run["workloads"])
    style = styles(names, groups)
    panels = [p for p in (norms, steps) if p]
    width = max(8.0, 1.1 * max(len(norms), len(steps), 1) + 4)
    fig = Figure(figsize=(width, 4.5 * len(panels) + 0.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=[3, 2][: len(panels)])[:, 0]
    lines: dict[str, Any] = {}  # the legend's lines, by label
    if norms:
        ax = axes[0]
        for x, rec in enumerate(norms):
            _bars(ax, x, rec, {r["contender"]: r["gbps"] for r in rec["results"]}, style)
            read, rw = rec["roofline"]["read"], rec["roofline"]["read_write"]
            faint = 0.35 if disturbed(rec) else 1.0  # measured in disturbed rounds too
            if read:
                ax.hlines(
                    read["gbps"], x - 0.45, x + 0.45, colors="black", linestyles="--", lw=2, alpha=faint
                )
                lines["read roofline (fastest plain read)"] = Line2D([], [], color="black", ls="--", lw=2)
            if read and rw:
                clip_gbps = 3 * rec["bytes"] / (read["ms"] + rw["ms"]) / 1e6
                ax.hlines(clip_gbps, x - 0.45, x + 0.45, colors="dimgray", linestyles=":", lw=2, alpha=faint)
                lines["clip roofline (read + read-write)"] = Line2D([], [], color="dimgray", ls=":", lw=2)
        ax.set_xticks(range(len(norms)), [_label(r) for r in norms], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("GB/s (least bytes moved / median time)")
        ax.grid(axis="y", which="both", alpha=0.3)
    if steps:
        ax = axes[-1]
        for x, rec in enumerate(steps):
            ratios = {r["contender"]: r["paired_ratio"] for r in rec["results"] if r.get("paired_ratio")}
            _bars(ax, x, rec, ratios, style)
        ax.axhline(1.0, color="black", lw=1.5)
        ax.axhline(FOLDED_OVER_STEP, color="dimgray", ls="--", lw=1)
        lines["bare fused AdamW step"] = Line2D([], [], color="black", lw=1.5)
        lines[f"target of the folded steps ({FOLDED_OVER_STEP:g}x)"] = Line2D(
            [], [], color="dimgray", ls="--"
        )
        ax.set_xticks(range(len(steps)), [_label(r) for r in steps], fontsize=8)
        ax.set_xlim(-0.6, max(len(steps), len(norms), 4) - 0.4)  # bars as wide as the norms'
        ax.set_ylabel("x the bare step (paired, median)")
        ax.grid(axis="y", alpha=0.3)
    env = run["environment"]
    title = (
        f"fastnorm {env['fastnorm']} vs torch {env['torch']} on {env['device_name']} "
        f"({env['device']}, {env['threads']} threads)"
    )
    if any(rec["quick"] for rec in run["workloads"]):
        title += "\n--quick: small shapes, not the models' sizes (each workload's size is under its name)"
    fig.suptitle(title, fontsize=10)
    legend = {
        name: Patch(facecolor=color, hatch=hatch, edgecolor="white" if hatch else color)
        for name, (color, hatch) in style.items()
    }
    if any(disturbed(rec, r) for rec in run["workloads"] for r in rec["results"]):
        marked = Patch(facecolor="none", edgecolor=DISTURBED_COLOR, hatch=DISTURBED_HATCH, linestyle="--")
        legend["hollow, cross-hatched: disturbed, not a result"] = marked
    legend.update(lines)
    fig.legend(list(legend.values()), list(legend), fontsize=7, loc="outside right center")
    return fig


def draw(run: dict[str, Any], path: Path) -> Path:
    """Writes the PNG of ``run`` and returns its path. Needs matplotlib."""
    figure(run).savefig(path, dpi=90)
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m fastnorm.bench.plot RUN.json [OUT.png]", file=sys.stderr)
        return 2
    source = Path(args[0])
    out = Path(args[1]) if len(args) > 1 else source.with_suffix(".png")
    print(draw(json.loads(source.read_text()), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
