"""The triton backend compiled for a real GPU: correctness, no syncs, launches, int64 offsets.

Every test here is marked ``cuda`` and skipped where there is no CUDA device
(see conftest.py). They run as part of the device check (benchmarks/device_check.sh).
"""

from __future__ import annotations

import pytest
import torch

import fastnorm
import reference

pytestmark = pytest.mark.cuda

if torch.cuda.is_available() and __import__("os").environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("CUDA tests need compiled kernels: run them with TRITON_INTERPRET=0", allow_module_level=True)


def cuda_grads(shapes, dtype, seed=0, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [
        (torch.randn(s, generator=g, device="cuda", dtype=torch.float32) * scale).to(dtype) for s in shapes
    ]


SHAPES = [(0,), (1,), (123,), (4097,), (65536 * 3 + 17,), (768, 3072)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("p", [2.0, 1.0, float("inf"), 3.0])
def test_matches_oracle(dtype, p):
    tensors = cuda_grads(SHAPES, dtype, seed=1)
    got = fastnorm.total_norm(tensors, p)
    assert got.device.type == "cuda"
    tol = 5e-5 if p == 3.0 else (1e-12 if dtype == torch.float64 else 5e-6)
    assert reference.rel_err(got.item(), reference.norm(tensors, p)) <= tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_clip_bitwise_equal_to_torch_given_the_same_norm(dtype):
    ours = cuda_grads(SHAPES[1:], dtype, seed=2, scale=3.0)
    theirs = [t.clone() for t in ours]
    params = []
    for t in theirs:
        q = torch.nn.Parameter(torch.zeros_like(t))
        q.grad = t
        params.append(q)
    norm = torch.nn.utils.get_total_norm(theirs).float()
    norm = norm.double() if dtype == torch.float64 else norm
    fastnorm.clip_(ours, 0.5, total_norm=norm, gradients=True)
    torch.nn.utils.clip_grads_with_norm_(params, 0.5, norm)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_no_host_sync():
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 10)).cuda()
    params = list(model.parameters())
    for _ in range(2):  # the first calls compile kernels and pin host memory
        model(torch.randn(64, 256, device="cuda")).sum().backward()
        fastnorm.clip_(params, 1.0)
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            model(torch.randn(64, 256, device="cuda")).sum().backward()
            norm = fastnorm.total_norm(params)
            fastnorm.clip_(params, 1.0, total_norm=norm)
            fastnorm.clip_(params, 0.1)
            fastnorm.tensor_norms(params)
            model.zero_grad(set_to_none=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _kernel_launches(fn) -> list[str]:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def test_launches_per_call():
    tensors = cuda_grads([(1000,)] * 300, torch.float32, seed=3) + cuda_grads(
        [(77,)] * 50, torch.bfloat16, seed=4
    )
    norm_launches = _kernel_launches(lambda: fastnorm.total_norm(tensors))
    # One per dtype plus one finalize, whatever the number of tensors; no copy
    # once the tables are cached.
    assert sorted(norm_launches) == sorted(["norm_partials_kernel"] * 2 + ["finalize_kernel"]), norm_launches
    clip_launches = _kernel_launches(lambda: fastnorm.clip_(tensors, 1e9, gradients=True))
    assert sorted(clip_launches) == sorted(
        ["norm_partials_kernel"] * 2 + ["finalize_kernel"] + ["scale_kernel"] * 2
    ), clip_launches


def test_more_than_2_to_the_31_elements():
    n = 2**31 + 4099
    big = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(5)
    big.normal_(generator=g)
    big[-1] = 1000.0  # past the int32 range: a wrapped offset would miss it
    got = fastnorm.total_norm([big], float("inf"))
    assert got.item() == 1000.0
    expected = (
        sum(torch.linalg.vector_norm(c, dtype=torch.float64).square().item() for c in big.split(2**28)) ** 0.5
    )
    assert reference.rel_err(fastnorm.total_norm([big]).item(), expected) <= 5e-6
    fastnorm.clip_([big], 1.0, gradients=True)
    assert reference.rel_err(big[-1].float().item(), 1000.0 / expected) <= 1e-2
    del big
    torch.cuda.empty_cache()


def test_bitwise_deterministic():
    tensors = cuda_grads([(1_000_003,), (4097,), (65536 * 5,)], torch.float32, seed=6)
    first = fastnorm.total_norm(tensors)
    for _ in range(5):
        fastnorm.clear_cache()
        assert torch.equal(fastnorm.total_norm(tensors), first)


def test_cuda_graph_capture_and_replay_with_new_values():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)).cuda()
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fastnorm.clip_(params, 1.0)  # warm-up: builds and caches the tables
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        norm = fastnorm.clip_(params, 1.0)
    for scale in (0.01, 10.0, 1000.0):
        fresh = [torch.randn_like(p) * scale for p in params]
        for p, f in zip(params, fresh):
            p.grad.copy_(f)
        graph.replay()
        expected = torch.nn.utils.get_total_norm(fresh)
        assert reference.rel_err(norm.item(), expected.item()) <= 1e-5
        coef = min(1.0, 1.0 / (expected.item() + 1e-6))
        for p, f in zip(params, fresh):
            torch.testing.assert_close(p.grad, f * coef, rtol=1e-5, atol=1e-7)


def test_compiled_step_on_cuda_matches_eager():
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 4)).cuda()

    def step(model, clip):
        params = list(model.parameters())
        norm = clip(params, 0.5)
        with torch.no_grad():
            torch._foreach_add_(params, [p.grad for p in params], alpha=-0.1)
        return norm

    eager, compiled = make(), make()
    x = torch.randn(16, 32, device="cuda") * 10
    for model in (eager, compiled):
        model(x).square().sum().backward()
    got = torch.compile(step, fullgraph=True)(compiled, fastnorm.clip_)
    expected = step(eager, torch.nn.utils.clip_grad_norm_)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=0)
    for a, b in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_capture_without_warm_up_says_what_to_do():
    grads = cuda_grads([(1000,)], torch.float32, seed=7)
    fastnorm.clear_cache()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="warm-up"):
        with torch.cuda.graph(graph):
            fastnorm.total_norm(grads)


# ----------------------------------------------------------------------------
# The compiled kernels on every alignment and tail, and their numerics at scale
# ----------------------------------------------------------------------------

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _views(sizes, dtype, offset, seed):
    """Views of one CUDA buffer, each ``offset`` elements past a multiple of 16 elements."""
    starts, at = [], 0
    for n in sizes:
        starts.append(at + offset)
        at = -(-(at + offset + n + 1) // 16) * 16
    (buffer,) = cuda_grads([(at,)], dtype, seed=seed)
    return buffer, [buffer[s : s + n] for s, n in zip(starts, sizes)]


def _check(tensors, p, tol):
    total, each = fastnorm.tensor_norms(tensors, p)
    assert reference.rel_err(total.item(), reference.norm(tensors, p)) <= tol
    for t, got in zip(tensors, each.tolist()):
        assert reference.rel_err(got, reference.norm([t], p)) <= tol


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 3, 7])
def test_every_storage_offset(dtype, offset):
    from fastnorm.backends.triton_backend import BACKEND

    buffer, views = _views([1, 77, 4096, 65536 + 3, 300_001], dtype, offset, seed=8)
    assert [t.aligned for t in BACKEND.prepare(views).tables] == [offset * dtype.itemsize % 16 == 0]
    for p in (2.0, 1.0, float("inf")):
        _check(views, p, 1e-12 if dtype == torch.float64 else 5e-7)
    before = buffer.clone()
    params = []
    for v in views:
        q = torch.nn.Parameter(torch.zeros_like(v))
        q.grad = v.clone()
        params.append(q)
    norm = torch.nn.utils.get_total_norm([q.grad for q in params]).float()
    norm = norm.double() if dtype == torch.float64 else norm
    torch.nn.utils.clip_grads_with_norm_(params, 1e-3, norm)
    fastnorm.clip_(views, 1e-3, total_norm=norm, gradients=True)
    assert all(torch.equal(v, q.grad) for v, q in zip(views, params))
    inside = torch.zeros(buffer.numel(), dtype=torch.bool, device="cuda")
    for v in views:
        inside[v.storage_offset() : v.storage_offset() + v.numel()] = True
    assert torch.equal(buffer[~inside], before[~inside])  # nothing else written


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aligned", [True, False])
def test_every_tail_length(dtype, aligned):
    from fastnorm.backends.triton_backend import GPU_CONFIG

    run, rows, vec = GPU_CONFIG.geometry(dtype, aligned)
    lengths = list(range(1, run * rows * vec + 2, 7)) + [run * rows * vec, run * rows * vec + 1]
    if aligned:
        tensors = cuda_grads([(n,) for n in lengths], dtype, seed=9)
    else:
        _, tensors = _views(lengths, dtype, 1, seed=9)
    _check(tensors, 2.0, 1e-12 if dtype == torch.float64 else 5e-7)


def test_1e8_values_within_1e_6_of_float64():
    x = torch.randn(10**8, device="cuda", generator=torch.Generator(device="cuda").manual_seed(10))
    exact = torch.linalg.vector_norm(x, dtype=torch.float64).item()
    assert reference.rel_err(fastnorm.total_norm([x]).item(), exact) <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("value", [1e20, 1e-30, 3e38])
def test_values_whose_squares_leave_float32(dtype, value):
    (x,) = cuda_grads([(1_000_003,)], dtype, seed=11)
    x[12345], x[-1] = value, -value
    tiny = (torch.rand(70_000, device="cuda") * value).to(dtype)  # whole chunks of them
    partial, _, _ = _partial_of([x, tiny])  # float64: finite even where a float32 norm is not
    assert reference.rel_err(partial[1].sqrt().item(), reference.norm([x, tiny], 2.0)) <= 1e-6


@pytest.mark.parametrize("scale", [1e-310, 1e-200, 1e200, 1e300])
def test_float64_extremes(scale):
    tensors = cuda_grads([(300_001,), (77,)], torch.float64, seed=12, scale=scale)
    assert reference.rel_err(fastnorm.total_norm(tensors).item(), reference.norm(tensors, 2.0)) <= 1e-12


def _partial_of(tensors):
    from fastnorm._partial import Mode
    from fastnorm.backends.triton_backend import BACKEND

    return BACKEND.reduce(BACKEND.prepare(tensors), Mode.L2, 2.0, torch.float64)


def test_reduce_stats_on_cuda_matches_the_same_reduction_on_the_cpu():
    from fastnorm.stats import reduce_stats

    tensors = cuda_grads([(123,), (4097,), (768, 3072)], torch.float32, seed=5, scale=3.0)
    tensors[0][7] = float("nan")
    tensors[1][:5] = 0.0
    tensors[2][0, :3] = float("inf")
    got = reduce_stats(tensors)
    assert got.device.type == "cuda" and got.dtype == torch.float64
    want = reduce_stats([t.cpu() for t in tensors])
    torch.testing.assert_close(got.cpu()[:, 1:], want[:, 1:], rtol=0, atol=0)  # max |x| and exact counts
    torch.testing.assert_close(got.cpu()[:, 0], want[:, 0], rtol=1e-12, atol=0)  # sums of squares


def test_the_locator_reads_nothing_on_the_host_during_a_cuda_step():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
    locator = fastnorm.Locator(model)
    x = torch.randn(32, 64, device="cuda")
    model(x).square().mean().backward()  # the first step allocates; the next are watched for syncs
    locator.step(1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in (2, 3):
            model(x).square().mean().backward()
            locator.step(step)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert "nothing non-finite" in locator.report()
    locator.remove()
