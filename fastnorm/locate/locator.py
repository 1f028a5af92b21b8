"""The locator: where a step first went non-finite or overflowed, forward or backward, without a host read.

One mechanism, installed once on a model: a forward hook on every module
(and a pre-hook on the model, for its inputs). The hook reduces the module's
floating-point outputs into the device buffer (:mod:`fastnorm.locate.buffer`)
and, where they require a gradient, registers a hook on each output tensor,
which reduces the gradient entering it when backward computes it. A
post-accumulate-grad hook on each parameter reduces its gradient where
backward has just written it (in cache, and in execution order among the
others); a gradient no hook read in the step (set by hand) is read when the
step closes (or a report is asked for). Each event gets its place in the
step, counted on the host: the buffer keeps the first offender as a
device-side maximum of ``-order``. A module's sites and limits are found once
(per dtype and autocast state) and kept, so an event costs a few microseconds
of host time: a dictionary look-up and one call of the kernel.

What the locator never does: read a device value before :meth:`Locator.report`
or :meth:`Locator.collect`; hold a tensor (a hook's closure holds the site's
number and its limit dtype, never the tensor); change a tensor or the graph
(every hook returns None). :meth:`Locator.remove` removes exactly the handles
it added; a gradient hook of a step still in flight does nothing afterwards.

Under ``torch.compile`` the hooks step aside while a frame is traced (they
would add their own ops to the compiled graph): a compiled model is watched at
its parameters' gradients and at what runs eagerly.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from fastnorm.locate.buffer import CURRENT, FIRST_NONFINITE, FIRST_OVERFLOW, HEAD, STEP, WIDTH, DeviceBuffer
from fastnorm.locate.finding import BACKWARD, FORWARD, KINDS, Finding, Frame, Located, Site
from fastnorm.stats import MAX_ABS, NONFINITE, OVERFLOW, SUBNORMAL

_LIMITS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _limit(dtype: torch.dtype, device_type: str) -> torch.dtype:
    """The dtype whose range judges a tensor: its own, or the autocast target where that is narrower
    (float16 under float16 autocast judges a float32 activation; bfloat16's range is float32's)."""
    if dtype not in _LIMITS:
        return torch.float32
    if torch.is_autocast_enabled(device_type):
        target = torch.get_autocast_dtype(device_type)
        if target in _LIMITS and torch.finfo(target).max < torch.finfo(dtype).max:
            return target
    return dtype


def _autocast(device_type: str) -> torch.dtype | None:
    """The autocast target on ``device_type``, or None where autocast is off: part of a module's key."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def _floating(value: Any) -> list[Tensor]:
    """The floating-point tensors of a module's output: a tensor, or one level of tuple, list or dict."""
    if type(value) is Tensor or isinstance(value, Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (tuple, list)):
        return []
    return [v for v in value if isinstance(v, Tensor) and v.is_floating_point()]


class Locator:
    r"""Names the first module, pass and tensor where a step went non-finite or overflowed.

    Watches every module's outputs in the forward pass, every gradient entering
    a module's output in the backward pass, the model's inputs and its
    parameters' gradients. For each it counts, on the device, the non-finite
    values, the values beyond the overflow margin (the largest value of the
    tensor's dtype, or of the narrower autocast target, divided by 16) and the
    subnormal ones, and the largest finite \|x\|; the first event of the step
    (in execution order) with a non-finite value, and the first with an
    overflow, are kept as integers on the device. Nothing is read on the host
    until :meth:`report` or :meth:`collect` (the monitor's cadence); the window
    keeps the first step with a finding of each kind.

    Replaces ``torch.autograd.detect_anomaly`` (backward only, NaN only, a sync
    per node) and Hugging Face's ``DebugUnderflowOverflow`` (forward only, four
    syncs per tensor per module).

    Args:
        model (nn.Module): the model to watch (every submodule, once).
        frames (int): how many sites before and after the finding the report
            shows. Default: 2.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or ``frames`` not an int.
        ValueError: ``frames`` is negative.

    Example::

        >>> locator = fastnorm.Locator(model)
        >>> for step, batch in enumerate(loader):
        ...     loss = model(batch).mean()
        ...     loss.backward()
        ...     locator.step(step)  # after backward, before zero_grad
        ...     optimizer.step()
        ...     optimizer.zero_grad()
        >>> print(locator.report())  # the one read of the device
        first non-finite: backward, `blocks.3.mlp.fc2`, gradient of its output, float16, step 1234 ...
        >>> locator.remove()
    """

    def __init__(self, model: nn.Module, *, frames: int = 2) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Locator: model must be an nn.Module, got {type(model).__name__}")
        if isinstance(frames, bool) or not isinstance(frames, int):
            raise TypeError(f"Locator: frames must be an int, got {frames!r}")
        if frames < 0:
            raise ValueError(f"Locator: frames must be >= 0, got {frames}")
        self.model = model
        self.frames = frames
        self._names: dict[int, str] = {id(m): name for name, m in model.named_modules()}
        self._params = [(name, p) for name, p in model.named_parameters()]
        self._sites: list[Site] = []
        self._site_ids: dict[tuple, int] = {}
        self._param_sites: dict[tuple, tuple] = {}  # the parameters' sites and limits, by what has a gradient
        # (module, outputs' dtypes, autocast) -> their sites, limits and gradient hooks
        self._output_sites: dict[tuple, tuple] = {}
        self._grad_sites: dict[tuple, int] = {}  # (module, output, limit, dtype) -> its gradient's site
        self._param_grad_sites: dict[tuple, tuple] = {}  # (parameter, dtype) -> its gradient's site, limit
        self._accumulated_in_step: set[int] = set()  # the parameters whose gradients backward's hooks read
        self._buffer: DeviceBuffer | None = None
        self._on = True
        self._step = 0  # the step in progress
        self._order = 0  # events so far in the step in progress
        self._params_read: tuple = ()  # the parameters' gradients when last read (identity, version)
        self._events: list[int] = []  # the site of each event of the step in progress, by order
        self._history: list[tuple[int, list[int]]] = []  # (first step, events) each time the order changed
        # The tensors the previous hook reduced: a parent often returns its last child's output.
        self._last: list[weakref.ref] = []
        self.transfers = 0
        self._handles: list[Any] = []
        self._removed = False
        self._install()

    def _install(self) -> None:
        self._handles = [self.model.register_forward_pre_hook(self._inputs)]
        self._handles += [m.register_forward_hook(self._outputs) for m in self.model.modules()]
        self._handles += [
            p.register_post_accumulate_grad_hook(partial(self._accumulated, i))
            for i, (_, p) in enumerate(self._params)
            if p.requires_grad
        ]
        self._on = True

    # -- the hooks --------------------------------------------------------------

    def _site(
        self, pass_: str, module: str, index: int | str, role: str, t: Tensor, limit: torch.dtype
    ) -> int:
        key = (pass_, module, role, index, t.dtype, limit)
        found = self._site_ids.get(key)
        if found is None:
            found = self._site_ids[key] = len(self._sites)
            self._sites.append(Site(pass_, module, role, index, _name(t.dtype), _name(limit)))
        return found

    def _new_buffer(self, device: torch.device) -> DeviceBuffer:
        self._buffer = DeviceBuffer(device, 2 * len(self._names) + len(self._params) + 1)
        return self._buffer

    def _record(self, tensors: list[Tensor], sites: tuple[int, ...], limits: list[torch.dtype]) -> None:
        buffer = self._buffer or self._new_buffer(tensors[0].device)
        buffer.record(tensors, limits)
        self._order += len(tensors)
        self._events.extend(sites)

    def _record_one(self, t: Tensor, site: int, limit: torch.dtype) -> None:
        """One tensor's event: :meth:`_record` with less host time (most events are one tensor)."""
        buffer = self._buffer or self._new_buffer(t.device)
        buffer.record_one(t, limit)
        self._order += 1
        self._events.append(site)

    def _inputs(self, module: nn.Module, args: tuple) -> None:
        if not self._on or torch.compiler.is_compiling():
            return
        tensors = _floating(args)
        if tensors:
            limits = [_limit(t.dtype, t.device.type) for t in tensors]
            sites = tuple(
                self._site(FORWARD, "", i, "input", t, lim) for i, (t, lim) in enumerate(zip(tensors, limits))
            )
            self._record(tensors, sites, limits)

    def _outputs(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not self._on or torch.compiler.is_compiling():
            return
        if isinstance(output, Tensor):  # one tensor, as most modules return: the same steps, fewer of them
            if not output.is_floating_point():
                return
            for r in self._last:  # the last child's output, reduced already
                if r() is output:
                    return
            self._last = [weakref.ref(output)]
            key = (id(module), 1, _autocast(output.device.type), output.dtype)
            sites, limits, hooks = self._output_sites.get(key) or self._learn(module, key, [output], 1)
            self._record_one(output, sites[0], limits[0])
            if output.requires_grad and torch.is_grad_enabled():
                output.register_hook(hooks[0])
            return
        found = _floating(output)
        if not found:
            return
        last = self._last
        # A child's output, reduced already: a parent often returns its last child's output.
        tensors = [t for t in found if not any(t is r() for r in last)] if last else found
        if not tensors:
            return
        self._last = [weakref.ref(t) for t in tensors]
        key = (id(module), len(found), _autocast(tensors[0].device.type), *(t.dtype for t in tensors))
        sites, limits, hooks = self._output_sites.get(key) or self._learn(module, key, tensors, len(found))
        self._record(tensors, sites, limits)
        if torch.is_grad_enabled():
            for t, hook in zip(tensors, hooks):
                if t.requires_grad:
                    t.register_hook(hook)

    def _learn(self, module: nn.Module, key: tuple, tensors: list[Tensor], found: int) -> tuple:
        """The module's sites, limits and gradient hooks for outputs of these dtypes (``found`` floating
        outputs, ``tensors`` among them not a child's), found the first time and kept under ``key``."""
        name = self._names.get(id(module), "")
        limits = [_limit(t.dtype, t.device.type) for t in tensors]
        index = tuple(range(len(tensors))) if found > 1 else (0,)
        sites = tuple(
            self._site(FORWARD, name, i, "output", t, lim) for i, t, lim in zip(index, tensors, limits)
        )
        hooks = tuple(partial(self._gradient, name, i, lim) for i, lim in zip(index, limits))
        known = self._output_sites[key] = (sites, limits, hooks)
        return known

    def _gradient(self, name: str, index: int, limit: torch.dtype, grad: Tensor) -> None:
        if self._on:
            key = (name, index, limit, grad.dtype)
            site = self._grad_sites.get(key)
            if site is None:
                site = self._grad_sites[key] = self._site(BACKWARD, name, index, "grad_output", grad, limit)
            self._record_one(grad, site, limit)

    def _accumulated(self, index: int, param: Tensor) -> None:
        """A parameter's gradient, read where backward has just written it (in cache, in execution order)."""
        grad = param.grad
        if not self._on or grad is None or not grad.is_floating_point() or torch.compiler.is_compiling():
            return
        key = (index, grad.dtype)
        known = self._param_grad_sites.get(key)
        if known is None:
            known = self._param_grad_sites[key] = self._param_site(self._params[index][0], grad)
        self._record_one(grad, *known)
        self._accumulated_in_step.add(index)

    def _param_site(self, name: str, grad: Tensor) -> tuple[int, torch.dtype]:
        """A parameter's gradient's site (its module and the parameter's name) and limit dtype."""
        limit = grad.dtype if grad.dtype in _LIMITS else torch.float32
        return self._site(BACKWARD, *name.rpartition(".")[::2], "grad", grad, limit), limit

    def _parameter_gradients(self) -> None:
        """One pass over the parameters' gradients that backward's hooks did not read in this step (set
        by hand, or under a mode whose backward runs no hooks), unless none changed since last read."""
        done = self._accumulated_in_step
        grads = [
            (n, p.grad)
            for i, (n, p) in enumerate(self._params)
            if i not in done and p.grad is not None and p.grad.is_floating_point()
        ]
        # Each gradient's identity and version: a backward since the last read changed one of them.
        seen = tuple((id(g), g._version) for _, g in grads)
        if not grads or not self._on or seen == self._params_read:
            return
        self._params_read = seen
        key = tuple((n, g.dtype) for n, g in grads)
        cached = self._param_sites.get(key)
        if cached is None:
            found = [self._param_site(n, g) for n, g in grads]
            cached = self._param_sites[key] = (tuple(s for s, _ in found), [lim for _, lim in found])
        self._record([g for _, g in grads], *cached)

    # -- the step --------------------------------------------------------------

    def step(self, step: int | None = None) -> None:
        """Closes the step in progress (the parameters' gradients no hook read, read in one pass), as
        step ``step``.

        Call it once per optimizer step, after backward and before ``zero_grad``
        (the monitor's ``update`` does). A few device operations; nothing read.

        Args:
            step (int, optional): the step's number. Default: one past the previous (0 first).
        """
        if step is not None:
            if isinstance(step, bool) or not isinstance(step, int):
                raise TypeError(f"Locator.step: step must be an int, got {step!r}")
            self._step = step
        self._parameter_gradients()
        if self._buffer is not None:
            self._buffer.close_step(self._step, self._order)
            if not self._history or self._history[-1][1] != self._events:
                self._history.append((self._step, self._events))
        self._step += 1
        self._order = 0
        self._events = []
        self._last = []
        self._accumulated_in_step = set()

    # -- reading -----------------------------------------------------------------

    def located(self) -> Located:
        """What the window found so far, the step in progress included (the one read of the device).

        Returns:
            Located: the first non-finite and the first overflow of the window, each a
            :class:`~fastnorm.locate.Finding` or None.
        """
        self._parameter_gradients()
        if self._buffer is None:
            return Located()
        self._buffer.settle(self._order)
        rows = self._buffer.read()
        self.transfers += 1
        found: dict[str, Finding | None] = {}
        for kind, cell, kept in zip(KINDS, (FIRST_NONFINITE, FIRST_OVERFLOW), (1, 2)):
            if rows[kept][cell] > float("-inf"):
                row, step = rows[kept], int(rows[kept][STEP])
                events = self._events_of(step)
            elif rows[CURRENT][cell] > float("-inf"):
                row, step, events = rows[CURRENT], self._step, self._events
            else:
                found[kind] = None
                continue
            found[kind] = self._finding(kind, row, step, events, int(-row[cell]))
        return Located(**found)

    def _events_of(self, step: int) -> list[int]:
        i = bisect.bisect_right([s for s, _ in self._history], step) - 1
        return self._history[max(i, 0)][1] if self._history else []

    def _finding(self, kind: str, row: list[float], step: int, events: list[int], order: int) -> Finding:
        def frame(offset: int) -> Frame:
            at = order + offset
            cells = row[HEAD + WIDTH * at : HEAD + WIDTH * (at + 1)]
            site = self._sites[events[at]]
            return Frame(offset, site, cells[MAX_ABS], cells[NONFINITE], cells[OVERFLOW], cells[SUBNORMAL])

        lo, hi = max(0, order - self.frames), min(len(events) - 1, order + self.frames)
        frames = tuple(frame(o - order) for o in range(lo, hi + 1))
        return Finding(kind, self._sites[events[order]], step, frames)

    def report(self) -> str:
        """The findings of the window so far in words, with their frames (reads the device once)."""
        return self.located().report()

    def collect(self) -> Located:
        """Reads the window (as :meth:`located`) and starts a new one: the monitor's cadence."""
        found = self.located()
        if self._buffer is not None:
            self._buffer.reset_window()
        self._history = self._history[-1:]
        return found

    # -- removal ---------------------------------------------------------------

    @property
    def active(self) -> bool:
        """True while the hooks are installed: until :meth:`remove` or :meth:`pause`."""
        return self._on

    def remove(self) -> None:
        """Removes every hook the locator added, by its handle; twice is harmless."""
        self._removed = True
        self._uninstall()

    def _uninstall(self) -> None:
        self._on = False
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    def pause(self) -> None:
        """Removes the hooks until :meth:`resume`, keeping the window and what was learnt of the model's
        sites (an evaluation loop, or a stretch not worth watching, runs at the bare model's speed). The
        step in progress keeps what it recorded; twice is harmless."""
        self._uninstall()

    def resume(self) -> None:
        """Installs the hooks again after :meth:`pause` (a few microseconds a module); harmless while
        active.

        Raises:
            RuntimeError: the locator was removed (:meth:`remove` is final).
        """
        if self._removed:
            raise RuntimeError("Locator.resume: the locator was removed; create a new one")
        if not self._on:
            self._install()

    def __enter__(self) -> Locator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def reader(self) -> LocatorReader:
        """The locator as a :class:`~fastnorm.GradNormMonitor` holds it when something else closes its
        steps (a trainer's callback, right after backward): the monitor reads it once per window and
        removes it at close, and its ``update`` closes no step."""
        return LocatorReader(self)

    def sites(self) -> Iterator[Site]:
        """Every site seen so far, in the order first seen."""
        return iter(list(self._sites))


class LocatorReader:
    """A :class:`Locator` whose steps are closed elsewhere: ``collect`` and ``remove`` only (see
    :meth:`Locator.reader`)."""

    def __init__(self, locator: Locator) -> None:
        self.locator = locator

    def step(self, step: int | None = None) -> None:
        """Closes nothing: whoever holds the locator closes its steps."""

    def collect(self) -> Located:
        """The locator's window (see :meth:`Locator.collect`)."""
        return self.locator.collect()

    def remove(self) -> None:
        """Removes the locator's hooks."""
        self.locator.remove()
