"""The roofline prediction in prediction.md, from the compiled kernels and published GPU figures.

    python benchmarks/results/gpu/predict.py [benchmarks/results/gpu/kernels.json]

reads the rows of ``fastnorm kernels --json`` (per kernel: registers, programs
per SM, elements per thread per step of the main loop, instructions and FP64
instructions per element there) and prints, per kernel, the element rate that
each resource allows on an H200 and the fraction of HBM bandwidth the slowest
of them leaves; then the FP64 budget on GPUs whose FP64 rate is 1/64 of FP32.
No GPU is involved: this is the prediction a device run confirms or refutes.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Gpu:
    name: str
    target: str
    bandwidth: float  # bytes/s, HBM or GDDR, as published
    sms: int
    clock: float  # Hz, boost
    fp64_per_sm_clock: int  # FP64 FMA lanes per SM
    latency: float  # s, a loaded DRAM round trip (assumed; see prediction.md)


# Published figures: NVIDIA H200 datasheet (4.8 TB/s HBM3e, FP64 34 TFLOPS vector,
# 67 with tensor cores) and the Hopper whitepaper (132 SMs, 64 FP64 lanes per SM,
# 1.98 GHz); NVIDIA L40S datasheet (864 GB/s, 142 SMs, 2.52 GHz, FP64 at 1/64 of
# FP32: 2 lanes per SM); RTX 4090 (1008 GB/s, 128 SMs, 2.52 GHz, same SM).
H200 = Gpu("H200 SXM", "sm_90", 4.8e12, 132, 1.98e9, 64, 700e-9)
L40S = Gpu("L40S", "sm_89", 864e9, 142, 2.52e9, 2, 700e-9)
RTX4090 = Gpu("RTX 4090", "sm_89", 1008e9, 128, 2.52e9, 2, 700e-9)

ISSUE_PER_SM_CLOCK = 4 * 32  # four schedulers, one warp instruction each per clock
STREAMING = 0.90  # the best fraction of peak a streaming read reaches (assumed; measured by the bench)
THREADS = 256  # 8 warps per program (triton_backend.GPU_CONFIG)
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def rates(row: dict, gpu: Gpu) -> dict[str, float]:
    """Elements per second that memory, instruction issue and FP64 each allow."""
    size = ITEMSIZE[row["dtype"]]
    traffic = size * (2 if row["kernel"] == "scale_kernel" else 1)  # scale reads and writes
    in_flight = row["programs_per_sm"] * THREADS * row["elements_per_iteration"] * size
    needed = gpu.bandwidth * gpu.latency / gpu.sms  # Little's law, per SM
    memory = STREAMING * min(1.0, in_flight / needed) * gpu.bandwidth / traffic
    issue = gpu.sms * ISSUE_PER_SM_CLOCK * gpu.clock / row["instructions_per_element"]
    fp64 = row["fp64_per_element"]
    return {
        "memory": memory,
        "issue": issue,
        "fp64": gpu.sms * gpu.fp64_per_sm_clock * gpu.clock / fp64 if fp64 else float("inf"),
        "traffic": traffic,
        "in_flight": in_flight,
        "needed": needed,
    }


def kernel_table(rows: list[dict], gpu: Gpu) -> str:
    lines = [
        f"{gpu.name} ({gpu.target}): {gpu.bandwidth / 1e12:g} TB/s, {gpu.sms} SMs, "
        f"{gpu.sms * gpu.fp64_per_sm_clock * gpu.clock * 2 / 1e12:.1f} TFLOPS FP64 (vector).",
        "",
        "| kernel | dtype | mode | variant | regs | progs/SM | KB in flight/SM (need) | load bits "
        "| instr/elem | fp64/elem | memory Gelem/s | issue Gelem/s | fp64 Gelem/s | bound | % of HBM peak |",
        "| --- " * 4 + "| ---: " * 3 + "| --- " + "| ---: " * 5 + "| --- | ---: |",
    ]
    for row in rows:
        if row["target"] != gpu.target or row["kernel"] not in ("norm_partials_kernel", "scale_kernel"):
            continue
        r = rates(row, gpu)
        bound = min(("memory", "issue", "fp64"), key=lambda k: r[k])
        fraction = r[bound] * r["traffic"] / gpu.bandwidth
        fp64 = "-" if r["fp64"] == float("inf") else f"{r['fp64'] / 1e9:,.0f}"
        lines.append(
            f"| {row['kernel'].replace('_kernel', '')} | {row['dtype']} | {row['mode'] or '-'} "
            f"| {row['variant']} | {row['registers']} | {row['programs_per_sm']} "
            f"| {r['in_flight'] / 1024:.0f} ({r['needed'] / 1024:.0f}) | {row['load_bits'][0]} "
            f"| {row['instructions_per_element']:.2f} | {row['fp64_per_element']:.4g} "
            f"| {r['memory'] / 1e9:,.0f} | {r['issue'] / 1e9:,.0f} | {fp64} | {bound} | {fraction:.0%} |"
        )
    return "\n".join(lines)


def fp64_budget(rows: list[dict], gpus: list[Gpu]) -> str:
    """How much of the FP64 units the L2 norm needs at full bandwidth, before and after."""
    lines = [
        "| GPU | dtype | elements/s at 90% of bandwidth | FP64 needed now (fp64/elem) "
        "| share of FP64 units now | with one DFMA per element (before) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for gpu in gpus:
        capacity = gpu.sms * gpu.fp64_per_sm_clock * gpu.clock
        for row in rows:
            if (
                row["target"] == gpu.target
                and row["kernel"] == "norm_partials_kernel"
                and row["mode"] == "L2"
                and row["variant"] == "aligned"
                and row["dtype"] != "float64"
            ):
                elements = STREAMING * gpu.bandwidth / ITEMSIZE[row["dtype"]]
                now = elements * row["fp64_per_element"]
                lines.append(
                    f"| {gpu.name} | {row['dtype']} | {elements / 1e9:,.0f} G "
                    f"| {now / 1e9:,.1f} G ({row['fp64_per_element']:g}) | {now / capacity:.1%} "
                    f"| {elements / capacity:.0%} |"
                )
    return "\n".join(lines)


def main(path: str) -> None:
    rows = json.loads(Path(path).read_text())
    print(kernel_table(rows, H200))
    print()
    print(fp64_budget(rows, [H200, L40S, RTX4090]))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).with_name("kernels.json")))
