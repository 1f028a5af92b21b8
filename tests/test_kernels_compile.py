"""The Triton kernels compiled for real GPUs on a machine without one (``fastnorm kernels``).

Every specialization the backend launches is compiled ahead of time for
sm_80, sm_89, sm_90 and sm_100 and read back from SASS: it compiles, nothing
spills, the grid it is launched with fits on the GPU at once, the ALIGNED norm
and scale kernels read float32/bfloat16/float16 with 128-bit loads only in
their main loop, and the L2 norm kernels stay within a quarter of a float64
instruction per element.

Compiling takes minutes of CPU, so each compile the tests read runs once, in
child processes started one after another from when this module is imported
(at collection), at a low priority: the suite's other tests run meanwhile, and
the children take the cycles they leave idle. The conftest runs this module
last, so that the children have the whole suite to finish in.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from fastnorm.backends import triton_aot
from helpers import run_python

pytest.importorskip("triton")

TARGETS = ("sm_80", "sm_89", "sm_90", "sm_100")
NARROW = ("float32", "bfloat16", "float16")
CHILD_NICENESS = 10  # below the tests in the foreground, which are the suite's critical path

KERNELS = ["-m", "fastnorm", "kernels"]
# The compiles the tests read, in the order they run in one background thread, one child at a time.
JOBS = {
    "aligned": [*KERNELS, "--json", "--sass", "aligned", "--target", *TARGETS],
    # the general kernels' main loops alone, on one target
    "general": [*KERNELS, "--json", "--target", "sm_90", "--kernel", "scale", "--sass", "general"],
    "amd": [*KERNELS, "--json", "--target", "gfx942", "--kernel", "scale"],
    # the rows come from the compiler and the resource usage: no SASS needed
    "failing": [*KERNELS, "--target", "sm_90,sm_1,gfx_bad", "--kernel", "finalize", "--sass", "none"],
    "nomatch": [*KERNELS, "--target", "sm_90", "--kernel", "nomatch"],
}


class Background:
    """Runs JOBS one after another in child processes at a low priority, from import on."""

    def __init__(self, jobs: dict[str, list[str]]) -> None:
        self.jobs = jobs
        self.results: dict[str, subprocess.CompletedProcess] = {}
        self.done = {name: threading.Event() for name in jobs}
        self.child: subprocess.Popen | None = None
        self.stopped = False
        threading.Thread(target=self._run, daemon=True).start()
        atexit.register(self.stop)

    def _run(self) -> None:
        for name, args in self.jobs.items():
            if self.stopped:
                break
            self.child = subprocess.Popen(
                [sys.executable, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "TRITON_INTERPRET": "0"},
                cwd=os.path.dirname(os.path.abspath(__file__)),  # import the installed package, not the tree
                preexec_fn=(lambda: os.nice(CHILD_NICENESS)) if hasattr(os, "nice") else None,
            )
            out, err = self.child.communicate()
            self.results[name] = subprocess.CompletedProcess(args, self.child.returncode, out, err)
            self.done[name].set()

    def result(self, name: str) -> subprocess.CompletedProcess:
        assert self.done[name].wait(timeout=900), f"{name}: still compiling after 15 minutes"
        return self.results[name]

    def stop(self) -> None:
        self.stopped = True
        if self.child is not None and self.child.poll() is None:
            self.child.kill()


BACKGROUND = Background(JOBS)


@pytest.fixture(scope="module")
def rows():
    result = BACKGROUND.result("aligned")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def launched():
    """(kernel, dtype, mode, variant) of every specialization, as the report names them."""
    script = textwrap.dedent(
        """
        import json
        from fastnorm.backends import triton_aot
        from fastnorm.backends import triton_backend
        print(json.dumps([(l.kernel, *triton_aot._describe(l)) for l in triton_backend.launches()]))
        """
    )
    result = run_python(["-c", script], TRITON_INTERPRET="0")
    assert result.returncode == 0, result.stderr
    return sorted(tuple(x) for x in json.loads(result.stdout))


def norm_and_scale(rows, target, variant="aligned"):
    return [
        r
        for r in rows
        if r["target"] == target
        and r["kernel"] in ("norm_partials_kernel", "scale_kernel")
        and r["variant"].startswith(variant)
    ]


def test_every_launched_kernel_compiles_for_every_target(rows):
    expected = launched()
    assert len(expected) > 50
    for target in TARGETS:
        mine = [r for r in rows if r["target"] == target]
        assert [r for r in mine if r["error"]] == []
        assert sorted((r["kernel"], r["dtype"], r["mode"], r["variant"]) for r in mine) == expected


def test_nothing_spills_and_the_grid_is_resident(rows):
    from fastnorm.backends.triton_backend import GPU_CONFIG

    for r in rows:
        assert r["spills"] == 0 and r["stack"] == 0, r
        if r["kernel"] in ("norm_partials_kernel", "scale_kernel"):
            # the grid is programs_per_sm programs per SM: all of them run at once
            assert r["programs_per_sm"] >= GPU_CONFIG.programs_per_sm, r


@pytest.mark.parametrize("target", TARGETS)
def test_aligned_16_and_32_bit_gradients_are_read_with_128_bit_loads(rows, target):
    checked = [r for r in norm_and_scale(rows, target) if r["dtype"] in NARROW]
    assert len(checked) == 3 * (4 + 2)  # four modes of the norm kernel, two norm dtypes of the scale kernel
    for r in checked:
        assert r["load_bits"] == [128], r
        # a step of LP (a log2 and an exp2 per element) reads 8 elements per thread, the others 16 to 32
        assert r["elements_per_iteration"] >= (8 if r["mode"] == "LP" else 16), r
        if r["kernel"] == "scale_kernel":
            assert r["store_bits"] == [128], r


@pytest.mark.parametrize("target", TARGETS)
def test_l2_sums_stay_within_a_quarter_fp64_instruction_per_element(rows, target):
    l2 = [r for r in norm_and_scale(rows, target) if r["mode"] == "L2" and r["dtype"] in NARROW]
    assert len(l2) == 3
    for r in l2:
        assert 0 < r["fp64_per_element"] <= 0.25, r  # > 0: the runs are carried in float64


def test_general_kernels_read_one_element_per_load_and_say_so():
    # The main loop of a general kernel (addresses of any alignment) loads
    # single elements: a quick compile of one of them on one target.
    result = BACKGROUND.result("general")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert all(r["load_bits"] == [] for r in rows if r["variant"].startswith("aligned"))  # not read
    general = [r for r in rows if r["variant"].startswith("general")]
    assert {r["dtype"]: r["load_bits"] for r in general} == {
        "float32": [32],
        "bfloat16": [16],
        "float16": [16],
        "float64": [64],
    }


def test_amd_targets_compile_with_128_bit_loads():
    result = BACKGROUND.result("amd")
    assert result.returncode == 0, result.stderr
    aligned = [r for r in json.loads(result.stdout) if r["variant"].startswith("aligned")]
    assert len(aligned) == 7 and all(r["load_bits"] == r["store_bits"] == [128] for r in aligned), aligned
    assert all(r["spills"] == 0 for r in aligned)


def test_a_target_that_cannot_compile_is_reported_and_the_others_carry_on():
    result = BACKGROUND.result("failing")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["target", "kernel", "dtype"]
    assert sum(line.startswith("sm_90 ") and "finalize_kernel" in line for line in lines) == 8
    assert any(line.startswith("sm_1 ") and "FAILED" in line for line in lines)
    assert any(line.startswith("gfx_bad ") and "neither sm_<NN>" in line for line in lines)
    failed = sum("FAILED" in line for line in lines)
    assert lines[-1].startswith(
        f"8 of {8 + failed} kernel specializations compiled for sm_90, sm_1, gfx_bad; "
    )
    assert f"; {failed} failed; none spills registers" in lines[-1]


def test_the_command_refuses_kernels_imported_for_the_interpreter():
    script = "import fastnorm.backends.triton_backend as b, fastnorm.backends.triton_aot as k;"
    script += " b.kernels(); k.report()"
    result = run_python(["-c", script], TRITON_INTERPRET="1")
    assert result.returncode != 0 and "without TRITON_INTERPRET" in result.stderr


# ----------------------------------------------------------------------------
# Reading SASS: the parser on a hand-written loop
# ----------------------------------------------------------------------------

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.64 R2, desc[UR4][R2.64] ;
        /*0020*/                   LDG.E.128 R8, desc[UR4][R4.64] ;
        /*0030*/                   LDG.E.128 R12, desc[UR4][R4.64+0x1000] ;
        /*0040*/                   FFMA R16, R8, R8, R16 ;
        /*0050*/                   F2F.F64.F32 R18, R16 ;
        /*0060*/                   DADD R20, R18, R20 ;
        /*0070*/               @P0 BRA 0x20 ;
        /*0080*/              @!P1 LDG.E.U16 R6, desc[UR4][R4.64] ;
        /*0090*/                   DFMA R20, R6, R6, R20 ;
        /*00a0*/               @P1 BRA 0x80 ;
        /*00b0*/                   STG.E.64 desc[UR4][R2.64], R20 ;
        /*00c0*/                   EXIT ;
"""


def test_main_loop_of_hand_written_sass():
    code, loops = triton_aot._parse_sass(SASS)
    assert len(code) == 13 and loops == [(0x20, 0x70), (0x80, 0xA0)]
    body = triton_aot._main_loop(code, loops, amd=False)  # 256 bits loaded per iteration beat 16
    assert [i.address for i in body] == [0x20, 0x30, 0x40, 0x50, 0x60, 0x70]
    report = triton_aot.KernelReport("k", "float32", "L2", "aligned", "sm_90")
    triton_aot._read_loop(report, body, amd=False)
    assert report.load_bits == [128] and report.store_bits == []
    assert report.elements_per_iteration == 8 and report.fp64_per_element == 0.25


def test_sass_instruction_classes():
    assert [
        triton_aot._sass_width(op) for op in ("LDG.E", "LDG.E.U16", "LDG.E.64", "LDG.E.128.CONSTANT")
    ] == [
        32,
        16,
        64,
        128,
    ]
    fp64 = ("DADD", "DFMA", "DMUL", "DSETP.GT.AND", "F2F.F64.F32", "F2F.F32.F64", "MUFU.RCP64H")
    assert all(triton_aot._sass_is_fp64(op) for op in fp64)
    assert not any(triton_aot._sass_is_fp64(op) for op in ("FADD", "F2F.F16.F32", "DEPBAR.LE", "MUFU.RCP"))


def test_the_summary_line_counts_what_compiled_failed_and_spills():
    def row(target, spills=0, error=None):
        return triton_aot.KernelReport("k", "float32", "L2", "aligned", target, spills=spills, error=error)

    rows = [row("sm_80"), row("sm_80", spills=4), row("sm_90"), row("sm_90", error="LLVM aborted")]
    assert triton_aot.summary(rows) == (
        "3 of 4 kernel specializations compiled for sm_80, sm_90; 1 failed; 1 spills registers"
    )
    assert triton_aot.summary(rows[:1]) == (
        "1 of 1 kernel specializations compiled for sm_80; none failed; none spills registers"
    )


def test_unknown_target_names_are_value_errors():
    assert triton_aot.parse_target("sm_90").arch == 90
    assert triton_aot.parse_target("gfx942").backend == "hip"
    with pytest.raises(ValueError, match="sm_<NN>"):
        triton_aot.parse_target("h100")


def test_a_kernel_filter_that_matches_nothing_exits_2_with_the_names():
    from fastnorm.backends import triton_backend

    result = BACKGROUND.result("nomatch")
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    names = ", ".join(sorted({launch.kernel for launch in triton_backend.launches()}))
    assert result.stderr == (
        f"fastnorm kernels: error: --kernel nomatch: in no kernel's name; the kernels: {names}\n"
    )
