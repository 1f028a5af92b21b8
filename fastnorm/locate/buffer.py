"""The locator's device buffer: every watched tensor's statistics, the first offender, no host read.

One float64 tensor of three rows, allocated on the watched tensors' device
(and grown there, as a step's events outnumber its room):

* row 0, the step in progress: cells 0 and 1 hold its first non-finite and its
  first overflowing event as ``-order`` (``-inf``: none), cell 2 the step; then
  six cells per event, the statistics of ``COLUMNS``, in execution order;
* row 1, the window's first step with a non-finite value: a copy of row 0 taken
  when that step closed; row 2 the same for the first overflow.

Each event (one module call's outputs, one gradient) is one reduction of its
tensors into its six cells a tensor (never the tensor). On the CPU, where the
C++ backend serves the tensors (dense, of a float dtype), the C++ kernel
writes each tensor's counts and maximum straight into row 0, with no plan
(``_C.count_stats``, one call a tensor, its sum of squares left
NaN: nobody reads it; a tensor under a megabyte, or on one thread, in one
piece): a pass's activations are read once, and a plan built and cached for
each cost more than the read (about 30 us a call). Elsewhere
(CUDA, tensors with gaps, ``FASTNORM_BACKEND=torch``) it is
``fastnorm.stats.reduce_stats``, the same columns, whose ``(k, 6)`` block is
held until the step is settled, when the blocks are copied into row 0.
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

from fastnorm import backends
from fastnorm import stats as engine
from fastnorm._collect import is_dense
from fastnorm._partial import Mode
from fastnorm.backends import cpp

FIRST_NONFINITE, FIRST_OVERFLOW, STEP = 0, 1, 2
HEAD = 3  # the cells before the first event's
WIDTH = len(engine.COLUMNS)
# NONFINITE and OVERFLOW among the columns, as one strided slice.
_FLAGS = slice(engine.NONFINITE, engine.OVERFLOW + 1, engine.OVERFLOW - engine.NONFINITE)
CURRENT, KEPT_NONFINITE, KEPT_OVERFLOW = 0, 1, 2
_STRIDE = 8 * WIDTH  # bytes from one event's cells to the next's
_CODES = cpp.DTYPE_CODES


class DeviceBuffer:
    """The three rows and the order keys, on one device."""

    def __init__(self, device: torch.device, events: int) -> None:
        self.device = device
        self.capacity = 0
        self.rows = torch.empty(3, 0, dtype=torch.float64, device=device)
        self.neg_orders = torch.empty(0, dtype=torch.float64, device=device)
        self.blank = torch.tensor([float("-inf"), float("-inf"), -1.0], dtype=torch.float64, device=device)
        self.pending: list[tuple[int, Tensor]] = []  # (first event, block) not yet in row 0
        self.written = 0  # the events recorded in the step in progress
        self.direct = False  # whether the C++ kernel writes the statistics into row 0 (choose())
        self.kernel: tuple = ()  # _C.count_stats and its fixed arguments, for this step's thread count
        self.grow(max(events, 16))
        self.choose()

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
        self.cells = rows.data_ptr() + 8 * HEAD  # the first event's cells, in row 0 (direct writes)
        self.neg_orders = -torch.arange(capacity, dtype=torch.float64, device=self.device)

    def choose(self) -> None:
        """Whether the C++ kernel serves this device's dense tensors, under FASTNORM_BACKEND as it is now
        (read at the start of each step, not at each event)."""
        request = backends.requested()
        try:
            self.direct = (
                self.device.type == "cpu"
                and request in ("auto", "cpp")
                and backends.choose(self.device, request, Mode.L2, dense=True).backend.name == "cpp"
            )
        except backends.BackendUnavailableError:
            self.direct = False  # reduce_stats says why, at the first event
        if self.direct:
            self.kernel = cpp.count_stats_args(torch.get_num_threads())

    def record_one(self, t: Tensor, limit: torch.dtype) -> None:
        """Reduces one tensor, the step's next event, into its statistics: :meth:`record` of ``[t]``,
        with less host time (most events are one tensor)."""
        start = self.written
        self.written = start + 1
        code = _CODES.get(t.dtype)
        if self.direct and code is not None and (t.is_contiguous() or is_dense(t)):
            if start >= self.capacity:
                self.grow(start + 1)
            count, threads, task, table = self.kernel
            cell = self.cells + _STRIDE * start
            count(t.data_ptr(), t.numel(), code, _CODES[limit], task, table, cell, threads)
        else:
            self.pending.append((start, engine.reduce_stats([t], [limit])))

    def record(self, tensors: Sequence[Tensor], limits: Sequence[torch.dtype]) -> None:
        """Reduces ``tensors``, the step's next events, into their statistics (a few microseconds of
        host time an event: a pass holds hundreds)."""
        start = self.written
        self.written = end = start + len(tensors)
        codes = cpp.DTYPE_CODES
        if self.direct and all(t.dtype in codes and (t.is_contiguous() or is_dense(t)) for t in tensors):
            if end > self.capacity:
                self.grow(end)
            cell = self.cells + _STRIDE * start
            count, threads, task, table = self.kernel
            for t, limit in zip(tensors, limits):
                count(t.data_ptr(), t.numel(), codes[t.dtype], codes[limit], task, table, cell, threads)
                cell += _STRIDE
        else:
            self.pending.append((start, engine.reduce_stats(tensors, limits)))

    def settle(self, events: int) -> None:
        """Writes the pending blocks into row 0 and finds the first offenders among its first ``events``
        events (a few device operations)."""
        if self.pending:
            self.grow(self.written)
            for start, block in self.pending:
                cells = slice(HEAD + WIDTH * start, HEAD + WIDTH * (start + block.shape[0]))
                self.rows[CURRENT, cells] = block.reshape(-1)
            self.pending = []
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
        self.choose()

    def reset_window(self) -> None:
        """Forgets the window's kept steps (after they were read)."""
        self.rows[1:, :HEAD] = self.blank

    def read(self) -> list[list[float]]:
        """The three rows on the host: the one read of the device."""
        return self.rows.tolist()
