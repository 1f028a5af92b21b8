"""Draws a run: grouped bars of GB/s per workload and contender, roofline drawn.

Works from the JSON alone, so an older run can be redrawn::

    python -m fastnorm.bench.plot bench-results/cpu.json [out.png]

GB/s is over the least bytes each kind must move (one read for the norm and a
clip that does not clip, three passes' worth for a clip that clips), so a bar
at the roofline line means "as fast as a plain read of the same bytes". The
training-step workloads, measured against the bare step rather than the
roofline, are in the tables only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fastnorm.bench.report import is_step

COLORS = {
    "fastnorm": ("#1b5e20", "#43a047", "#a5d6a7"),
    "torch": ("#b71c1c", "#e53935", "#ef9a9a", "#ffcdd2"),
}
OTHER = ("#1565c0", "#64b5f6", "#90a4ae")


def _colors(names: list[str], groups: dict[str, str]) -> dict[str, str]:
    used: dict[str, int] = {}
    out = {}
    for name in names:
        palette = COLORS.get(groups[name], OTHER)
        i = used.get(groups[name], 0)
        used[groups[name]] = i + 1
        out[name] = palette[i % len(palette)]
    return out


def draw(run: dict[str, Any], path: Path) -> Path:
    """Writes the PNG and returns its path. Needs matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = [rec for rec in run["workloads"] if not is_step(rec)]
    names: list[str] = []
    groups: dict[str, str] = {}
    for rec in records:
        for r in rec["results"]:
            if r["group"] != "reference" and r["contender"] not in groups:
                names.append(r["contender"])
                groups[r["contender"]] = r["group"]
    colors = _colors(names, groups)
    width = 0.8 / max(1, len(names))

    fig = Figure(figsize=(max(8.0, 1.3 * len(records) + 3), 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labeled: set[str] = set()

    def once(label: str) -> str | None:
        """The legend entry the first time, nothing after."""
        if label in labeled:
            return None
        labeled.add(label)
        return label

    def roof(x: int, gbps: float, color: str, style: str, label: str) -> None:
        ax.hlines(gbps, x - 0.45, x + 0.45, colors=color, linestyles=style, linewidth=2, label=once(label))

    for x, rec in enumerate(records):
        results = {r["contender"]: r for r in rec["results"]}
        for i, name in enumerate(names):
            r = results.get(name)
            if r is not None:
                ax.bar(x - 0.4 + (i + 0.5) * width, r["gbps"], width, color=colors[name], label=once(name))
        read, rw = rec["roofline"]["read"], rec["roofline"]["read_write"]
        if read:
            roof(x, read["gbps"], "black", "--", "read roofline (fastest plain read)")
        if read and rw:
            clip_gbps = 3 * rec["bytes"] / (read["ms"] + rw["ms"]) / 1e6
            roof(x, clip_gbps, "dimgray", ":", "clip roofline (read + read-write)")
    ax.set_xticks(range(len(records)), [f"{r['workload']}\n{r['dtype']}" for r in records])
    ax.set_yscale("log")
    ax.set_ylabel("GB/s (least bytes moved / median time)")
    env = run["environment"]
    ax.set_title(
        f"fastnorm {env['fastnorm']} vs torch {env['torch']} on {env['device_name']} "
        f"({env['device']}, {env['threads']} threads)",
        fontsize=10,
    )
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=90)
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
