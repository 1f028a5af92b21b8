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
result: it is drawn hollow, cross-hatched in grey, and never as a plain bar.
Each bar's ``gid`` is ``"<workload> <dtype> <contender>"``, followed by
``" disturbed"`` where it is one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastnorm.bench.report import disturbed, fmt_bytes, is_step

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Colours by group; a group with more contenders than colours adds a hatch.
COLORS = {
    "fastnorm": ("#1b5e20", "#66bb6a", "#00838f", "#c0ca33", "#1565c0", "#4dd0e1"),
    "torch": ("#b71c1c", "#ef6c00", "#f48fb1", "#fbc02d", "#6d4c41"),
    "other": ("#6a1b9a", "#5c6bc0", "#ba68c8"),
}
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
    return (
        f"{record['workload']}\n{record['dtype']}\n{record['tensors']} tensors, {fmt_bytes(record['bytes'])}"
    )


class _Bars:
    """Draws grouped bars on one axis, each contender in its style, disturbed ones marked."""

    def __init__(
        self, ax: Any, names: list[str], style: dict[str, tuple[str, str]], labeled: set[str]
    ) -> None:
        self.ax, self.names, self.style, self.labeled = ax, names, style, labeled
        self.width = 0.8 / max(1, len(names))

    def once(self, label: str) -> str | None:
        """The legend entry the first time, nothing after."""
        if label in self.labeled:
            return None
        self.labeled.add(label)
        return label

    def draw(self, x: int, record: dict[str, Any], values: dict[str, float]) -> None:
        results = {r["contender"]: r for r in record["results"]}
        for i, name in enumerate(self.names):
            if name not in values:
                continue
            color, hatch = self.style[name]
            where = x - 0.4 + (i + 0.5) * self.width
            gid = f"{record['workload']} {record['dtype']} {name}"
            if disturbed(record, results[name]):
                (bar,) = self.ax.bar(
                    where,
                    values[name],
                    self.width,
                    facecolor="none",
                    edgecolor=DISTURBED_COLOR,
                    hatch=DISTURBED_HATCH,
                    linestyle="--",
                    label=self.once("disturbed: not a result"),
                )
                bar.set_gid(gid + " disturbed")
            else:
                (bar,) = self.ax.bar(
                    where,
                    values[name],
                    self.width,
                    color=color,
                    hatch=hatch,
                    edgecolor="white" if hatch else color,
                    label=self.once(name),
                )
                bar.set_gid(gid)


def _contenders(
    records: list[dict[str, Any]], skip: tuple[str, ...] = ()
) -> tuple[list[str], dict[str, str]]:
    names: list[str] = []
    groups: dict[str, str] = {}
    for rec in records:
        for r in rec["results"]:
            if r["group"] != "reference" and r["contender"] not in groups and r["contender"] not in skip:
                names.append(r["contender"])
                groups[r["contender"]] = r["group"]
    return names, groups


def figure(run: dict[str, Any]) -> Figure:
    """The run's figure (needs matplotlib): the norm workloads above, the training steps below."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    norms = [rec for rec in run["workloads"] if not is_step(rec)]
    steps = [rec for rec in run["workloads"] if is_step(rec)]
    names, groups = _contenders(run["workloads"], skip=(BARE_STEP,))
    style = styles(names, groups)
    panels = [p for p in (norms, steps) if p]
    width = max(8.0, 1.1 * max(len(norms), len(steps), 1) + 4)
    fig = Figure(figsize=(width, 4.5 * len(panels) + 0.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=[3, 2][: len(panels)])[:, 0]
    labeled: set[str] = set()
    if norms:
        ax = axes[0]
        norm_names = [n for n in names if any(n == r["contender"] for rec in norms for r in rec["results"])]
        bars = _Bars(ax, norm_names, style, labeled)
        for x, rec in enumerate(norms):
            bars.draw(x, rec, {r["contender"]: r["gbps"] for r in rec["results"]})
            read, rw = rec["roofline"]["read"], rec["roofline"]["read_write"]
            if read:
                label = bars.once("read roofline (fastest plain read)")
                ax.hlines(
                    read["gbps"], x - 0.45, x + 0.45, colors="black", linestyles="--", lw=2, label=label
                )
            if read and rw:
                clip_gbps = 3 * rec["bytes"] / (read["ms"] + rw["ms"]) / 1e6
                label = bars.once("clip roofline (read + read-write)")
                ax.hlines(clip_gbps, x - 0.45, x + 0.45, colors="dimgray", linestyles=":", lw=2, label=label)
        ax.set_xticks(range(len(norms)), [_label(r) for r in norms], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("GB/s (least bytes moved / median time)")
        ax.grid(axis="y", which="both", alpha=0.3)
    if steps:
        from fastnorm.bench.goals import FOLDED_OVER_STEP

        ax = axes[-1]
        step_names = [n for n in names if any(n == r["contender"] for rec in steps for r in rec["results"])]
        bars = _Bars(ax, step_names, style, labeled)
        for x, rec in enumerate(steps):
            ratios = {r["contender"]: r["paired_ratio"] for r in rec["results"] if r.get("paired_ratio")}
            bars.draw(x, rec, ratios)
        ax.axhline(1.0, color="black", linewidth=1.5, label=bars.once("bare fused AdamW step"))
        ax.axhline(
            FOLDED_OVER_STEP,
            color="dimgray",
            linestyle="--",
            linewidth=1,
            label=bars.once(f"target of the folded steps ({FOLDED_OVER_STEP:g}x)"),
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
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    fig.legend(handles, labels, fontsize=7, loc="outside right upper")
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
