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
from dataclasses import dataclass, field
from typing import Any

import torch

from fastnorm.backends import Mode

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


@dataclass(frozen=True)
class Config:
    """Tile sizes; the interpreter gets small ones so tests cover many chunks quickly."""

    block: int
    chunk: int
    num_warps: int
    programs_per_sm: int


GPU_CONFIG = Config(block=2048, chunk=65536, num_warps=8, programs_per_sm=4)
INTERPRETER_CONFIG = Config(block=128, chunk=512, num_warps=1, programs_per_sm=1)
INTERPRETER_PROGRAMS = 4
REDUCE_BLOCK = 256  # rows of partials per step of the finalize/per-tensor reductions

_SM_COUNT: dict[int, int] = {}


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

    dtype: Any  # a triton.language dtype
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


class TritonBackend:
    name = "triton"

    def not_supported_reasons(self, device: torch.device) -> list[str]:
        reasons = []
        if not _TRITON_FOUND:
            reasons.append("triton is not installed (pip install 'fastnorm[triton]')")
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
                mode = "interpreted" if interpreted else "compiled"
                reasons.append(
                    f"the kernels were loaded {mode} (TRITON_INTERPRET changed after the first use)"
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
        config = INTERPRETER_CONFIG if device.type == "cpu" else GPU_CONFIG
        tl_dtypes = kernels().TL_DTYPES
        positions: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(tensors):
            positions.setdefault(t.dtype, []).append(i)
        max_programs = _max_programs(device, config)
        parts, layout = [], []
        offset = partial_offset = chunk_offset = tensor_offset = 0
        for dtype, where in positions.items():
            group = [tensors[i] for i in where]
            part, num_chunks = _table([t.data_ptr() for t in group], [t.numel() for t in group], config.chunk)
            grid = min(num_chunks, max_programs)
            parts.append(part)
            layout.append(
                (
                    tl_dtypes[dtype],
                    offset,
                    part.numel(),
                    len(group),
                    num_chunks,
                    grid,
                    partial_offset,
                    chunk_offset,
                    tensor_offset,
                )
            )
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
        tables = [
            DtypeTable(dt, table[start : start + size], n, chunks, grid, row, chunk_row, tensor_row)
            for dt, start, size, n, chunks, grid, row, chunk_row, tensor_row in layout
        ]
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
                k.norm_partials_kernel[(t.grid,)](
                    t.table,
                    t.num_tensors,
                    t.num_chunks,
                    partials[t.partial_offset :],
                    chunks[t.chunk_offset :] if per_tensor else partials,
                    float(p),
                    DTYPE=t.dtype,
                    MODE=int(mode),
                    CHUNK=config.chunk,
                    BLOCK=config.block,
                    PER_CHUNK=per_tensor,
                    num_warps=config.num_warps,
                )
                if per_tensor:
                    k.per_tensor_kernel[(t.num_tensors,)](
                        t.table,
                        t.num_tensors,
                        chunks[t.chunk_offset :],
                        tensors[t.tensor_offset :],
                        float(p),
                        MODE=int(mode),
                        BLOCK=REDUCE_BLOCK,
                        num_warps=1,
                    )
            k.finalize_kernel[(1,)](
                partials,
                prepared.num_partials,
                out,
                root,
                float(p),
                MODE=int(mode),
                BLOCK=REDUCE_BLOCK,
                num_warps=4,
            )
        if tensors is not None and prepared.order is not None:
            tensors = tensors[prepared.order]
        return out, root, tensors

    def scale_(self, prepared: Prepared, norm: torch.Tensor, max_norm: float) -> None:
        k = kernels()
        config = prepared.config
        prepared.on_current_stream()
        bits = struct.unpack("<Q", struct.pack("<d", max_norm))[0]  # max_norm >= 0: sign bit clear
        with _on(prepared.device):
            for t in prepared.tables:
                k.scale_kernel[(t.grid,)](
                    t.table,
                    t.num_tensors,
                    t.num_chunks,
                    norm,
                    bits >> 32,
                    bits & 0xFFFFFFFF,
                    DTYPE=t.dtype,
                    NORM_IS_F64=norm.dtype == torch.float64,
                    CHUNK=config.chunk,
                    BLOCK=config.block,
                    num_warps=config.num_warps,
                )


def _on(device: torch.device) -> Any:
    """Launch on ``device``'s current stream (Triton launches on the current device)."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device.index)
    return contextlib.nullcontext()


BACKEND = TritonBackend()
