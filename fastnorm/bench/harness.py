"""The harness: check every contender, then time them all, interleaved.

For each workload and dtype:

1. prepare the gradients (and their flat copy);
2. call every contender once and check it against the float64 reference norm
   (clipping contenders, optimizer steps among them: every gradient, element by
   element); abort with :class:`CorrectnessError` before anything is timed if one
   is wrong. That first call on fresh gradients is also where the peak extra
   memory is measured;
3. warm up;
4. time rounds of one call of every contender (``repeats`` of them, more for
   quick workloads), in a new random order every round, so that the machine's
   noise (frequency, the memory controller, interrupts) falls on all
   of them alike. A round during which other processes kept the CPUs busy is
   replaced (see :class:`LoadMeter`), within a time budget;
5. summarize: median, min, quartiles, GB/s over the least bytes each kind must
   move, % of the roofline (the fastest plain read / read-write of the same
   bytes in the same rounds), the speedup over the contender's baseline and
   the paired ratio to it (the median over rounds of the time divided by the
   baseline's in the same round: steadier than a ratio of medians on a busy
   machine).
   Figures from too few quiet rounds, or faster than the roofline of the same
   rounds (which cannot be), are marked ``disturbed``: not results.

On CUDA each call is timed with CUDA events from an idle device (launches and
kernels), and the host time until the call returns is kept separately; on the
CPU both are the same ``perf_counter`` span.
"""

from __future__ import annotations

import gc
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fastnorm.bench.contenders import CLIPPING, STEPS, Call, Contender, Staged
from fastnorm.bench.workloads import Prepared, Workload, prepare

# A round during which other processes kept more cores than this busy (on
# average) is replaced by another, at most ROUND_BUDGET times as many rounds.
QUIET_CORES = 0.25
ROUND_BUDGET = 2
# Workloads whose rounds are quick get more of them: at least this much time
# in timed rounds, and at most MAX_ROUNDS_FACTOR times the rounds asked for.
MIN_TIMING_S = 1.0
MAX_ROUNDS_FACTOR = 10

# Below this many bytes the gradients sit in the caches and the host cost
# dominates: the roofline (a read of memory) does not bound the time there.
ROOFLINE_MIN_BYTES = 1e6

# How far a norm may be from the float64 reference. fastnorm accumulates in
# float64 and returns float32 whatever the gradients' dtype. The others only
# have to be recognizably right: torch's CPU vector_norm accumulates float32
# sequentially (0.3% off on GPT-2's 38.6M-element embedding) and returns a
# 16-bit norm for 16-bit gradients. Each result's error is reported.
NORM_RTOL_FASTNORM = {torch.float64: 1e-10}
NORM_RTOL_FASTNORM_DEFAULT = 1e-4
NORM_RTOL_OTHERS = {torch.float64: 1e-6, torch.float32: 2e-2}
NORM_RTOL_OTHERS_DEFAULT = 5e-2
# How far a clipped element may be from (original * the coefficient of the
# contender's own norm): a rounding of the coefficient and of the product.
SCALE_RTOL = {torch.float64: 1e-12, torch.float32: 1e-5}
SCALE_RTOL_DEFAULT = 2e-2


class CorrectnessError(RuntimeError):
    """A contender computed a wrong norm or clipped wrongly: nothing is timed."""


class OutOfTime(RuntimeError):
    """The run's deadline passed before this workload's rounds began: it is left out."""


# ----------------------------------------------------------------------------
# Clocks and memory
# ----------------------------------------------------------------------------


class Clock:
    """Times calls on one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time(self, call: Call, undo: Callable[[], None] | None = None) -> tuple[float, float]:
        """Seconds one call takes: (elapsed, host until it returns).

        On CUDA the device is idle when the call starts, and elapsed is the
        span between events recorded around it: launches and kernels. ``undo``
        runs afterwards, untimed; so does a :class:`Staged` call's ``before``,
        first.
        """
        if isinstance(call, Staged):
            call.before()
            call = call.call
        perf = time.perf_counter
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.sync()
            start.record()
            t0 = perf()
            call()
            host = perf() - t0
            end.record()
            self.sync()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = perf()
            call()
            elapsed = host = perf() - t0
        if undo is not None:
            undo()
        return elapsed, host


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


_PEAK_KIB = 0  # the peak resident set before peak_extra_bytes last reset VmHWM (and ru_maxrss)


def peak_memory_bytes() -> int | None:
    """The most resident memory this process has held so far (None without Linux's /proc)."""
    try:
        return max(_PEAK_KIB, _status_kib("VmHWM")) * 1024
    except OSError:
        return None


def peak_extra_bytes(call: Call, device: torch.device) -> tuple[Any, int | None, str]:
    """Runs ``call`` once; returns (its result, the peak memory it added, the method).

    CUDA: the caching allocator's peak over what was allocated before. CPU: the
    growth of the peak resident set (``VmHWM``, reset through ``clear_refs``),
    page-grained, and blind to memory the allocator already held; None where
    Linux's /proc does not allow it.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        result = call()
        torch.cuda.synchronize(device)
        return result, torch.cuda.max_memory_allocated(device) - base, "cuda.max_memory_allocated"
    global _PEAK_KIB
    try:
        _PEAK_KIB = max(_PEAK_KIB, _status_kib("VmHWM"))
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set
        base = _status_kib("VmRSS")
    except OSError:
        return call(), None, "unavailable"
    result = call()
    return result, max(0, _status_kib("VmHWM") - base) * 1024, "rss-peak"


class LoadMeter:
    """How busy the machine's CPUs were with other processes' work, since creation.

    On a small machine another process that keeps one core busy delays every
    2-thread torch kernel by a scheduler tick (milliseconds), while a kernel
    that hands out work dynamically (fastnorm's) barely notices: such rounds
    would flatter fastnorm. Linux only (``/proc/stat``); None elsewhere.
    """

    def __init__(self) -> None:
        self._start = self._snapshot()

    @staticmethod
    def _snapshot() -> tuple[float, float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                fields = [float(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0.0] * 8)[:8]
        own = os.times()
        return (
            (user + nice + system + irq + softirq) / ticks,
            steal / ticks,
            own.user + own.system,
            time.monotonic(),
        )

    def stop(self) -> dict[str, float] | None:
        end = self._snapshot()
        if self._start is None or end is None or end[3] <= self._start[3]:
            return None
        busy, steal, own, wall = (b - a for a, b in zip(self._start, end))
        return {
            "other_cores_busy": round(max(0.0, busy - own) / wall, 3),
            "steal_cores": round(steal / wall, 3),
        }


def _process_seconds() -> dict[int, tuple[str, float]]:
    """CPU seconds each process has used so far, by pid, with its name (Linux; empty elsewhere)."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:  # it ended meanwhile
            continue
        name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        out[pid] = (name, (float(rest[11]) + float(rest[12])) / ticks)  # utime, stime
    return out


@dataclass
class MachineLoad:
    """What other processes did with the CPUs over a short look before a run.

    ``other_cores_busy``: from ``/proc/stat``, less this process's own time (None
    where Linux's /proc is missing); ``processes``: (name, cores) of each other
    process that kept at least ``MIN_PROCESS_CORES`` busy, busiest first.
    """

    seconds: float
    cores: int
    other_cores_busy: float | None
    processes: list[tuple[str, float]]
    load_average: float | None

    MIN_PROCESS_CORES = 0.05

    @property
    def busy(self) -> bool:
        """Whether rounds timed like this would be replaced as disturbed (``QUIET_CORES``)."""
        return self.other_cores_busy is not None and self.other_cores_busy > QUIET_CORES

    def message(self) -> str:
        """What the load means for the run's figures, in one sentence."""
        if self.other_cores_busy is None:
            return "The load of this machine cannot be read (no /proc/stat): rounds are not checked for it."
        average = f"load average {self.load_average:.1f}" if self.load_average is not None else ""
        if not self.busy:
            return (
                f"Before the run, other processes kept {self.other_cores_busy:.2f} of the "
                f"{self.cores} cores busy ({average}); a round during which they keep more than "
                f"{QUIET_CORES:g} busy is timed again, and the end of the run says how many were."
            )
        n = len(self.processes)
        who = {0: "other processes keep", 1: "1 other process keeps"}.get(n, f"{n} other processes keep")
        top = ", ".join(f"{name} {cores:.1f}" for name, cores in self.processes[:3])
        return (
            f"Warning: {who} {self.other_cores_busy:.1f} of the {self.cores} cores busy "
            f"({top + '; ' if top else ''}{average}): most figures will be marked disturbed; "
            "run on an idle machine for results."
        )


def measure_load(seconds: float = 0.5) -> MachineLoad:
    """Watches the machine for ``seconds`` while this process sleeps."""
    own = os.getpid()
    start, before, meter = time.monotonic(), _process_seconds(), LoadMeter()
    time.sleep(seconds)
    load, after = meter.stop(), _process_seconds()
    wall = time.monotonic() - start
    processes = []
    for pid, (name, used) in after.items():
        if pid != own and pid in before:
            cores = (used - before[pid][1]) / wall
            if cores >= MachineLoad.MIN_PROCESS_CORES:
                processes.append((name, round(cores, 2)))
    try:
        average: float | None = os.getloadavg()[0]
    except OSError:
        average = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return MachineLoad(
        seconds=seconds,
        cores=cores,
        other_cores_busy=None if load is None else load["other_cores_busy"],
        processes=sorted(processes, key=lambda p: -p[1]),
        load_average=average,
    )


# ----------------------------------------------------------------------------
# Correctness
# ----------------------------------------------------------------------------


def norm_rtol(c: Contender, dtype: torch.dtype) -> float:
    if c.group in ("fastnorm", "reference"):
        return NORM_RTOL_FASTNORM.get(dtype, NORM_RTOL_FASTNORM_DEFAULT)
    return NORM_RTOL_OTHERS.get(dtype, NORM_RTOL_OTHERS_DEFAULT)


def _norms(result: Any) -> list[float] | None:
    """The norm(s) a call returned: one tensor, or a list of them (one per group)."""
    parts = result if isinstance(result, (list, tuple)) else [result]
    if not parts or not all(isinstance(t, torch.Tensor) and t.numel() == 1 for t in parts):
        return None
    return [float(t.reshape(()).item()) for t in parts]


def _check(c: Contender, result: Any, w: Prepared, max_norm: float | None) -> tuple[float | None, str | None]:
    """The relative error of the contender's first call, and why it is wrong (or None)."""
    if c.kind in ("read", "read-write"):
        return None, None
    if c.kind == "step":
        return None, w.compare(1.0, 0.0)
    got = _norms(result)
    refs = w.ref_norms if got is not None and len(got) > 1 else [w.ref_norm]
    if got is None or len(got) != len(refs):
        shape = getattr(result, "shape", "")
        want = "one norm tensor" if len(w.groups) == 1 else f"one norm or {len(w.groups)} (one per group)"
        return None, f"returned {type(result).__name__} {shape}, not {want}"
    errors = [abs(g - r) / r if math.isfinite(g) else math.inf for g, r in zip(got, refs)]
    error = max(errors)
    rtol = norm_rtol(c, w.dtype)
    if not error <= rtol:
        worst = errors.index(error)
        return error, f"norm {got[worst]!r}, float64 reference {refs[worst]!r} (rtol {rtol:g})"
    if c.kind == "clip-noop":
        return error, w.compare(1.0, 0.0)
    if c.kind in CLIPPING:
        # The gradients must be scaled by the coefficient of the norm it returned
        # (a step that clips leaves the gradients it used: torch's fused kernels
        # write them back; a step that skipped would leave them unscaled).
        coefs = [min(1.0, max_norm / (g + 1e-6)) for g in got]
        rtol = SCALE_RTOL.get(w.dtype, SCALE_RTOL_DEFAULT)
        return error, w.compare(coefs if len(coefs) > 1 else coefs[0], rtol)
    return error, None


@dataclass
class Checked:
    """What the first calls found."""

    extra_bytes: dict[str, int | None] = field(default_factory=dict)
    errors: dict[str, float | None] = field(default_factory=dict)  # relative, of the norm
    memory_method: str = "unavailable"
    dropped: dict[str, list[str]] = field(default_factory=dict)  # optional ones that raised
    # Steps that clip: (the factor the gradients they used hold over the
    # originals, the coefficient of the norm they returned).
    coefs: dict[str, tuple[float, float]] = field(default_factory=dict)


def _in_time(deadline: float | None, what: str) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise OutOfTime(what)


def check(
    contenders: list[Contender], w: Prepared, calls: dict[str, Call], deadline: float | None = None
) -> Checked:
    """Each contender's first call: correctness and error; its second call: the
    peak extra memory of a call as a training loop makes it, every step (the
    first one also imports modules and fills caches once: a distributed call's
    first costs megabytes of resident memory that no later call adds).

    Raises CorrectnessError on a wrong result (or an exception of a contender
    that is not optional); optional contenders that raise are dropped.
    OutOfTime when ``time.monotonic()`` passes ``deadline`` between two contenders.
    """
    out = Checked()
    dtype = str(w.dtype).replace("torch.", "")
    for c in contenders:
        _in_time(deadline, f"the run's time ran out while the contenders were checked, before {c.name}")
        try:
            result = calls[c.name]()
        except Exception as exc:
            if not c.optional:
                raise CorrectnessError(f"{c.name} on {w.name} {dtype}: raised {exc!r}") from exc
            out.dropped[c.name] = [f"raised {type(exc).__name__}: {exc}"]
            w.restore()
            continue
        error, wrong = _check(c, result, w, c.max_norm(w))
        if wrong is None and c.kind in CLIPPING and c.kind in STEPS:
            (norm,) = _norms(result)
            out.coefs[c.name] = (w.applied_coef(), min(1.0, c.max_norm(w) / (norm + 1e-6)))
        if c.restores:
            w.restore()
        if wrong is not None:
            raise CorrectnessError(f"{c.name} on {w.name} {dtype}: {wrong}")
        _, extra, out.memory_method = peak_extra_bytes(calls[c.name], w.device)
        if c.restores:
            w.restore()
        out.extra_bytes[c.name], out.errors[c.name] = extra, error
    return out


# ----------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------


def _summary(samples: list[float]) -> dict[str, float]:
    if len(samples) >= 2:
        q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    else:
        q1 = q3 = samples[0]
    median = statistics.median(samples)
    return {"median": median, "min": min(samples), "q1": q1, "q3": q3}


@dataclass
class Timings:
    """Per contender, the seconds of each call kept; and the rounds' story."""

    elapsed: dict[str, list[float]]
    host: dict[str, list[float]]
    rounds: int  # timed
    kept: int  # used for the statistics
    others_busy: list[float | None]  # cores busy with other processes, per round
    busy_kept: int = 0  # rounds kept although other processes were busy: the figures are disturbed
    wanted: int = 0  # quiet rounds wanted: the rounds asked for, more for quick ones
    quiet: int = 0  # rounds free of other processes' work
    # Why fewer quiet rounds than wanted: "time" (max_time_s ran out), "rounds"
    # (ROUND_BUDGET times the rounds wanted were timed); None when enough were quiet.
    stopped: str | None = None


# Fewer quiet rounds than this and the statistics use every round (disturbed).
MIN_QUIET_ROUNDS = 3


def time_rounds(
    contenders: list[Contender],
    w: Prepared,
    calls: dict[str, Call],
    clock: Clock,
    repeats: int,
    warmup: int,
    min_time_s: float = MIN_TIMING_S,
    lockstep: bool = False,
    max_time_s: float | None = None,
    on_round: Callable[[int, int, int, float], None] | None = None,
) -> Timings:
    """Warm-up, then rounds of one call of each contender, until enough quiet rounds.

    Every timed call follows the other contenders' calls, as the norm follows
    the backward pass in a training step: no contender gets a cache warmed by
    its own previous call. Enough means ``repeats`` rounds, or more when they
    are quick (``min_time_s`` in all, up to ``MAX_ROUNDS_FACTOR * repeats``). A round
    during which other processes kept more than ``QUIET_CORES`` busy is
    replaced by another, up to ``ROUND_BUDGET`` times the rounds wanted, and
    no longer than ``max_time_s`` (once ``MIN_QUIET_ROUNDS`` rounds are done, no
    round begins that would end after it).
    The statistics use the quiet rounds; with fewer than ``MIN_QUIET_ROUNDS``
    of them, every round, and ``busy_kept`` says how many were not quiet.
    ``on_round(quiet, wanted, timed, seconds)`` is called after every round
    (a progress bar): the quiet rounds so far, the quiet ones wanted, the rounds
    timed and the seconds since the first began.

    ``lockstep`` (ranks of a process group, whose calls include collectives):
    exactly ``repeats`` rounds, in the same order on every rank, none replaced.
    """

    def undo_of(c: Contender) -> Callable[[], None] | None:
        return w.restore if c.restores else None

    for _ in range(warmup):
        for c in contenders:
            clock.time(calls[c.name], undo_of(c))

    rounds: list[tuple[dict[str, tuple[float, float]], float | None]] = []
    # A fresh order every round, not a rotation: with a fixed cyclic order each
    # contender would always follow the same one, and fastnorm's variants,
    # which walk the same parameter objects, would warm the caches for each other.
    order = random.Random(0)
    want = repeats
    quiet = 0
    stopped = None
    start = time.perf_counter()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        while quiet < want:
            if len(rounds) >= ROUND_BUDGET * want:
                stopped = "rounds"
                break
            spent = time.perf_counter() - start
            # No round is begun that would end after max_time_s, at the pace of those before it.
            if (
                not lockstep
                and max_time_s is not None
                and len(rounds) >= MIN_QUIET_ROUNDS
                and spent * (1 + 1 / len(rounds)) > max_time_s
            ):
                stopped = "time"
                break
            shuffled = order.sample(contenders, len(contenders))
            meter = LoadMeter()
            t0 = time.perf_counter()
            samples = {c.name: clock.time(calls[c.name], undo_of(c)) for c in shuffled}
            if not rounds and not lockstep:  # the first round tells how many rounds fit in min_time_s
                took = time.perf_counter() - t0
                want = max(repeats, min(MAX_ROUNDS_FACTOR * repeats, math.ceil(min_time_s / took)))
            load = None if lockstep else meter.stop()
            busy = None if load is None else load["other_cores_busy"]
            rounds.append((samples, busy))
            quiet += busy is None or busy <= QUIET_CORES
            if on_round is not None:
                on_round(quiet, want, len(rounds), time.perf_counter() - start)
    finally:
        if gc_was_enabled:
            gc.enable()
    kept = [samples for samples, busy in rounds if busy is None or busy <= QUIET_CORES]
    busy_kept = 0
    if len(kept) < min(MIN_QUIET_ROUNDS, len(rounds)):
        kept = [samples for samples, _ in rounds]
        busy_kept = len(rounds) - quiet
    return Timings(
        elapsed={c.name: [k[c.name][0] for k in kept] for c in contenders},
        host={c.name: [k[c.name][1] for k in kept] for c in contenders},
        rounds=len(rounds),
        kept=len(kept),
        others_busy=[busy for _, busy in rounds],
        busy_kept=busy_kept,
        wanted=want,
        quiet=quiet,
        stopped=stopped,
    )


# ----------------------------------------------------------------------------
# One workload
# ----------------------------------------------------------------------------


def disturbed(record: dict[str, Any], result: dict[str, Any] | None = None) -> str | None:
    """Why a record's figures (or one result's) are not results, or None."""
    return record.get("disturbed") or (result or {}).get("disturbed")


def memory_needed(workload: Workload, dtype: torch.dtype, quick: bool = False) -> int:
    """Bytes a workload holds while it runs: the gradients, their flat copy, and
    for an optimizer step the parameters and the optimizer's state."""
    return workload.copies * workload.numel(quick) * torch.empty((), dtype=dtype).element_size()


def memory_available(device: torch.device) -> int | None:
    """Free device memory (CUDA) or MemAvailable (Linux); None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def too_big(workload: Workload, dtype: torch.dtype, device: torch.device, quick: bool = False) -> str | None:
    """Why the workload would not fit in memory (with a 20% margin), or None."""
    need, free = memory_needed(workload, dtype, quick), memory_available(device)
    if free is not None and need * 1.2 > free:
        have = f"{free / 1e9:.1f} GB free on {device.type}"
        what = "gradients and their copy"
        if workload.copies != 2:  # an optimizer step: its parameters and state too
            what = f"{workload.copies} arrays of the gradients' size"
        return f"needs {need / 1e9:.1f} GB for {what}, {have}"
    return None


def _roofline(contenders: list[Contender], medians: dict[str, float], kind: str) -> tuple[str, float] | None:
    candidates = [(medians[c.name], c.name) for c in contenders if c.roofline and c.kind == kind]
    if not candidates:
        return None
    seconds, name = min(candidates)
    return name, seconds


def _clock_hz(device: torch.device) -> float | None:
    """The core clock (CPU workloads), for elements per cycle; None where unknown."""
    from fastnorm.backends import cpp

    if device.type != "cpu" or cpp._C is None:
        return None
    return cpp._C.clock_hz(0.05) or None


def run_workload(
    workload: Workload,
    dtype: torch.dtype,
    device: torch.device,
    contenders: list[Contender],
    *,
    repeats: int,
    warmup: int,
    quick: bool = False,
    min_time_s: float = MIN_TIMING_S,
    skipped: dict[str, list[str]] | None = None,
    dtype_name: str | None = None,
    lockstep: bool = False,
    max_time_s: float | None = None,
    on_round: Callable[[int, int, int, float], None] | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Checks, then times every contender on one workload; returns its JSON record.

    Raises OutOfTime when ``time.monotonic()`` passes ``deadline`` (the run's
    budget) before the rounds begin: its setup took the time they would have had.

    ``max_time_s`` bounds the timed rounds (see :func:`time_rounds`); the
    workload's ``threads``, when set, is torch's thread count meanwhile. The
    record's ``seconds`` say where the time went: ``setup`` (the gradients, the
    correctness check) and ``timing`` (warm-up and timed rounds).
    """
    started = time.perf_counter()
    threads = torch.get_num_threads()
    if workload.threads is not None:
        torch.set_num_threads(workload.threads)
    w = prepare(workload, dtype, device, quick=quick)
    if workload.contenders is not None:
        contenders = [c for c in contenders if c.name in workload.contenders]
    unsuited = {c.name: c.dtype_reasons(device, dtype) for c in contenders}
    unsuited = {name: reasons for name, reasons in unsuited.items() if reasons}
    contenders = [c for c in contenders if c.name not in unsuited]
    try:
        calls = {c.name: c.make(w, c.max_norm(w)) for c in contenders}
        checked = check(contenders, w, calls, deadline)
        _in_time(deadline, "the run's time ran out while the contenders were checked")
        live = [c for c in contenders if c.name not in checked.dropped]
        load = LoadMeter()
        hz = _clock_hz(device)
        timing_started = time.perf_counter()
        timings = time_rounds(
            live, w, calls, Clock(device), repeats, warmup, min_time_s, lockstep, max_time_s, on_round
        )
        timing_s = time.perf_counter() - timing_started
        if hz is not None:  # the clock may have changed while the rounds ran: the faster reading
            hz = max(hz, _clock_hz(device) or 0.0)
        record = _record(workload, w, live, timings, checked, quick, hz)
        record["load"] = load.stop()
        record["threads"] = torch.get_num_threads()
        record["rounds"] = {
            "timed": timings.rounds,
            "kept": timings.kept,
            "busy_kept": timings.busy_kept,
            "quiet_cores": QUIET_CORES,
            "others_busy": timings.others_busy,
            "asked": repeats,
            "wanted": timings.wanted,
            "quiet": timings.quiet,
            "stopped": timings.stopped,
            "max_time_s": max_time_s,
        }
        record["seconds"] = {
            "setup": round(timing_started - started, 3),
            "timing": round(timing_s, 3),
        }
        if timings.busy_kept:
            busiest = max(b for b in timings.others_busy if b is not None)
            record["disturbed"] = (
                f"other processes kept up to {busiest:.2f} cores busy in {timings.busy_kept} of "
                f"{timings.rounds} rounds"
            )
        record["dtype"] = dtype_name or str(dtype).replace("torch.", "")
        record["skipped"] = {**(skipped or {}), **unsuited, **checked.dropped}
        return record
    finally:
        del w
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        torch.set_num_threads(threads)


def paired_ratio(samples: list[float], baseline: list[float]) -> float:
    """The median over rounds of a time divided by the baseline's in the same round."""
    return statistics.median(t / b for t, b in zip(samples, baseline))


def _record(
    workload: Workload,
    w: Prepared,
    contenders: list[Contender],
    timings: Timings,
    checked: Checked,
    quick: bool,
    clock_hz: float | None = None,
) -> dict[str, Any]:
    elapsed = timings.elapsed
    stats = {name: _summary(samples) for name, samples in elapsed.items()}
    medians = {name: s["median"] for name, s in stats.items()}
    read = _roofline(contenders, medians, "read")
    read_write = _roofline(contenders, medians, "read-write")
    roof_seconds = {
        "norm": read[1] if read else None,
        "clip-noop": read[1] if read else None,
        "read": read[1] if read else None,
        "read-write": read_write[1] if read_write else None,
        "clip": read[1] + read_write[1] if read and read_write else None,
    }
    tensors = sum(1 for p in w.params if p.grad is not None)
    # Elements per cycle of one core: for the workloads that run on one thread.
    per_cycle = clock_hz if workload.threads == 1 else None
    results = []
    for c in contenders:
        s = stats[c.name]
        moved = c.bytes_moved(w)
        roof = roof_seconds.get(c.kind)
        base = medians.get(c.baseline) if c.baseline else None
        roofline_pct = 100 * roof / s["median"] if roof else None
        host_us = statistics.median(timings.host[c.name]) * 1e6
        result = {
            "contender": c.name,
            "kind": c.kind,
            "group": c.group,
            "ms": s["median"] * 1e3,
            "ms_min": s["min"] * 1e3,
            "ms_q1": s["q1"] * 1e3,
            "ms_q3": s["q3"] * 1e3,
            "spread_pct": 100 * (s["q3"] - s["q1"]) / s["median"],
            "host_us": host_us,
            "host_us_per_tensor": (
                host_us / tensors if workload.host_cost and c.group != "reference" else None
            ),
            "bytes_moved": moved,
            "gbps": moved / s["median"] / 1e9,
            "roofline_pct": roofline_pct,
            "baseline": c.baseline if base else None,
            "speedup": base / s["median"] if base else None,
            "paired_ratio": paired_ratio(elapsed[c.name], elapsed[c.baseline]) if base else None,
            "elements_per_cycle": (
                w.numel / s["median"] / per_cycle if per_cycle and c.kind in ("norm", "read") else None
            ),
            "norm_error": checked.errors.get(c.name),
            "extra_bytes": checked.extra_bytes.get(c.name),
            "applied_coef": checked.coefs.get(c.name, (None, None))[0],
            "expected_coef": checked.coefs.get(c.name, (None, None))[1],
            "samples_ms": [round(x * 1e3, 6) for x in elapsed[c.name]],
        }
        # Faster than a plain read of the same bytes in the same rounds cannot
        # be: the rounds of one of them were disturbed. On one thread torch's
        # reads are bound by their own arithmetic, not by memory (torch.sum of
        # bfloat16 widens every element): a kernel may beat them there.
        impossible = (
            roofline_pct is not None
            and roofline_pct > 100
            and w.nbytes >= ROOFLINE_MIN_BYTES
            and torch.get_num_threads() > 1
        )
        if impossible and not c.roofline:
            result["disturbed"] = (
                f"timed faster than memory allows ({roofline_pct:.0f}% of the fastest plain read of the "
                "same bytes, in the same rounds)"
            )
        results.append(result)

    def roof_entry(found: tuple[str, float] | None, factor: int) -> dict[str, Any] | None:
        if found is None:
            return None
        name, seconds = found
        return {"kernel": name, "ms": seconds * 1e3, "gbps": factor * w.nbytes / seconds / 1e9}

    return {
        "workload": workload.name,
        "description": workload.description,
        "quick": quick,
        "tensors": tensors,
        "groups": len(w.groups),
        "numel": w.numel,
        "bytes": w.nbytes,
        "ref_norm": w.ref_norm,
        "clock_hz": clock_hz,
        "memory_method": checked.memory_method,
        "roofline": {"read": roof_entry(read, 1), "read_write": roof_entry(read_write, 2)},
        "results": results,
    }
