"""The locator's device buffer: every watched tensor's statistics, the first offender, no host read.

One float64 tensor of three rows, allocated once on the watched tensors' device
(and grown, on the device, when new sites appear):

* row 0, the step in progress: cells 0 and 1 hold the first non-finite and the
  first overflowing event of the step as ``-order`` (``-inf``: none yet), cell
  2 the step; then six cells per site, the statistics of ``COLUMNS``, each the
  largest over the site's events of the step;
* row 1, the window's first step with a non-finite value: a copy of row 0 taken
  when that step closed; row 2 the same for the first overflow.

Each event (one module call's outputs, one gradient) is one reduction of its
tensors into a ``(k, 6)`` block and one ``scatter_reduce_(amax)`` of that block
and of its events' keys into row 0. ``order`` is the event's place in the step,
counted on the host; the first offender is then a maximum of ``-order``: the
same whatever order the device runs the writes in, and deterministic. Every
cell is a maximum, so reducing the same tensor twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fastnorm import stats as engine

FIRST_NONFINITE, FIRST_OVERFLOW, STEP = 0, 1, 2
HEAD = 3  # the cells before the first site's
WIDTH = len(engine.COLUMNS)
# Where NONFINITE and OVERFLOW sit among the columns, as one strided slice.
_FLAGS = slice(engine.NONFINITE, engine.OVERFLOW + 1, engine.OVERFLOW - engine.NONFINITE)
CURRENT, KEPT_NONFINITE, KEPT_OVERFLOW = 0, 1, 2


class DeviceBuffer:
    """The three rows, the order keys and the scatter indices of each event's sites."""

    def __init__(self, device: torch.device, sites: int) -> None:
        self.device = device
        self.capacity = 0
        self.rows = torch.empty(3, 0, dtype=torch.float64, device=device)
        self.neg_orders = torch.empty(0, dtype=torch.float64, device=device)
        self.indices: dict[tuple[int, ...], Tensor] = {}
        self.blank = self.rows[0]
        self.grow(max(sites, 1), orders=256)

    def _blank(self, length: int) -> Tensor:
        """A row with no event recorded: no first offender, every statistic 0."""
        row = torch.zeros(length, dtype=torch.float64, device=self.device)
        row[FIRST_NONFINITE] = row[FIRST_OVERFLOW] = float("-inf")
        row[STEP] = -1.0
        return row

    def grow(self, sites: int, orders: int = 0) -> None:
        """Room for ``sites`` sites and ``orders`` events per step; copies what is held, on the device."""
        if sites > self.capacity:
            capacity = max(sites, 2 * self.capacity)
            self.blank = self._blank(HEAD + WIDTH * capacity)
            rows = self.blank.repeat(3, 1)
            if self.capacity:
                rows[:, : self.rows.shape[1]] = self.rows
            self.rows, self.capacity = rows, capacity
        if orders > self.neg_orders.numel():
            size = max(orders, 2 * self.neg_orders.numel())
            self.neg_orders = -torch.arange(size, dtype=torch.float64, device=self.device)

    def index(self, sites: tuple[int, ...]) -> Tensor:
        """Where an event's keys and statistics go in row 0: per tensor its two first-offender cells,
        then its sites' six cells each."""
        found = self.indices.get(sites)
        if found is None:
            firsts = [c for _ in sites for c in (FIRST_NONFINITE, FIRST_OVERFLOW)]
            cells = [HEAD + WIDTH * s + c for s in sites for c in range(WIDTH)]
            found = self.indices[sites] = torch.tensor(firsts + cells, dtype=torch.int64, device=self.device)
        return found

    def record(
        self, tensors: Sequence[Tensor], sites: tuple[int, ...], limits: Sequence[torch.dtype], order: int
    ) -> None:
        """Reduces ``tensors`` (the events ``order``, ``order + 1``, ...) into their sites' cells."""
        k = len(tensors)
        self.grow(max(sites) + 1, order + k)
        stats = engine.reduce_stats(tensors, limits)
        if stats.device != self.device:
            stats = stats.to(self.device, non_blocking=True)
        keys = self.neg_orders[order : order + k].unsqueeze(1)
        firsts = torch.where(stats[:, _FLAGS] > 0, keys, float("-inf"))
        src = torch.cat([firsts.reshape(-1), stats.reshape(-1)])
        self.rows[CURRENT].scatter_reduce_(0, self.index(sites), src, "amax")

    def close_step(self, step: int) -> None:
        """Ends the step in progress: the window keeps it where it is the first with a finding, then
        row 0 starts over. A few device operations on the buffer; nothing read."""
        rows = self.rows
        rows[CURRENT, STEP] = float(step)
        kept = torch.stack([rows[KEPT_NONFINITE, FIRST_NONFINITE], rows[KEPT_OVERFLOW, FIRST_OVERFLOW]])
        take = (kept == float("-inf")) & (rows[CURRENT, :STEP] > float("-inf"))
        rows[1:] = torch.where(take.unsqueeze(1), rows[CURRENT].expand(2, -1), rows[1:])
        rows[CURRENT] = self.blank

    def reset_window(self) -> None:
        """Forgets the window's kept steps (after they were read)."""
        self.rows[1:] = self.blank

    def read(self) -> list[list[float]]:
        """The three rows on the host: the one read of the device."""
        return self.rows.tolist()
