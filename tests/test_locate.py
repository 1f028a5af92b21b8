"""The locator: injected faults in three model families, named on the failing step; no host read between
reads; nothing kept alive; removal restores every hook; torch.compile still runs."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fastnorm
from fastnorm.locate import Located, Site
from helpers import CountSyncs

FAULTS = ("forward-inf", "forward-nan", "backward-overflow", "poisoned-batch")


class _Blowup(torch.autograd.Function):
    """The identity forward; a backward that overflows float16 (the gradient times 1e9, in float16)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad.half() * 1e9).to(grad.dtype)


class Fault(nn.Module):
    """The identity, until armed with a fault."""

    def __init__(self):
        super().__init__()
        self.kind = None

    def forward(self, x):
        if self.kind == "forward-inf":  # an float16 exp that overflows: exp(12) > 65504
            return torch.exp(x.half().abs() + 12).to(x.dtype)
        if self.kind == "forward-nan":  # the log of a negative number
            return torch.log(-(x.abs() + 1))
        if self.kind == "backward-overflow":
            return _Blowup.apply(x)
        return x


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fault, self.act, self.fc2 = nn.Linear(8, 32), Fault(), nn.Tanh(), nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fault(self.fc1(x))))

    def batch(self):
        return torch.randn(16, 8)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.fault = nn.Conv2d(3, 8, 3, padding=1), Fault()
        self.body = nn.Sequential(nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        x = self.body(self.fault(self.conv1(x)))
        return self.head(x.mean((2, 3)))

    def batch(self):
        return torch.randn(4, 3, 8, 8)


class Block(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential()
        self.mlp.fc1, self.mlp.fault = nn.Linear(d, 4 * d), Fault()
        self.mlp.act, self.mlp.fc2 = nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.embed, self.blocks = nn.Linear(6, d), nn.ModuleList([Block(d), Block(d)])
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def batch(self):
        return torch.randn(2, 7, 6)


# Each family, the module the fault is armed in, and the module whose output feeds it.
FAMILIES = {
    "mlp": (MLP, "fault", "fc1"),
    "cnn": (CNN, "fault", "conv1"),
    "transformer": (Transformer, "blocks.1.mlp.fault", "blocks.1.mlp.fc1"),
}


def _fault_module(model, name):
    return model.get_submodule(name)


def _run(family, fault, steps=3, bad_step=2):
    """``steps`` steps of a family; ``fault`` armed at ``bad_step`` only. Returns (model, locator, loss)."""
    torch.manual_seed(0)
    cls, fault_name, _ = FAMILIES[family]
    model = cls()
    locator = fastnorm.Locator(model)
    loss = None
    for step in range(steps):
        x = model.batch()
        if step == bad_step:
            if fault == "poisoned-batch":
                x.view(-1)[3] = float("nan")
            elif fault is not None:
                _fault_module(model, fault_name).kind = fault
        loss = model(x).float().pow(2).mean()
        loss.backward()
        if step < steps - 1:
            locator.step(step)
            model.zero_grad()
        _fault_module(model, fault_name).kind = None
    return model, locator, loss


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fault", FAULTS)
def test_the_first_offender_is_named_on_the_failing_step(family, fault):
    _, fault_name, producer = FAMILIES[family]
    model, locator, loss = _run(family, fault)
    found = locator.located()  # before the failing step is closed: on the step itself
    locator.remove()
    first = found.nonfinite
    assert first is not None, found.report()
    assert first.step == 2
    expected = {
        "forward-inf": ("forward", fault_name, "output"),
        "forward-nan": ("forward", fault_name, "output"),
        "backward-overflow": ("backward", producer, "grad_output"),
        "poisoned-batch": ("forward", "", "input"),
    }[fault]
    assert (first.site.pass_, first.site.module, first.site.role) == expected, first.report()
    assert first.frame.nonfinite > 0
    if fault == "backward-overflow":
        assert math.isfinite(loss.item())  # the loss was finite: the forward never saw it
        before = next(f for f in first.frames if f.offset == -1)  # the gradient the faulty backward received
        assert (before.site.module, before.site.role, before.nonfinite) == (fault_name, "grad_output", 0)
    # Everything before the finding, in execution order, was finite.
    assert all(f.nonfinite == 0 for f in first.frames if f.offset < 0)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_healthy_run_has_no_finding(family):
    _, locator, _ = _run(family, None)
    found = locator.located()
    locator.remove()
    assert not found, found.report()
    assert found.report() == "nothing non-finite and no overflow in the steps watched"


def test_the_window_keeps_the_first_faulty_step_after_it_closed():
    model, locator, _ = _run("mlp", "forward-nan", steps=5, bad_step=1)
    locator.step(4)
    found = locator.collect()
    assert found.nonfinite.step == 1 and found.nonfinite.site.module == "fault"
    assert not locator.collect()  # a new window: nothing since
    locator.remove()


def test_the_report_names_pass_module_role_dtype_step_and_the_way_in():
    model, locator, _ = _run("transformer", "backward-overflow")
    text = locator.report()
    locator.remove()
    head = text.splitlines()[0]
    assert head.startswith(
        "first non-finite: backward, `blocks.1.mlp.fc1`, gradient of its output, float32, step 2"
    ), text
    assert "finite on its way in (backward, `blocks.1.mlp.fault`, gradient of its output)" in head
    assert len([line for line in text.splitlines() if line.startswith("    ")]) >= 3  # the frames


def test_counts_and_maxima_match_a_torch_reference():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 7))
    with fastnorm.Locator(model, frames=0) as locator:
        x = torch.randn(3, 5, dtype=torch.float64)
        out = model.double()(x)
        out.sum().backward()
        found = locator.located()
        assert not found
        row = locator._buffer.read()[0]
    site = next(i for i, s in enumerate(locator.sites()) if s.role == "output")
    cells = row[3 + 6 * site : 9 + 6 * site]
    assert cells[1] == out.detach().abs().max().item()
    assert cells[2] == 0 and cells[5] == 0


def test_overflow_is_judged_by_the_narrower_autocast_target():
    class Scale(nn.Module):
        def forward(self, x):
            return x.float() * 1e5  # float32, beyond float16's margin (65504 / 16), far inside float32's

    model = nn.Sequential(nn.Linear(4, 4), Scale())
    with fastnorm.Locator(model) as locator:
        with torch.autocast("cpu", dtype=torch.float16):
            model(torch.randn(2, 4))
        found = locator.located()
    assert found.nonfinite is None and found.overflow is not None
    site = found.overflow.site
    assert (site.module, site.dtype, site.limit) == ("1", "float32", "float16")
    with fastnorm.Locator(model) as locator:  # without autocast float32 judges it: nothing
        model(torch.randn(2, 4))
        assert not locator.located()


def test_no_host_read_between_reads():
    torch.manual_seed(0)
    model = Transformer()
    locator = fastnorm.Locator(model)
    model(model.batch()).pow(2).mean().backward()  # the first step allocates
    locator.step()
    with CountSyncs() as counter:
        for _ in range(3):
            model(model.batch()).pow(2).mean().backward()
            locator.step()
            model.zero_grad()
    assert counter.count == 0
    with CountSyncs() as counter:
        locator.report()
    assert counter.count == 1 and locator.transfers == 1
    locator.remove()


def test_the_counter_counts():
    with CountSyncs() as counter:
        t = torch.ones(2)
        t.sum().item(), bool(t[0]), t.tolist(), float(t[0])
    assert counter.count == 4


def test_no_activation_outlives_autograd():
    model = MLP()
    refs = []
    hook = model.fc1.register_forward_hook(lambda m, a, out: refs.append(weakref.ref(out)))
    with fastnorm.Locator(model) as locator:
        loss = model(model.batch()).pow(2).mean()
        loss.backward()
        locator.step()
        del loss
        gc.collect()
        assert refs and refs[0]() is None
    hook.remove()


def _hooks(model):
    return {
        id(m): [list(d.items()) for d in (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks)]
        for m in model.modules()
    }


def test_remove_restores_every_hook_by_identity():
    model = Transformer()
    mine = model.blocks[0].register_forward_hook(lambda *a: None)
    before = _hooks(model)
    locator = fastnorm.Locator(model)
    assert _hooks(model) != before
    loss = model(model.batch()).pow(2).mean()
    locator.remove()
    after = _hooks(model)
    assert after.keys() == before.keys()
    for key in before:
        assert [(k, id(h)) for part in before[key] for k, h in part] == [
            (k, id(h)) for part in after[key] for k, h in part
        ]
    order = locator._order
    loss.backward()  # a gradient hook of the step in flight does nothing once removed
    assert locator._order == order and not locator.active
    mine.remove()
    locator.remove()  # twice is harmless


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        fastnorm.Locator("model")
    with pytest.raises(ValueError, match="frames must be >= 0"):
        fastnorm.Locator(nn.Linear(2, 2), frames=-1)
    with pytest.raises(TypeError, match="step must be an int"):
        fastnorm.Locator(nn.Linear(2, 2)).step("3")


def test_logged_keys_name_the_site_and_read_back():
    model, locator, _ = _run("mlp", "backward-overflow")
    found = locator.located()
    locator.remove()
    metrics = found.metrics()
    key = next(k for k in metrics if k.startswith("locate_nonfinite/"))
    assert metrics[key] == 2.0
    assert Site.from_key(key.split("/", 1)[1]) == found.nonfinite.site
    assert any(k.startswith("locate_nonfinite_frames/-1/backward:fault:grad_output") for k in metrics)


def test_a_compiled_model_still_runs_and_its_parameter_gradients_are_watched():
    torch.manual_seed(0)
    model = MLP()
    locator = fastnorm.Locator(model)
    compiled = torch.compile(model, backend="aot_eager")
    compiled(model.batch()).pow(2).mean().backward()
    locator.step()
    assert not locator.located()
    x = model.batch()
    x[0, 0] = float("nan")
    compiled(x).pow(2).mean().backward()
    found = locator.located()
    locator.remove()
    # Inside the compiled frame the hooks step aside; the parameters' gradients are read eagerly.
    assert found.nonfinite.site.role == "grad" and found.nonfinite.step == 1
    assert isinstance(found, Located)


def test_the_monitor_logs_the_finding_and_the_diagnosis_and_fastnorm_diagnose_read_it(tmp_path):
    torch.manual_seed(0)
    model = MLP()
    path = tmp_path / "metrics.jsonl"
    locator = fastnorm.Locator(model)
    monitor = fastnorm.GradNormMonitor(4, [fastnorm.JsonlLogger(str(path))], locate=locator, warn=False)
    with CountSyncs() as counter:
        for step in range(3):
            if step == 2:
                model.fault.kind = "backward-overflow"
            loss = model(model.batch()).pow(2).mean()
            loss.backward()
            monitor.update(fastnorm.total_norm(model.parameters()), loss=loss)
            model.zero_grad()
            model.fault.kind = None
    assert counter.count == 0  # between windows, neither the monitor nor the locator reads the device
    for _ in range(9):
        model(model.batch()).pow(2).mean().backward()
        monitor.update(fastnorm.total_norm(model.parameters()))
        model.zero_grad()
    assert monitor.located.nonfinite is None  # the third window: nothing new
    monitor.close()
    assert not locator.active  # the monitor removed it
    line = "first non-finite: backward, `fc1`, grad_output, float32, step 2; "
    line += "finite on its way in (backward, `fault`"
    assert any(x.startswith(line) for x in monitor.diagnosis.located), monitor.diagnosis.located
    assert "  where: " + line in monitor.diagnosis.report()
    from fastnorm.monitoring.command import diagnose_series

    offline = diagnose_series(fastnorm.read_series(path))
    assert offline.located == monitor.diagnosis.located
    with pytest.raises(TypeError, match="locate must be a fastnorm.Locator"):
        fastnorm.GradNormMonitor(4, locate=model)


def test_the_docs_example_names_the_backward_that_overflowed(capsys):
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "locate_backward_overflow.py"))
    out = capsys.readouterr().out
    assert "loss 0.123 (finite)" in out
    assert "first non-finite: backward, `2`, gradient of its parameter `bias`" in out
    assert "finite on its way in (backward, `2`, gradient of its output)" in out


def _specials(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random values of ``dtype`` with NaN, infs, zeros, subnormals and values past the overflow
    margin (finfo.max / 16) at random places, the last one included."""
    info = torch.finfo(dtype)
    x = torch.randn(n, generator=gen, dtype=torch.float64)
    kinds = torch.tensor(
        [math.nan, math.inf, -math.inf, 0.0, info.tiny / 4, -info.tiny / 2, info.max / 8, -info.max / 12],
        dtype=torch.float64,
    )
    where = torch.randint(0, n, (max(1, n // 13),), generator=gen)
    x[where] = kinds[torch.randint(0, len(kinds), (len(where),), generator=gen)]
    x[-1] = kinds[int(torch.randint(0, len(kinds), (1,), generator=gen))]
    return x.to(dtype)


@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("one", (False, True), ids=("record", "record_one"))
@pytest.mark.parametrize("request_", ("auto", "torch"))
def test_the_buffers_cells_are_the_engines_statistics(request_, one, threads, monkeypatch):
    """Row 0's cells hold reduce_stats' maximum and counts, through the C++ kernel's plan-free path
    (auto, on the CPU: one piece on the calling thread, or split into tasks over the threads where a
    tensor is over a megabyte) and through the engine (torch's ops), an event of one tensor recorded
    as a list or alone: every dtype, a tensor over one task, a transposed (dense) one, one with gaps,
    under another limit dtype."""
    from fastnorm.locate.buffer import HEAD, WIDTH, DeviceBuffer
    from fastnorm.stats import reduce_stats

    monkeypatch.setenv("FASTNORM_BACKEND", request_)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(23)
    events = [
        [_specials(n, dtype, gen)]
        for n in (1, 33, 4097, 200_000, 300_001)
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    ]
    events.append([_specials(64 * 5, torch.float32, gen).reshape(64, 5).t()])  # dense, not contiguous
    # Past float16's margin and below its smallest normal, in float64's and float32's ranges.
    narrow = [1e5, -7e4, 3e-6, -1e-7, 1.0, 0.0] * 7
    events += [[torch.tensor(narrow, dtype=dtype)] for dtype in (torch.float64, torch.float32)]
    gaps = _specials(99, torch.float32, gen).reshape(9, 11)[:, ::2]
    events.append([gaps, _specials(7, torch.float16, gen)])
    limits = [[t.dtype for t in e] for e in events]
    limits[1] = [torch.float16]  # a float64 tensor judged by float16's range
    limits[-3:-1] = [[torch.float16], [torch.float16]]
    try:
        buffer = DeviceBuffer(torch.device("cpu"), 4)  # grows as the events come
    finally:
        torch.set_num_threads(before)  # the buffer keeps the thread count it chose
    assert buffer.direct == (request_ == "auto" and fastnorm.backends.cpp._C is not None)
    for tensors, lims in zip(events, limits):
        if one and len(tensors) == 1:
            buffer.record_one(tensors[0], lims[0])
        else:
            buffer.record(tensors, lims)
    buffer.settle(buffer.written)
    cells = buffer.read()[0][HEAD : HEAD + WIDTH * buffer.written]
    row = torch.tensor(cells, dtype=torch.float64).view(-1, WIDTH)
    want = torch.cat([reduce_stats(t, lim) for t, lim in zip(events, limits)])
    assert torch.equal(row[:, 1:], want[:, 1:])
    assert want[:, 2].sum() > 0 and want[:, 4].sum() > 0 and want[:, 5].sum() > 0  # every count is reached
    narrowed = want[len(events) - 3 : len(events) - 1]
    assert narrowed[:, 4].tolist() == [14, 14] and narrowed[:, 5].tolist() == [14, 14]  # float16's range
    if buffer.direct:
        dense = [i for i, (t,) in enumerate(events[:-1])]
        assert row[dense, 0].isnan().all()  # the plan-free path leaves the sums of squares out


def test_one_locator_judges_each_step_by_its_own_autocast_state():
    class Scale(nn.Module):
        def forward(self, x):
            return x.float() * 1e5  # beyond float16's margin, far inside float32's

    model = nn.Sequential(nn.Linear(4, 4), Scale())
    with fastnorm.Locator(model) as locator:
        model(torch.randn(2, 4))  # float32 judges it: nothing
        locator.step()
        assert not locator.collect()
        with torch.autocast("cpu", dtype=torch.float16):
            model(torch.randn(2, 4))
        locator.step()
        assert locator.collect().overflow.site.limit == "float16"
        model(torch.randn(2, 4))  # and float32 again
        locator.step()
        assert not locator.collect()


def test_pause_removes_the_hooks_and_resume_puts_them_back():
    model = MLP()
    before = _hooks(model)
    locator = fastnorm.Locator(model)
    model.fault.kind = "forward-nan"
    locator.pause()
    assert _hooks(model) == before and not locator.active
    model(model.batch()).sum().backward()  # not watched
    locator.step()
    assert not locator.located()
    locator.resume()
    locator.resume()  # harmless while active
    assert locator.active
    model(model.batch()).sum().backward()
    locator.step()
    found = locator.located()
    assert found.nonfinite.site.module == "fault" and found.nonfinite.step == 1
    locator.remove()
    with pytest.raises(RuntimeError, match="was removed"):
        locator.resume()


def test_the_plan_free_kernel_refuses_an_unknown_dtype_code():
    cpp = fastnorm.backends.cpp
    if cpp._C is None:
        pytest.skip("the C++ kernels are not built")
    out = torch.empty(6, dtype=torch.float64)
    x = torch.ones(3)
    with pytest.raises(ValueError, match="unknown dtype code 7"):
        cpp._C.count_stats(x.data_ptr(), 3, 7, 0, cpp.TASK_BYTES, cpp._THRESHOLDS_ADDR, out.data_ptr(), 1)
    with pytest.raises(ValueError, match="unknown limit dtype code 9"):
        cpp._C.count_stats(x.data_ptr(), 3, 0, 9, cpp.TASK_BYTES, cpp._THRESHOLDS_ADDR, out.data_ptr(), 1)


def test_each_parameters_gradient_is_read_once_a_step_where_backward_wrote_it():
    model = MLP()
    locator = fastnorm.Locator(model)
    model(model.batch()).sum().backward()
    sites = list(locator.sites())
    order = [sites[e] for e in locator._events]  # the step in progress, before it closes
    grads = [s for s in order if s.role == "grad"]
    assert sorted(f"{s.module}.{s.index}" for s in grads) == sorted(n for n, _ in model.named_parameters())
    # read in backward's order, among the gradients entering the outputs: fc2's before fc1's
    assert order.index(next(s for s in grads if s.module == "fc2")) < order.index(
        next(s for s in order if s.role == "grad_output" and s.module == "fc1")
    )
    locator.located()  # reads the parameters no hook read: none
    locator.step()
    assert len(locator._history[-1][1]) == len(order)
    model.fc1.weight.grad = torch.full_like(model.fc1.weight, math.nan)  # set by hand: read at the step
    locator.step()
    found = locator.located()
    site = found.nonfinite.site
    assert (site.module, site.index, found.nonfinite.step) == ("fc1", "weight", 1)
    locator.remove()
