"""The C++ kernels' machine code read back (``objdump``): the statistics' loops keep their lanes in registers.

A 256- or 512-bit store inside an innermost loop of the statistics' pass is a lane
that lives in memory: each block stores it and the next loads it back, a chain
through memory that the out-of-order core cannot hide. It happened where the
bfloat16 word loop (``isa_avx2.h`` ``sum_bf16``) reached its visitor through a
reference, which every ``__m256i`` load of the gradients may alias, and held
the statistics at 1.2-1.35x the norm's time on AMD Zen 3. The bits are the same
either way, so only the code shows it. Spills to the stack are the compiler's
choice and are allowed; a store through any other register is not.

Skips where the extension is not built for x86-64 or ``objdump`` is missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fastnorm.backends import cpp

_FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")
_INSTRUCTION = re.compile(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$")
_BACKWARD = re.compile(r"^([0-9a-f]+) <")
_VECTOR_STORE = re.compile(r"^%[yz]mm\d+,.*\((%r\w+)")
_STACK = ("%rsp", "%rbp")
# The statistics' pass of each x86 target, and the bfloat16 word loop it calls with its Counter.
_VISITED = re.compile(r"fastnorm::avx(2|512)::(stats_piece\(|sum_bf16<\d, fastnorm::\w+::Counter<)")


def _disassembly(
    functions_of: re.Pattern = _VISITED, what: str = "statistics' loops"
) -> dict[str, list[tuple[int, str, str]]]:
    """The instructions ``(address, op, args)`` of each function of the extension whose name matches."""
    if cpp._C is None:
        pytest.skip("the extension fastnorm._C is not built")
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump is not installed")
    so = Path(cpp._C.__file__)
    text = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", "-C", str(so)], capture_output=True, text=True, check=True
    ).stdout
    functions: dict[str, list[tuple[int, str, str]]] = {}
    current: list[tuple[int, str, str]] | None = None
    for line in text.splitlines():
        if m := _FUNCTION.match(line):
            current = functions.setdefault(m.group(1), []) if functions_of.search(m.group(1)) else None
        elif current is not None and (m := _INSTRUCTION.match(line)):
            current.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if not functions:
        pytest.skip(f"no x86 {what} in this build")
    return functions


def all_loops(code: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """The address ranges [target, jump] of backward jumps."""
    return [
        (int(m.group(1), 16), address)
        for address, op, args in code
        if op.startswith("j") and (m := _BACKWARD.match(args)) and int(m.group(1), 16) <= address
    ]


def innermost_loops(code: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """The address ranges [target, jump] of backward jumps that hold no other such range."""
    loops = all_loops(code)
    return [a for a in loops if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in loops)]


def stores_in_loops(code: list[tuple[int, str, str]]) -> list[str]:
    """The vector stores through a register other than the stack's inside an innermost loop."""
    loops = innermost_loops(code)
    found = []
    for address, op, args in code:
        store = _VECTOR_STORE.match(args) if op.startswith("vmov") else None
        if store and store.group(1) not in _STACK and any(lo <= address <= hi for lo, hi in loops):
            found.append(f"{address:x}: {op} {args}")
    return found


def test_the_loop_reader_finds_a_store_in_a_loop():
    code = [
        (0x10, "vpmaxsw", "0x20(%r14),%ymm2,%ymm3"),
        (0x16, "vmovdqa", "%ymm3,0x20(%r14)"),
        (0x1C, "vmovdqa", "%ymm3,0x40(%rsp)"),
        (0x22, "jl", "10 <f+0x10>"),
        (0x28, "vmovdqa", "%ymm3,0x20(%rax)"),  # after the loop: the lanes handed back
    ]
    assert stores_in_loops(code) == ["16: vmovdqa %ymm3,0x20(%r14)"]


def test_the_statistics_loops_keep_their_lanes_in_registers():
    functions = _disassembly()
    assert any("sum_bf16" in name for name in functions), sorted(functions)
    found = {name: s for name, code in functions.items() if (s := stores_in_loops(code))}
    assert not found, found


_COUNTS = re.compile(r"fastnorm::avx(2|512)::count_bits<fastnorm::(F32|BF16)>")


def test_the_count_loops_ask_for_their_lines_ahead():
    # The locator's counts (``_C.count_stats``) read tensors once, from memory: without a software
    # prefetch the AVX2 loop read 13.3-13.8 GB/s against 17.7-18.3 for a plain torch.sum on Zen 3.
    for name, code in _disassembly(_COUNTS, "count loops").items():
        # The compiler may version the loop at the prefetch's stop: a prefetch inside any loop will do.
        prefetches = [address for address, op, _ in code if op.startswith("prefetch")]
        assert any(lo <= a <= hi for a in prefetches for lo, hi in all_loops(code)), name
