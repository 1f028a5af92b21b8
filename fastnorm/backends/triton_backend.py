"""The triton backend: one fused multi-tensor reduction per dtype on the GPU.

Launches per call: ``total_norm`` makes one ``norm_partials_kernel`` launch per
dtype present plus one ``finalize_kernel`` launch, whatever the number of
tensors; ``clip_`` adds one ``scale_kernel`` launch per dtype, which returns at
once when no clipping is needed; ``tensor_norms`` adds one ``per_tensor_kernel``
launch per dtype. Partials are reduced by one program in a fixed
order (no float atomics), so results are bitwise reproducible. The tables of
addresses, sizes and chunks reach the device through pinned memory with
``non_blocking=True``; the front caches them while the gradients' addresses
stay the same, so a steady training loop copies nothing and never syncs.

With ``TRITON_INTERPRET=1`` (set before the first use) the same kernels run in
Triton's interpreter on CPU tensors, which is how CI tests them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import struct
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fastnorm import _stats
from fastnorm._partial import Mode
from fastnorm.backends.fused import fused_reasons

_TRITON_FOUND = importlib.util.find_spec("triton") is not None
_KERNELS: Any = None
_KERNELS_ERROR: Exception | None = None


def kernels() -> Any:
    """The kernels module, imported on first use (TRITON_INTERPRET is read then)."""
    global _KERNELS, _KERNELS_ERROR
    if _KERNELS is None and _KERNELS_ERROR is None:
        try:
            from fastnorm.backends import triton_kernels
        except Exception as exc:  # a broken triton install raises many kinds of errors
            _KERNELS_ERROR = exc
        else:
            _KERNELS = triton_kernels
    if _KERNELS is None:
        raise RuntimeError(f"the Triton kernels did not import: {_KERNELS_ERROR}")
    return _KERNELS


def _interpret_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True)
class Config:
    """Launch geometry; the interpreter gets a small one so tests cover many chunks quickly.

    Per step of the main loop, a thread of an ALIGNED kernel reads up to
    ``vector_run`` vectors of 16 bytes (one 128-bit load each) and at most
    ``run_elements`` elements; a thread of a general kernel reads
    ``scalar_run`` single elements, each from the same place in consecutive
    rows of threads (coalesced). A thread sums one step's values in float32, so
    ``run_elements`` also bounds those sums. Enough bytes in flight per thread
    for HBM; few enough registers for ``programs_per_sm`` programs to be
    resident at once (``fastnorm kernels`` shows both). On NVIDIA GPUs the
    compiler is held to that register budget (``maxnreg``); the compile tests
    check that it costs no spills.
    """

    num_warps: int
    warp_size: int
    vector_run: int
    run_elements: int
    scalar_run: int
    max_chunk: int  # elements; a multiple of every step
    chunks_per_program: int  # aim: so many chunks per program, so that they end together
    programs_per_sm: int
    register_budget: bool  # pass maxnreg (NVIDIA's compiler takes it; AMD's does not)

    def __post_init__(self) -> None:
        for dtype in DTYPES:
            for aligned in (True, False):
                run, rows, vec = self.geometry(dtype, aligned)
                if self.max_chunk % (run * rows * vec):
                    raise ValueError(f"max_chunk={self.max_chunk} is not a whole number of steps for {dtype}")

    @property
    def rows(self) -> int:
        return self.num_warps * self.warp_size

    def geometry(self, dtype: torch.dtype, aligned: bool) -> tuple[int, int, int]:
        """``(R, ROWS, VEC)``: a step reads a tile of that shape, VEC contiguous elements per row."""
        if aligned:
            vec = 16 // dtype.itemsize
            return min(self.vector_run, self.run_elements // vec), self.rows, vec
        return self.scalar_run, self.rows, 1

    def options(self) -> dict[str, Any]:
        """Compiler options of the norm and scale kernels (fused multiply-adds: squares summed
        with one rounding, and Triton's default, made explicit)."""
        options: dict[str, Any] = {"num_warps": self.num_warps, "enable_fp_fusion": True}
        if self.register_budget:
            options["maxnreg"] = REGISTERS_PER_SM // (self.programs_per_sm * self.rows)
        return options


REGISTERS_PER_SM = 65536  # every NVIDIA GPU from sm_50 to sm_120
GPU_CONFIG = Config(
    num_warps=8,
    warp_size=32,
    vector_run=8,
    run_elements=32,
    scalar_run=16,
    max_chunk=65536,
    chunks_per_program=16,
    programs_per_sm=4,
    register_budget=True,
)
ROCM_CONFIG = replace(GPU_CONFIG, num_warps=4, warp_size=64, register_budget=False)
INTERPRETER_CONFIG = Config(
    num_warps=1,
    warp_size=32,
    vector_run=2,
    run_elements=8,
    scalar_run=4,
    max_chunk=512,
    chunks_per_program=4,
    programs_per_sm=1,
    register_budget=False,
)
INTERPRETER_PROGRAMS = 4
REDUCE_BLOCK = 256  # rows of partials per step of the finalize/per-tensor reductions


@dataclass(frozen=True)
class Launch:
    """One specialization of one kernel as the backend launches it."""

    kernel: str  # the name of a kernel in triton_kernels
    dtype: torch.dtype | None  # the gradients' dtype (None: the kernel reads partials only)
    constants: dict[str, Any]  # its constexpr arguments
    options: dict[str, Any]  # compiler options: num_warps, ...
    pointers: dict[str, torch.dtype] = field(default_factory=dict)  # float pointer arguments


def _geometry(config: Config, dtype: torch.dtype, aligned: bool) -> dict[str, Any]:
    run, rows, vec = config.geometry(dtype, aligned)
    return {"ALIGNED": aligned, "R": run, "ROWS": rows, "VEC": vec}


def norm_launch(config: Config, dtype: torch.dtype, mode: Mode, aligned: bool) -> Launch:
    constants = {"DTYPE": kernels().TL_DTYPES[dtype], "MODE": int(mode), **_geometry(config, dtype, aligned)}
    return Launch("norm_partials_kernel", dtype, constants, config.options())


def stats_launch(config: Config, dtype: torch.dtype, aligned: bool) -> Launch:
    """The L2 norm's pass that also counts (each tensor judged by its own dtype's range)."""
    tiny, margin = _stats.thresholds(dtype)
    thresholds = {
        "TINY_BITS": _abs_bits(tiny, dtype),
        "MARGIN_BITS": _abs_bits(margin, dtype),
        "INF_BITS": _abs_bits(float("inf"), dtype),
    }
    # Two counts share an int32 per thread (_run_small): a thread's share of a chunk stays below 2^16;
    # float64's counts compare high words only, exact as the smallest normal's low word is 0.
    assert config.max_chunk // config.rows < 1 << 16, "a thread's count of a chunk must fit 16 bits"
    assert dtype != torch.float64 or thresholds["TINY_BITS"] & 0xFFFFFFFF == 0
    constants = {"DTYPE": kernels().TL_DTYPES[dtype], **_geometry(config, dtype, aligned)}
    return Launch("norm_stats_kernel", dtype, {**constants, **thresholds}, config.options())


def _abs_bits(value: float, dtype: torch.dtype) -> int:
    """``value`` >= 0 as the kernels' _abs_bits of it in the type ``dtype`` is counted in (float32 for
    16-bit dtypes, whose values widen exactly): the integer whose order is that of |x|."""
    wide = dtype == torch.float64
    return int.from_bytes(struct.pack("<d" if wide else "<f", value), "little")


def scale_launch(config: Config, dtype: torch.dtype, norm_dtype: torch.dtype, aligned: bool) -> Launch:
    constants = {
        "DTYPE": kernels().TL_DTYPES[dtype],
        "NORM_IS_F64": norm_dtype == torch.float64,
        **_geometry(config, dtype, aligned),
    }
    return Launch("scale_kernel", dtype, constants, config.options(), {"norm_ptr": norm_dtype})


def finalize_launch(mode: Mode, result_dtype: torch.dtype) -> Launch:
    constants = {"MODE": int(mode), "BLOCK": REDUCE_BLOCK}
    return Launch("finalize_kernel", None, constants, {"num_warps": 4}, {"root_ptr": result_dtype})


def per_tensor_launch(mode: Mode) -> Launch:
    return Launch("per_tensor_kernel", None, {"MODE": int(mode), "BLOCK": REDUCE_BLOCK}, {"num_warps": 1})


def launches(config: Config = GPU_CONFIG) -> list[Launch]:
    """Every specialization the backend can launch with ``config``: what ``fastnorm kernels`` compiles."""
    modes = [mode for mode in Mode if mode.fused]  # the front hands the others to the torch backend
    out = []
    for dtype in DTYPES:
        for aligned in (True, False):
            for mode in modes:
                out.append(norm_launch(config, dtype, mode, aligned))
            out.append(stats_launch(config, dtype, aligned))
            for norm_dtype in (torch.float32, torch.float64):
                if dtype != torch.float64 or norm_dtype == torch.float64:
                    out.append(scale_launch(config, dtype, norm_dtype, aligned))
    for mode in modes:
        out.append(per_tensor_launch(mode))
        for result_dtype in (torch.float32, torch.float64):
            out.append(finalize_launch(mode, result_dtype))
    return out


def is_aligned(addresses: list[int]) -> bool:
    """Whether every address is 16-byte aligned: with chunks of whole steps (16-byte
    multiples), so is every chunk start, which the ALIGNED kernels promise the compiler."""
    return all(a % 16 == 0 for a in addresses)


def chunk_size(config: Config, dtype: torch.dtype, aligned: bool, total: int, max_programs: int) -> int:
    """Elements per chunk for ``total`` elements read by up to ``max_programs`` programs.

    Whole steps of the main loop, at most ``config.max_chunk``, and small enough
    that each program gets about ``config.chunks_per_program`` chunks: a program
    with one chunk more than the others is then a small delay, not a second
    wave (with one chunk each, 530 chunks on 528 programs take twice as long
    as 528).
    """
    run, rows, vec = config.geometry(dtype, aligned)
    step = run * rows * vec
    wanted = -(-total // (max_programs * config.chunks_per_program))
    return max(step, min(config.max_chunk, -(-wanted // step) * step))


_SM_COUNT: dict[int, int] = {}


def _config(device: torch.device) -> Config:
    if device.type == "cpu":
        return INTERPRETER_CONFIG
    return ROCM_CONFIG if torch.version.hip else GPU_CONFIG


def _max_programs(device: torch.device, config: Config) -> int:
    if device.type != "cuda":
        return INTERPRETER_PROGRAMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index] * config.programs_per_sm


@dataclass
class DtypeTable:
    """The tensors of one dtype: their device table and launch geometry."""

    dtype: torch.dtype
    aligned: bool  # every address 16-byte aligned: the ALIGNED kernels (128-bit loads) serve it
    chunk: int  # elements per chunk
    table: torch.Tensor
    num_tensors: int
    num_chunks: int
    grid: int
    partial_offset: int  # first row of this dtype's partials in the shared buffer
    chunk_offset: int  # first row of this dtype's chunks in the per-chunk buffer
    tensor_offset: int  # first row of this dtype's tensors in the per-tensor buffer


@dataclass
class Prepared:
    device: torch.device
    config: Config
    tables: list[DtypeTable]
    num_partials: int
    num_chunks: int
    num_tensors: int
    # Rows of the per-tensor output, dtype-grouped, back to the caller's order
    # (None when already in it).
    order: torch.Tensor | None
    host_table: torch.Tensor = field(repr=False)  # kept alive while the copy may run
    stream: Any = None  # the CUDA stream the tables were copied on
    synced: set[Any] = field(default_factory=set, repr=False)  # other streams made to wait for it
    _tensor_of_chunk: torch.Tensor | None = field(default=None, repr=False)

    def tensor_of_chunk(self) -> torch.Tensor:
        """The tensor (dtype-grouped order) of each chunk, on the device: built once, from the tables."""
        if self._tensor_of_chunk is None:
            parts = [
                t.table[3 * t.num_tensors + 1 : 3 * t.num_tensors + 1 + t.num_chunks] + t.tensor_offset
                for t in self.tables
            ]
            self._tensor_of_chunk = torch.cat(parts)
        return self._tensor_of_chunk

    def on_current_stream(self) -> None:
        """Orders a launch on another stream than the tables' copy after that copy,
        and tells the allocator that stream uses them (a plan outlives streams)."""
        if self.stream is None:
            return
        current = torch.cuda.current_stream(self.device)
        if current != self.stream and current not in self.synced:
            current.wait_stream(self.stream)
            for t in self.tables:
                t.table.record_stream(current)
            if self.order is not None:
                self.order.record_stream(current)
            self.synced.add(current)


def _table(addrs: list[int], numels: list[int], chunk: int) -> tuple[torch.Tensor, int]:
    """The int64 table of one dtype (see triton_kernels) and its number of chunks."""
    counts = torch.tensor([-(-n // chunk) for n in numels], dtype=torch.int64)
    ends = torch.cumsum(counts, 0)
    first_chunk = torch.cat([torch.zeros(1, dtype=torch.int64), ends])
    tensor_of_chunk = torch.repeat_interleave(torch.arange(len(numels)), counts)
    start = (torch.arange(int(ends[-1])) - first_chunk[tensor_of_chunk]) * chunk
    head = torch.tensor(addrs + numels, dtype=torch.int64)
    return torch.cat([head, first_chunk, tensor_of_chunk, start]), int(ends[-1])


def _launch_per_tensor(
    k, t: DtypeTable, chunks: torch.Tensor, tensors: torch.Tensor, mode: Mode, p: float
) -> None:
    """Each tensor of table ``t``'s own partial from its chunks' rows (``per_tensor_kernel``)."""
    launch = per_tensor_launch(mode)
    k.per_tensor_kernel[(t.num_tensors,)](
        t.table,
        t.num_tensors,
        chunks[t.chunk_offset :],
        tensors[t.tensor_offset :],
        float(p),
        **launch.constants,
        **launch.options,
    )


def _launch_finalize(
    k, prepared: Prepared, partials, out, root, mode: Mode, p: float, result_dtype: torch.dtype
) -> None:
    """The programs' partials merged into ``out`` and the norm into ``root`` (``finalize_kernel``)."""
    launch = finalize_launch(mode, result_dtype)
    k.finalize_kernel[(1,)](
        partials, prepared.num_partials, out, root, float(p), **launch.constants, **launch.options
    )


class TritonBackend:
    name = "triton"
    cacheable = True  # tables of addresses, rebuilt when an address changes

    def not_supported_reasons(
        self, device: torch.device, mode: Mode | None = None, dense: bool = True
    ) -> list[str]:
        return fused_reasons(mode, dense) + self._device_reasons(device)

    def _device_reasons(self, device: torch.device) -> list[str]:
        reasons = []
        if not _TRITON_FOUND:
            reasons.append("triton is not installed (pip install 'torch-fastnorm[triton]')")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                reasons.append("torch.cuda is not available")
        elif device.type == "cpu":
            if not _interpret_requested():
                reasons.append("CPU tensors need Triton's interpreter (TRITON_INTERPRET=1)")
        else:
            reasons.append(f"it serves CUDA tensors, not {device.type}")
        if not reasons:
            try:
                interpreted = kernels().INTERPRETED
            except RuntimeError as exc:
                return [str(exc)]
            if interpreted != (device.type == "cpu"):
                loaded = "interpreted" if interpreted else "compiled"
                reasons.append(
                    f"the kernels were loaded {loaded} (TRITON_INTERPRET changed after the first use)"
                )
        return reasons

    def prepare(self, tensors: list[torch.Tensor]) -> Prepared:
        device = tensors[0].device
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Pinning host memory is not allowed while a CUDA graph is captured.
            raise RuntimeError(
                "fastnorm: the gradients' tables are built on the first call; make that call "
                "(a warm-up step) before capturing a CUDA graph, with the gradients the graph will use"
            )
        config = _config(device)
        positions: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(tensors):
            positions.setdefault(t.dtype, []).append(i)
        max_programs = _max_programs(device, config)
        tables, parts, starts = [], [], []
        offset = partial_offset = chunk_offset = tensor_offset = 0
        for dtype, where in positions.items():
            group = [tensors[i] for i in where]
            addresses, numels = [t.data_ptr() for t in group], [t.numel() for t in group]
            aligned = is_aligned(addresses)
            chunk = chunk_size(config, dtype, aligned, sum(numels), max_programs)
            part, num_chunks = _table(addresses, numels, chunk)
            grid = min(num_chunks, max_programs)
            tables.append(
                DtypeTable(
                    dtype,
                    aligned,
                    chunk,
                    part,
                    len(group),
                    num_chunks,
                    grid,
                    partial_offset,
                    chunk_offset,
                    tensor_offset,
                )
            )
            parts.append(part)
            starts.append(offset)
            offset += part.numel()
            partial_offset += grid
            chunk_offset += num_chunks
            tensor_offset += len(group)
        grouped = [i for where in positions.values() for i in where]
        order = None
        if grouped != list(range(len(tensors))):
            order = torch.empty(len(tensors), dtype=torch.int64)
            order[torch.tensor(grouped)] = torch.arange(len(tensors))
            parts.append(order)
        host = torch.cat(parts)
        stream = None
        if device.type == "cuda":
            host = host.pin_memory()
            table = host.to(device, non_blocking=True)
            stream = torch.cuda.current_stream(device)
        else:
            table = host
        for t, start in zip(tables, starts):
            t.table = table[start : start + t.table.numel()]
        device_order = table[offset:] if order is not None else None
        return Prepared(
            device, config, tables, partial_offset, chunk_offset, tensor_offset, device_order, host, stream
        )

    def reduce(
        self,
        prepared: Prepared,
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
        per_tensor: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        k = kernels()
        device, config = prepared.device, prepared.config
        prepared.on_current_stream()
        partials = torch.empty((prepared.num_partials, 2), dtype=torch.float64, device=device)
        out = torch.empty(2, dtype=torch.float64, device=device)
        root = torch.empty((), dtype=result_dtype, device=device)
        chunks = tensors = None
        if per_tensor:
            chunks = torch.empty((prepared.num_chunks, 2), dtype=torch.float64, device=device)
            tensors = torch.empty((prepared.num_tensors, 2), dtype=torch.float64, device=device)
        with _on(device):
            for t in prepared.tables:
                launch = norm_launch(config, t.dtype, mode, t.aligned)
                k.norm_partials_kernel[(t.grid,)](
                    t.table,
                    t.num_tensors,
                    t.num_chunks,
                    t.chunk,
                    partials[t.partial_offset :],
                    chunks[t.chunk_offset :] if per_tensor else partials,
                    float(p),
                    int(per_tensor),
                    **launch.constants,
                    **launch.options,
                )
                if per_tensor:
                    _launch_per_tensor(k, t, chunks, tensors, mode, p)
            _launch_finalize(k, prepared, partials, out, root, mode, p, result_dtype)
        if tensors is not None and prepared.order is not None:
            tensors = tensors[prepared.order]
        return out, root, tensors

    def serves_stats(self, mode: Mode, limits: list[torch.dtype | None]) -> bool:
        """The statistics come from the norm's own pass for p=2 with every tensor judged by its own
        dtype (the thresholds are constants of the kernel); torch's ops give them otherwise."""
        return mode == Mode.L2 and all(limit is None for limit in limits)

    def reduce_stats(
        self,
        prepared: Prepared,
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
        limits: list[torch.dtype | None],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``reduce``'s partials and root (the same bits: the same runs summed the same way) and each
        tensor's row of ``fastnorm.stats.COLUMNS``, counted from the same loads (``norm_stats_kernel``).
        Only where :meth:`serves_stats`."""
        if not self.serves_stats(mode, limits):
            raise NotImplementedError("TritonBackend.reduce_stats: p=2 and each tensor's own dtype only")
        k = kernels()
        device, config = prepared.device, prepared.config
        prepared.on_current_stream()
        partials = torch.empty((prepared.num_partials, 2), dtype=torch.float64, device=device)
        out = torch.empty(2, dtype=torch.float64, device=device)
        root = torch.empty((), dtype=result_dtype, device=device)
        chunks = torch.empty((prepared.num_chunks, 2), dtype=torch.float64, device=device)
        width = len(_stats.COLUMNS)
        chunk_rows = torch.empty((prepared.num_chunks, width), dtype=torch.float64, device=device)
        tensors = torch.empty((prepared.num_tensors, 2), dtype=torch.float64, device=device)
        with _on(device):
            for t in prepared.tables:
                launch = stats_launch(config, t.dtype, t.aligned)
                k.norm_stats_kernel[(t.grid,)](
                    t.table,
                    t.num_tensors,
                    t.num_chunks,
                    t.chunk,
                    partials[t.partial_offset :],
                    chunks[t.chunk_offset :],
                    chunk_rows[t.chunk_offset :],
                    **launch.constants,
                    **launch.options,
                )
                _launch_per_tensor(k, t, chunks, tensors, mode, p)
            _launch_finalize(k, prepared, partials, out, root, mode, p, result_dtype)
        # Each tensor's row: the counts add up over its chunks (exact in float64, in any order), the
        # largest |x| is the largest, and sum_sq is its own partial (per_tensor_kernel: in order) at scale 1.
        of_chunk = prepared.tensor_of_chunk()
        stats = torch.zeros((prepared.num_tensors, len(_stats.COLUMNS)), dtype=torch.float64, device=device)
        stats.index_add_(0, of_chunk, chunk_rows)
        stats[:, _stats.MAX_ABS] = 0.0  # all >= 0: the largest, not the sum
        stats[:, _stats.MAX_ABS].scatter_reduce_(0, of_chunk, chunk_rows[:, _stats.MAX_ABS], "amax")
        m, s = tensors[:, 0], tensors[:, 1]
        stats[:, _stats.SUM_SQ] = torch.where(m > 0, s * m * m, s)
        if prepared.order is not None:
            stats = stats[prepared.order]
        return out, root, stats

    def scale_(self, prepared: Prepared, norm: torch.Tensor, max_norm: float) -> None:
        k = kernels()
        config = prepared.config
        prepared.on_current_stream()
        bits = struct.unpack("<Q", struct.pack("<d", max_norm))[0]  # max_norm >= 0: sign bit clear
        with _on(prepared.device):
            for t in prepared.tables:
                launch = scale_launch(config, t.dtype, norm.dtype, t.aligned)
                k.scale_kernel[(t.grid,)](
                    t.table,
                    t.num_tensors,
                    t.num_chunks,
                    t.chunk,
                    norm,
                    bits >> 32,
                    bits & 0xFFFFFFFF,
                    **launch.constants,
                    **launch.options,
                )


def _on(device: torch.device) -> Any:
    """Launch on ``device``'s current stream (Triton launches on the current device)."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device.index)
    return contextlib.nullcontext()


BACKEND = TritonBackend()
