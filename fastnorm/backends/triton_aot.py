"""The triton backend's kernels compiled ahead of time, and their machine code read back.

Every specialization the backend launches (``triton_backend.launches``: each
dtype, mode and alignment of the norm and scale kernels, the per-tensor and
finalize kernels, with the launch geometry used at run time) is compiled ahead
of time for a GPU architecture with ``triton.compile(..., target=GPUTarget)``,
which needs no GPU, and the machine code is read back: for NVIDIA the SASS and
resource usage from the ``cuobjdump`` that the Triton wheel ships, for AMD the
assembly Triton emits. ``fastnorm kernels`` prints the result.

Per kernel and target: registers, spills, shared memory, how many programs fit
on one SM (from registers, shared memory and threads), and in the **main loop**
(the innermost loop that loads the most bits per iteration; for the norm and
scale kernels, the unmasked loop over whole runs that ordinary data takes):
the widths of its global loads and stores, its FP64 instructions per element
loaded and its instructions per element.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from fastnorm.checks import InputError, number_argument

DEFAULT_TARGETS = ("sm_80", "sm_89", "sm_90", "sm_100")
AMD_TARGETS = ("gfx90a", "gfx942")

# Per SM: (maximum resident threads, shared memory in bytes, maximum resident programs).
# From NVIDIA's CUDA C++ Programming Guide, "Compute capabilities", and AMD's CDNA2/CDNA3
# ISA guides (a CU of 4 SIMDs, 64 KiB of LDS, 8 waves per SIMD on gfx90a and gfx942).
_SM_LIMITS = {
    80: (2048, 164 * 1024, 32),
    86: (1536, 100 * 1024, 16),
    89: (1536, 100 * 1024, 24),
    90: (2048, 228 * 1024, 32),
    100: (2048, 228 * 1024, 32),
    120: (1536, 100 * 1024, 32),
}
_REGISTERS_PER_SM = 65536
_AMD_VGPRS_PER_LANE = 512  # per SIMD lane, arch VGPRs and AGPRs together (gfx90a, gfx942)
_AMD_WAVES_PER_SIMD = 8

# Types of the kernels' runtime arguments as the backend passes them: int64 tables,
# float64 partials, p as a float32, counts that fit an int32. Float pointers whose
# dtype depends on the call come from Launch.pointers.
_ARGUMENT_TYPES = {
    "table_ptr": "*i64",
    "num_tensors": "i32",
    "num_chunks": "i32",
    "chunk": "i32",
    "num_partials": "i32",
    "partial_ptr": "*fp64",
    "chunk_partial_ptr": "*fp64",
    "stats_ptr": "*fp64",
    "out_ptr": "*fp64",
    "p": "fp32",
    "per_chunk": "i32",
    "max_norm_hi": "i32",
    "max_norm_lo": "i32",
}
# Slices of the shared table start anywhere; every other buffer is a fresh torch
# allocation or a 16-byte row of one, which Triton marks 16-byte divisible, as
# it marks ``chunk`` (whole steps of the main loop).
_UNALIGNED_POINTERS = ("table_ptr",)
_DIVISIBLE_INTEGERS = ("chunk",)


@dataclass
class KernelReport:
    """One compiled specialization on one target (a row of ``fastnorm kernels``)."""

    kernel: str
    dtype: str | None  # the gradients' dtype; None for kernels that read partials only
    mode: str | None  # L2, L1, LINF or LP; None for the scale kernel
    variant: str  # aligned (hinted 16-byte alignment), general, or a result/norm dtype
    target: str
    registers: int | None = None
    spills: int | None = None  # spill instructions (SASS STL/LDL; AMD spill counts)
    stack: int | None = None  # bytes of local memory per thread
    shared: int | None = None  # bytes of shared memory per program
    programs_per_sm: int | None = None  # resident programs per SM (per CU on AMD)
    load_bits: list[int] = field(default_factory=list)  # distinct global load widths in the main loop
    store_bits: list[int] = field(default_factory=list)
    elements_per_iteration: float | None = None  # per thread, loaded by one main-loop iteration
    fp64_per_element: float | None = None
    instructions_per_element: float | None = None
    error: str | None = None


def parse_target(name: str) -> Any:
    """``sm_90`` -> GPUTarget("cuda", 90, 32); ``gfx942`` -> GPUTarget("hip", "gfx942", 64)."""
    from triton.backends.compiler import GPUTarget

    match = re.fullmatch(r"sm_(\d+)a?", name)
    if match:
        return GPUTarget("cuda", int(match.group(1)), 32)
    if re.fullmatch(r"gfx[0-9a-f]+", name):
        return GPUTarget("hip", name, 64)
    raise ValueError(f"target {name!r} is neither sm_<NN> (NVIDIA) nor gfx<ID> (AMD)")


def _config_for(target: Any) -> Any:
    from fastnorm.backends import triton_backend

    return triton_backend.ROCM_CONFIG if target.backend == "hip" else triton_backend.GPU_CONFIG


def _describe(launch: Any) -> tuple[str | None, str | None, str]:
    from fastnorm._partial import Mode

    dtype = str(launch.dtype).replace("torch.", "") if launch.dtype is not None else None
    mode = Mode(launch.constants["MODE"]).name if "MODE" in launch.constants else None
    if "ALIGNED" in launch.constants:
        variant = "aligned" if launch.constants["ALIGNED"] else "general"
        if launch.kernel == "scale_kernel":
            variant += "/norm " + str(launch.pointers["norm_ptr"]).replace("torch.", "")
    elif launch.pointers:
        variant = "result " + str(next(iter(launch.pointers.values()))).replace("torch.", "")
    else:
        variant = "-"
    return dtype, mode, variant


def _pointer_type(dtype: Any) -> str:
    import torch

    return {torch.float32: "*fp32", torch.float64: "*fp64"}[dtype]


def compile_launch(launch: Any, target: Any) -> Any:
    """``launch`` compiled for ``target`` by Triton, as the JIT would at the first call."""
    import triton
    from triton.compiler import ASTSource

    from fastnorm.backends import triton_backend

    fn = getattr(triton_backend.kernels(), launch.kernel)
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in launch.constants:
            signature[name] = "constexpr"
            continue
        kind = _pointer_type(launch.pointers[name]) if name in launch.pointers else _ARGUMENT_TYPES[name]
        signature[name] = kind
        if (kind.startswith("*") and name not in _UNALIGNED_POINTERS) or name in _DIVISIBLE_INTEGERS:
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, launch.constants, attrs)
    return triton.compile(source, target=target, options=launch.options)


# ----------------------------------------------------------------------------
# Reading the machine code
# ----------------------------------------------------------------------------


@dataclass
class _Instruction:
    address: int
    opcode: str  # with its modifiers, e.g. LDG.E.128 or global_load_dwordx4
    operands: str


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_SASS_BRANCH = re.compile(r"^0x([0-9a-f]+)")
_SASS_FP64 = {"DADD", "DMUL", "DFMA", "DMNMX", "DSETP", "DSET", "DMMA"}
_SASS_CONVERSIONS = {"F2F", "F2I", "I2F", "FRND"}


def _sass_width(opcode: str) -> int:
    for part in opcode.split(".")[1:]:
        if part in ("U8", "S8"):
            return 8
        if part in ("U16", "S16"):
            return 16
        if part in ("64", "128", "256"):
            return int(part)
    return 32


def _sass_is_fp64(opcode: str) -> bool:
    base, *mods = opcode.split(".")
    if base in _SASS_FP64:
        return True
    if base == "MUFU":
        return any(m.endswith("64H") for m in mods)
    return base in _SASS_CONVERSIONS and "F64" in mods


def _parse_sass(text: str) -> tuple[list[_Instruction], list[tuple[int, int]]]:
    """Instructions and loops ``(first, last)`` address ranges (backward branches)."""
    code, loops = [], []
    for line in text.splitlines():
        match = _SASS_LINE.search(line)
        if not match:
            continue
        address = int(match.group(1), 16)
        code.append(_Instruction(address, match.group(2), match.group(3).strip()))
        if match.group(2).split(".")[0] == "BRA":
            target = _SASS_BRANCH.match(match.group(3).strip().split(",")[-1].strip())
            if target and int(target.group(1), 16) <= address:
                loops.append((int(target.group(1), 16), address))
    return code, loops


_AMD_LABEL = re.compile(r"^(\.?L\w+):")
_AMD_INSTRUCTION = re.compile(r"^\s+([a-z][a-z0-9_]*)\s*(.*?)\s*(?:;.*)?$")
_AMD_WIDTHS = {"ubyte": 8, "sbyte": 8, "ushort": 16, "sshort": 16, "short": 16, "byte": 8}


def _amd_width(opcode: str) -> int:
    suffix = opcode.split("_", 2)[-1]
    match = re.match(r"dwordx(\d)", suffix)
    if match:
        return 32 * int(match.group(1))
    if suffix.startswith("dword"):
        return 32
    for name, bits in _AMD_WIDTHS.items():
        if suffix.startswith(name):
            return bits
    return 32


def _parse_amdgcn(text: str) -> tuple[list[_Instruction], list[tuple[int, int]]]:
    code, labels, branches = [], {}, []
    for line in text.splitlines():
        label = _AMD_LABEL.match(line)
        if label:
            labels[label.group(1)] = len(code)
            continue
        match = _AMD_INSTRUCTION.match(line)
        if not match or match.group(1).startswith("."):
            continue
        opcode, operands = match.group(1), match.group(2)
        if opcode.startswith("s_branch") or opcode.startswith("s_cbranch"):
            branches.append((len(code), operands.split(",")[0].strip()))
        code.append(_Instruction(len(code), opcode, operands))
    loops = [(labels[t], at) for at, t in branches if t in labels and labels[t] <= at]
    return code, loops


def _is_load(opcode: str, amd: bool) -> bool:
    if amd:
        return opcode.startswith(("global_load", "buffer_load"))
    return opcode.startswith("LDG")


def _is_store(opcode: str, amd: bool) -> bool:
    if amd:
        return opcode.startswith(("global_store", "buffer_store"))
    return opcode.startswith("STG")


def _main_loop(code: list[_Instruction], loops: list[tuple[int, int]], amd: bool) -> list[_Instruction]:
    """The body of the innermost loop that loads the most bits per iteration (the first such)."""
    width = _amd_width if amd else _sass_width
    innermost = [
        (a, b) for a, b in loops if not any((a, b) != (c, d) and a <= c and d <= b for c, d in loops)
    ]
    best: list[_Instruction] = []
    best_bits = 0
    for a, b in sorted(set(innermost)):
        body = [i for i in code if a <= i.address <= b]
        bits = sum(width(i.opcode) for i in body if _is_load(i.opcode, amd))
        if bits > best_bits:
            best, best_bits = body, bits
    return best


def _element_bits(report: KernelReport) -> int:
    return {"float32": 32, "float64": 64, "float16": 16, "bfloat16": 16}.get(report.dtype or "", 64)


def _read_loop(report: KernelReport, body: list[_Instruction], amd: bool) -> None:
    width = _amd_width if amd else _sass_width
    loads = [width(i.opcode) for i in body if _is_load(i.opcode, amd)]
    stores = [width(i.opcode) for i in body if _is_store(i.opcode, amd)]
    report.load_bits = sorted(set(loads))
    report.store_bits = sorted(set(stores))
    if not loads:
        return
    elements = sum(loads) / _element_bits(report)
    fp64 = sum(1 for i in body if ("f64" in i.opcode if amd else _sass_is_fp64(i.opcode)))
    report.elements_per_iteration = elements
    report.fp64_per_element = round(fp64 / elements, 4)
    report.instructions_per_element = round(len(body) / elements, 3)


def _nvidia_tool(name: str) -> str:
    from triton import knobs

    return getattr(knobs.nvidia, name).path


def _read_nvidia(report: KernelReport, compiled: Any, target: Any, threads: int, sass: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        tool = _nvidia_tool("cuobjdump")
        usage = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=True).stdout
        match = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", usage)
        if not match:
            raise RuntimeError(f"cuobjdump -res-usage printed no resource line:\n{usage}")
        registers, stack, shared, local = (int(g) for g in match.groups())
        report.registers, report.stack = registers, stack + local
        report.shared = max(shared, compiled.metadata.shared)
        # Spilled registers live in local memory: without any, there is nothing to count.
        report.spills = 0
        if sass or report.stack:
            text = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
            code, loops = _parse_sass(text)
            if not code:
                raise RuntimeError("cuobjdump -sass printed no instructions")
            report.spills = sum(1 for i in code if i.opcode.startswith(("STL", "LDL")))
            if sass:
                _read_loop(report, _main_loop(code, loops, amd=False), amd=False)
    max_threads, smem, max_programs = _SM_LIMITS.get(target.arch, _SM_LIMITS[90])
    per_warp = -(-registers // 8) * 8 * 32  # registers are allocated per warp, 8 per thread at a time
    by_registers = _REGISTERS_PER_SM // (per_warp * (threads // 32))
    by_shared = smem // report.shared if report.shared else max_programs
    report.programs_per_sm = min(by_registers, max_threads // threads, by_shared, max_programs)


def _read_amd(report: KernelReport, compiled: Any, threads: int) -> None:
    asm = compiled.asm["amdgcn"]

    def field_of(name: str) -> int:
        match = re.search(rf"\.{name}:\s+(\d+)", asm)
        if not match:
            raise RuntimeError(f"no .{name} in the AMD assembly")
        return int(match.group(1))

    report.registers = field_of("vgpr_count")
    report.spills = field_of("vgpr_spill_count") + field_of("sgpr_spill_count")
    report.stack = field_of("private_segment_fixed_size")
    report.shared = max(field_of("group_segment_fixed_size"), compiled.metadata.shared)
    waves = max(1, threads // 64)
    per_simd = min(_AMD_WAVES_PER_SIMD, _AMD_VGPRS_PER_LANE // max(8, -(-report.registers // 8) * 8))
    by_shared = (64 * 1024) // report.shared if report.shared else 32
    report.programs_per_sm = min(per_simd * 4 // waves, by_shared)
    code, loops = _parse_amdgcn(asm)
    _read_loop(report, _main_loop(code, loops, amd=True), amd=True)


SASS_CHOICES = ("all", "aligned", "general", "none")


def _wants_sass(launch: Any, sass: str) -> bool:
    """aligned: the kernels launched with ALIGNED set; general: those with it cleared."""
    if sass in ("aligned", "general"):
        return "ALIGNED" in launch.constants and bool(launch.constants["ALIGNED"]) == (sass == "aligned")
    return sass == "all"


def analyze(launch: Any, target_name: str, sass: str = "all") -> KernelReport:
    """Compiles ``launch`` for ``target_name`` and reads what came out; errors land in the row.

    ``sass`` (one of SASS_CHOICES) says which kernels' main loop to read on NVIDIA
    targets (disassembling costs about as much as compiling); registers, spills
    and shared memory are read for every kernel.
    """
    dtype, mode, variant = _describe(launch)
    report = KernelReport(launch.kernel, dtype, mode, variant, target_name)
    try:
        target = parse_target(target_name)
        compiled = compile_launch(launch, target)
        threads = launch.options["num_warps"] * target.warp_size
        if target.backend == "hip":
            _read_amd(report, compiled, threads)
        else:
            _read_nvidia(report, compiled, target, threads, _wants_sass(launch, sass))
    except Exception as exc:  # one failing target or kernel must not stop the others
        report.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return report


def _use_compiler() -> None:
    """Makes the kernels compile (not interpret) in this process and its children."""
    module = sys.modules.get("fastnorm.backends.triton_kernels")
    if module is not None and module.INTERPRETED:
        raise RuntimeError(
            "the Triton kernels were imported for the interpreter (TRITON_INTERPRET=1) in this "
            "process; run `fastnorm kernels` in a process without TRITON_INTERPRET"
        )
    os.environ["TRITON_INTERPRET"] = "0"


def _shard(target_name: str, indices: list[int], sass: str) -> list[dict[str, Any]]:
    """Rows for the launches at ``indices`` of one target, compiled in this process."""
    _use_compiler()
    from fastnorm.backends import triton_backend

    launches = triton_backend.launches(_config_for(parse_target(target_name)))
    return [asdict(analyze(launches[i], target_name, sass)) for i in indices]


def _run_shard(target_name: str, launches: list[Any], indices: list[int], sass: str) -> list[KernelReport]:
    """_shard in a child process: a compiler that aborts (LLVM does, on a target it
    cannot handle) fails that shard's rows, not the whole report."""
    with tempfile.TemporaryDirectory() as tmp:
        job, out = os.path.join(tmp, "job.json"), os.path.join(tmp, "rows.json")
        with open(job, "w") as f:
            json.dump({"target": target_name, "indices": indices, "sass": sass}, f)
        result = subprocess.run(
            [sys.executable, "-m", "fastnorm.backends.triton_aot", job, out],
            capture_output=True,
            text=True,
            env={**os.environ, "TRITON_INTERPRET": "0"},
            check=False,
        )
        if result.returncode == 0:
            with open(out) as f:
                return [KernelReport(**row) for row in json.load(f)]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    reason = f"the compiler process ended with code {result.returncode}: {lines[-1] if lines else ''}"
    return [
        KernelReport(launches[i].kernel, *_describe(launches[i]), target_name, error=reason) for i in indices
    ]


def report(
    targets: Sequence[str] = DEFAULT_TARGETS, jobs: int = 1, kernel: str | None = None, sass: str = "all"
) -> list[KernelReport]:
    """Compiles every launched specialization for every target; one row each, in order.

    Args:
        targets: architectures, ``sm_<NN>`` or ``gfx<ID>``.
        jobs: compiler processes to run at once.
        kernel: only the kernels whose name contains this.
        sass: which kernels' main loop to read on NVIDIA targets: all, aligned
            (the ALIGNED norm and scale kernels), general (their variants for
            addresses of any alignment) or none.

    Returns:
        list[KernelReport]: rows by target, then in ``triton_backend.launches`` order.
        A target that cannot be compiled here gives rows with ``error`` set.

    Raises:
        InputError: ``kernel`` is in no kernel's name (the message lists the names).
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if sass not in SASS_CHOICES:
        raise ValueError(f"sass must be one of {', '.join(SASS_CHOICES)}, got {sass!r}")
    _use_compiler()
    from fastnorm.backends import triton_backend

    shards = []
    names: set[str] = set()
    by_target: dict[str, list[tuple[int, KernelReport]]] = {name: [] for name in targets}
    for name in targets:
        try:
            launches = triton_backend.launches(_config_for(parse_target(name)))
        except ValueError as exc:
            by_target[name].append((0, KernelReport("*", None, None, "-", name, error=str(exc))))
            continue
        names.update(launch.kernel for launch in launches)
        chosen = [i for i, launch in enumerate(launches) if kernel is None or kernel in launch.kernel]
        shards += [(name, launches, chosen[j::jobs], sass) for j in range(min(jobs, len(chosen)))]
    if kernel is not None and names and not any(kernel in name for name in names):
        raise InputError(f"--kernel {kernel}: in no kernel's name; the kernels: {', '.join(sorted(names))}")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(lambda shard: _run_shard(*shard), shards))
    for (name, _, indices, _), rows in zip(shards, done):
        by_target[name] += zip(indices, rows)
    return [row for name in by_target for _, row in sorted(by_target[name], key=lambda pair: pair[0])]


# ----------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


_COLUMNS = [
    ("target", "target"),
    ("kernel", "kernel"),
    ("dtype", "dtype"),
    ("mode", "mode"),
    ("variant", "variant"),
    ("registers", "regs"),
    ("spills", "spills"),
    ("shared", "smem"),
    ("programs_per_sm", "progs/SM"),
    ("load_bits", "load bits"),
    ("store_bits", "store bits"),
    ("fp64_per_element", "fp64/elem"),
    ("instructions_per_element", "instr/elem"),
]


def format_table(rows: list[KernelReport]) -> str:
    """The rows as an aligned text table; failed rows as one line each."""
    table = [[title for _, title in _COLUMNS]]
    failures = []
    for row in rows:
        if row.error:
            failures.append(
                f"{row.target} {row.kernel} {row.dtype or ''} {row.mode or ''} {row.variant}: "
                f"FAILED: {row.error}"
            )
            continue
        table.append([_cell(getattr(row, key)) for key, _ in _COLUMNS])
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]
    return "\n".join(lines + failures)


def summary(rows: list[KernelReport]) -> str:
    """One line: how many specializations compiled for which targets, how many failed or spill."""
    targets = list(dict.fromkeys(row.target for row in rows))
    compiled = [row for row in rows if not row.error]
    failed = len(rows) - len(compiled)
    spilling = sum(1 for row in compiled if row.spills)
    spills = "none spills registers" if not spilling else f"{spilling} spill{'s' * (spilling == 1)} registers"
    return (
        f"{len(compiled)} of {len(rows)} kernel specializations compiled for {', '.join(targets)}; "
        f"{failed or 'none'} failed; {spills}"
    )


def _run(args: argparse.Namespace) -> int:
    targets = [t.strip() for group in (args.target or [",".join(DEFAULT_TARGETS)]) for t in group.split(",")]
    rows = report([t for t in targets if t], jobs=args.jobs, kernel=args.kernel, sass=args.sass)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        print(format_table(rows))
        print(summary(rows))
    return 1 if any(r.error for r in rows) else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declares the arguments of ``fastnorm kernels``."""
    parser.description = (
        "Compiles every specialization the triton backend launches for GPU architectures, without a GPU, "
        "and reads its machine code back: registers, spills, shared memory, programs per SM, and in the "
        "main loop the widths of its loads and stores, FP64 instructions and instructions per element. "
        "Ends with a summary line; exits with 1 when a specialization failed to compile, 2 for a bad "
        "argument (a --kernel in no kernel's name)."
    )
    parser.add_argument(
        "--target",
        action="extend",
        nargs="+",
        help=f"sm_<NN> or gfx<ID>, several or comma-separated (default: {' '.join(DEFAULT_TARGETS)})",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows (no summary line)")
    parser.add_argument(
        "--jobs",
        type=number_argument(1, integer=True),
        default=1,
        help="compiler processes at once (default: 1)",
    )
    parser.add_argument("--kernel", help="only kernels whose name contains this")
    parser.add_argument(
        "--sass",
        choices=SASS_CHOICES,
        default="all",
        help="whose main loop to read from SASS (default: all; aligned: the ALIGNED norm and scale kernels; "
        "general: their variants for any alignment)",
    )
    parser.set_defaults(func=_run)


if __name__ == "__main__":  # a compiler process of report(): python -m fastnorm.backends.triton_aot JOB OUT
    with open(sys.argv[1]) as f:
        job = json.load(f)
    rows = _shard(job["target"], job["indices"], job["sass"])
    with open(sys.argv[2], "w") as f:
        json.dump(rows, f)
