"""The locator's device buffer: every watched tensor's statistics, the first offender, no host read.

One float64 tensor of three rows, allocated on the watched tensors' device
(and grown there, as a step's events outnumber its room):

* row 0, the step in progress: cells 0 and 1 hold its first non-finite and its
  first overflowing event as ``-order`` (``-inf``: none), cell 2 the step; then
  six cells per event, the statistics of ``COLUMNS``, in execution order;
* row 1, the window's first step with a non-finite value: a copy of row 0 taken
  when that step closed; row 2 the same for the first overflow.

Each event (one module call's outputs, one gradient) is one reduction of its
tensors into a ``(k, 6)`` block, held (six numbers a tensor, never the tensor)
until the step is settled, when the blocks are copied into row 0 at once.
``order`` is the event's place in the step, counted on the host.
The first offenders are found once per step, when it closes (or is read), as
a maximum of ``-order`` over the events that hold a non-finite value (or an
overflow): the same whatever order the device ran the writes in, and
deterministic. The events' sites (module, role) stay on the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fastnorm import stats as engine

FIRST_NONFINITE, FIRST_OVERFLOW, STEP = 0, 1, 2
HEAD = 3  # the cells before the first event's
WIDTH = len(engine.COLUMNS)
# NONFINITE and OVERFLOW among the columns, as one strided slice.
_FLAGS = slice(engine.NONFINITE, engine.OVERFLOW + 1, engine.OVERFLOW - engine.NONFINITE)
CURRENT, KEPT_NONFINITE, KEPT_OVERFLOW = 0, 1, 2


class DeviceBuffer:
    """The three rows and the order keys, on one device."""

    def __init__(self, device: torch.device, events: int) -> None:
        self.device = device
        self.capacity = 0
        self.rows = torch.empty(3, 0, dtype=torch.float64, device=device)
        self.neg_orders = torch.empty(0, dtype=torch.float64, device=device)
        self.blank = torch.tensor([float("-inf"), float("-inf"), -1.0], dtype=torch.float64, device=device)
        self.pending: list[Tensor] = []  # the blocks not yet in row 0, in order
        self.written = 0  # the events in row 0
        self.grow(max(events, 16))

    def grow(self, events: int) -> None:
        """Room for ``events`` events per step; what is held is copied, on the device."""
        if events <= self.capacity:
            return
        capacity = max(events, 2 * self.capacity)
        rows = torch.zeros(3, HEAD + WIDTH * capacity, dtype=torch.float64, device=self.device)
        if self.capacity:
            rows[:, : self.rows.shape[1]] = self.rows
        else:
            rows[:, :HEAD] = self.blank
        self.rows, self.capacity = rows, capacity
        self.neg_orders = -torch.arange(capacity, dtype=torch.float64, device=self.device)

    def record(self, tensors: Sequence[Tensor], limits: Sequence[torch.dtype]) -> None:
        """Reduces ``tensors``, the step's next events, into a block of their statistics."""
        self.pending.append(engine.reduce_stats(tensors, limits))

    def settle(self, events: int) -> None:
        """Writes the pending blocks into row 0 and finds the first offenders among its first ``events``
        events (a few device operations)."""
        if self.pending:
            block = torch.cat(self.pending) if len(self.pending) > 1 else self.pending[0]
            self.pending = []
            start, self.written = self.written, self.written + block.shape[0]
            self.grow(self.written)
            self.rows[CURRENT, HEAD + WIDTH * start : HEAD + WIDTH * self.written] = block.reshape(-1)
        if events == 0:
            self.rows[CURRENT, :STEP] = float("-inf")
            return
        block = self.rows[CURRENT, HEAD : HEAD + WIDTH * events].view(events, WIDTH)
        keys = torch.where(block[:, _FLAGS] > 0, self.neg_orders[:events].unsqueeze(1), float("-inf"))
        self.rows[CURRENT, :STEP] = keys.amax(0)

    def close_step(self, step: int, events: int) -> None:
        """Ends the step in progress: the window keeps it where it is the first with a finding."""
        self.settle(events)
        rows = self.rows
        rows[CURRENT, STEP] = float(step)
        kept = torch.stack([rows[KEPT_NONFINITE, FIRST_NONFINITE], rows[KEPT_OVERFLOW, FIRST_OVERFLOW]])
        take = (kept == float("-inf")) & (rows[CURRENT, :STEP] > float("-inf"))
        rows[1:] = torch.where(take.unsqueeze(1), rows[CURRENT].expand(2, -1), rows[1:])
        rows[CURRENT, :HEAD] = self.blank
        self.written = 0

    def reset_window(self) -> None:
        """Forgets the window's kept steps (after they were read)."""
        self.rows[1:, :HEAD] = self.blank

    def read(self) -> list[list[float]]:
        """The three rows on the host: the one read of the device."""
        return self.rows.tolist()
