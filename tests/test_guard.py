"""The spike guard: its rule against a float64 host reference, the skip inside torch's fused
steps, the counters the monitor logs, the diagnosis of a guard that skips everything."""

from __future__ import annotations

import copy
import io
import json
import math
import random
import sys

import pytest
import torch

import fastnorm
from fastnorm import SpikeGuard, StepClipper


class Reference:
    """The rule of SpikeGuard, written plainly on the host in float64."""

    def __init__(self, window=128, threshold=6.0, warmup=20, release_after=50):
        self.window, self.threshold, self.warmup, self.release_after = window, threshold, warmup, release_after
        self.norms: list[float] = []  # the applied steps' log-norms, oldest first
        self.losses: list[float | None] = []
        self.run = 0

    @staticmethod
    def _z(values, x, floor):
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        return (x - mean) / max(std, floor)

    def step(self, norm, loss=None, skipped_anyway=False):
        v = math.log(max(norm, 1e-30)) if not math.isnan(norm) else math.nan
        flag = (
            len(self.norms) >= self.warmup
            and math.isfinite(v)
            and self._z(self.norms, v, 0.05) > self.threshold
        )
        if loss is not None:
            known = [x for x in self.losses if x is not None]
            if not math.isfinite(loss):
                flag = True
            elif len(known) >= self.warmup:
                if loss > 0 and all(x > 0 for x in known):  # a positive loss: judged by its log
                    z = self._z([math.log(x) for x in known], math.log(loss), 0.01)
                else:
                    mean = sum(known) / len(known)
                    z = self._z(known, loss, max(abs(mean) * 0.01, 1e-12))
                flag = flag or z > self.threshold
        applied = not flag and not skipped_anyway and math.isfinite(v) and (loss is None or math.isfinite(loss))
        if applied:
            self.norms = (self.norms + [v])[-self.window :]
            self.losses = (self.losses + [loss])[-self.window :]
        self.run = self.run + 1 if flag else 0
        if self.run >= self.release_after:
            self.norms, self.losses, self.run = [], [], 0
        return flag


def _series(n, seed, spikes=(), scale=0.2):
    rng = random.Random(seed)
    values = [math.exp(rng.gauss(0.0, scale)) * (1 + 0.001 * i) for i in range(n)]
    for i, factor in spikes:
        values[i] *= factor
    return values


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_loss", [None, "positive", "crosses 0"])
def test_the_rule_matches_a_float64_reference(seed, with_loss):
    rng = random.Random(100 + seed)
    n = 400
    spikes = [(rng.randrange(25, n), rng.choice([1.5, 3.0, 10.0, 1e3, 0.01])) for _ in range(12)]
    norms = _series(n, seed, spikes)
    start, slope = (2.0, 0.002) if with_loss == "positive" else (0.5, 0.003)  # 0.5 - 0.003 i: 0 at 167
    losses = [start - slope * i + rng.gauss(0, 0.02) for i in range(n)]
    for i in rng.sample(range(25, n), 5):
        losses[i] *= rng.choice([1.2, 3.0, 0.5])
    window, warmup = rng.choice([(128, 20), (32, 8), (16, 16)])
    guard, ref = SpikeGuard(window=window, warmup=warmup, release_after=7), Reference(window, 6.0, warmup, 7)
    flags, expected = [], []
    for i, v in enumerate(norms):
        loss = torch.tensor(losses[i]) if with_loss else None
        flags.append(guard.decide(torch.tensor(v, dtype=torch.float32), loss).item())
        guard.commit(guard.flagged)
        expected.append(ref.step(float(torch.tensor(v, dtype=torch.float32)), float(loss) if with_loss else None))
    assert flags == [float(e) for e in expected]
    assert 0 < sum(expected) < n // 4  # the test has both kinds of step
    assert guard.spikes.item() == sum(expected)


def test_no_flag_during_the_warmup_and_a_skipped_step_stays_out_of_the_band():
    guard = SpikeGuard(warmup=20)
    for i in range(19):
        assert guard.decide(torch.tensor(1.0 + 0.01 * (i % 3))).item() == 0
    assert guard.decide(torch.tensor(1e6)).item() == 0  # the 20th applied step: still the warm-up
    guard = SpikeGuard(warmup=20)
    for i in range(20):
        guard.decide(torch.tensor(1.0 + 0.01 * (i % 3)))
    assert guard.decide(torch.tensor(1e6)).item() == 1
    # Skipped, it did not enter the band: the same value is flagged again, as often as it comes.
    assert [guard.decide(torch.tensor(1e6)).item() for _ in range(5)] == [1.0] * 5
    assert guard.decide(torch.tensor(1.02)).item() == 0
    assert guard.spikes.item() == 6


def test_only_rises_are_spikes_and_a_nonfinite_norm_is_not_one():
    guard = SpikeGuard()
    for i in range(30):
        guard.decide(torch.tensor(1.0 + 0.01 * (i % 5)))
    assert guard.decide(torch.tensor(1e-6)).item() == 0  # a fall
    assert guard.decide(torch.tensor(math.nan)).item() == 0  # StepClipper's non-finite skip takes it
    assert guard.decide(torch.tensor(math.inf)).item() == 0
    assert guard.decide(torch.tensor(1.01), torch.tensor(math.nan)).item() == 1  # a non-finite loss


def test_a_run_of_flags_releases_the_guard_to_a_new_warmup():
    guard = SpikeGuard(warmup=10, release_after=5)
    for i in range(20):
        guard.decide(torch.tensor(1.0 + 0.01 * (i % 3)))
    flags = [guard.decide(torch.tensor(100.0 + 0.1 * (i % 3))).item() for i in range(30)]
    # five flags, then the statistics restart at the new level: ten steps of warm-up, no flag after
    assert flags == [1.0] * 5 + [0.0] * 25
    assert guard.releases.item() == 1 and guard.spikes.item() == 5


def test_arguments_are_checked():
    for kwargs, error, match in [
        ({"window": 1}, ValueError, "window must be >= 2"),
        ({"window": 2.5}, TypeError, "window"),
        ({"threshold": 0}, ValueError, "threshold must be finite and > 0"),
        ({"threshold": math.nan}, ValueError, "threshold"),
        ({"threshold": "6"}, TypeError, "threshold must be a number"),
        ({"warmup": 1}, ValueError, "warmup must be between 2 and window"),
        ({"warmup": 200}, ValueError, "warmup must be between 2 and window"),
        ({"release_after": 0}, ValueError, "release_after"),
    ]:
        with pytest.raises(error, match=match):
            SpikeGuard(**kwargs)
    guard = SpikeGuard()
    with pytest.raises(TypeError, match="norm must be a one-value Tensor"):
        guard.decide(1.0)
    with pytest.raises(TypeError, match="loss must be a one-value Tensor"):
        guard.decide(torch.tensor(1.0), torch.ones(2))
    with pytest.raises(TypeError, match="skip_spikes must be a bool or a fastnorm.SpikeGuard"):
        StepClipper(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1, fused=True), 1.0, skip_spikes=3)
    assert "window=128, threshold=6.0, warmup=20, release_after=50" in repr(guard)


# ----------------------------------------------------------------------------
# Inside torch's fused steps
# ----------------------------------------------------------------------------


def _train(opt_name, steps, bad, guard=True, seed=0):
    """A small regression on noisy minibatches; the batches of ``bad`` scaled 100x (poisoned)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    if opt_name == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, fused=True)
    clipper = StepClipper(opt, 1e3, skip_spikes=guard)
    data = torch.randn(2048, 16)
    target = data[:, :1] * 2 - data[:, 1:2] + 0.3 * torch.randn(2048, 1)
    batches = torch.Generator().manual_seed(seed + 1)
    reasons, kept = [], []
    for i in range(steps):
        index = torch.randint(0, 2048, (64,), generator=batches)
        x = data[index] * (100 if i in bad else 1)
        loss = torch.nn.functional.mse_loss(model(x), target[index])
        loss.backward()
        before = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()["state"]))
        clipper.arm(loss=loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        reasons.append(clipper.skip_reason.item())
        if reasons[-1]:
            same_params = all(torch.equal(before[0][k], v) for k, v in model.state_dict().items())
            state = opt.state_dict()["state"]
            same_state = all(torch.equal(before[1][p][k], state[p][k]) for p in state for k in state[p])
            kept.append(same_params and same_state)
    final = torch.nn.functional.mse_loss(model(data), target).item()
    return reasons, kept, final


@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_a_spiking_step_is_skipped_inside_the_fused_step_parameters_and_state_untouched(opt_name):
    reasons, kept, final = _train(opt_name, 300, bad={250})
    assert [i for i, r in enumerate(reasons) if r] == [250]
    assert reasons[250] == 2.0 and kept == [True]
    _, _, healthy = _train(opt_name, 300, bad=set(), guard=False)
    assert final <= healthy * 1.02, (final, healthy)  # the bad batch left out, nothing else lost


def test_skip_reason_tells_a_nonfinite_norm_and_the_scaler_from_a_spike():
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    clipper = StepClipper(opt, 1.0, skip_spikes=SpikeGuard(warmup=5))
    for value in [1.0, 1.01, 0.99, 1.0, 1.02, 1.0]:
        p.grad = torch.full((4,), value)
        clipper.arm()
        opt.step()
        assert clipper.skip_reason.item() == 0
    p.grad = torch.full((4,), 1e4)
    clipper.arm()
    opt.step()
    assert (clipper.skipped.item(), clipper.skip_reason.item()) == (1.0, 2.0)
    p.grad = torch.full((4,), math.inf)
    clipper.arm()
    opt.step()
    assert clipper.skip_reason.item() == 1.0
    # A GradScaler's inf with a finite, ordinary norm: 1, not a spike.
    p.grad = torch.full((4,), 1.0)
    clipper.arm()
    opt.found_inf = torch.tensor(1.0)
    opt.grad_scale = None
    opt.step()
    assert (clipper.skipped.item(), clipper.skip_reason.item()) == (1.0, 1.0)


def test_an_optimizer_that_cannot_fold_zeroes_a_spike_and_says_so():
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([p], lr=0.1)  # not fused
    with pytest.warns(UserWarning, match="A spike zeroes its gradients"):
        clipper = StepClipper(opt, 1e9, skip_spikes=SpikeGuard(warmup=5))
    for i in range(6):
        p.grad = torch.full((4,), 1.0 + 0.01 * i)
        clipper.arm()
        opt.step()
    p.grad = torch.full((4,), 1e5)
    before = p.detach().clone()
    clipper.arm()
    assert torch.equal(p.grad, torch.zeros(4)) and clipper.guard.flagged.item() == 1
    opt.step()
    assert torch.equal(p.detach(), before)  # plain SGD: a zero gradient is a skip
    with pytest.raises(ValueError, match="cannot apply the clip"):
        StepClipper(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), 1.0, skip_spikes=True, strict=True)


def test_no_value_is_read_on_the_host(monkeypatch):
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    clipper = StepClipper(opt, 1.0, skip_spikes=True)
    monitor = fastnorm.GradNormMonitor(1000, [])
    x = torch.randn(4, 8)

    def step(scale):
        loss = model(x * scale).square().mean()
        loss.backward()
        norm = clipper.arm(loss=loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        monitor.update(norm, loss=loss.detach(), skipped=clipper.skip_reason)

    for _ in range(2):
        step(1.0)

    def read(*args, **kwargs):
        raise AssertionError("a tensor value was read on the host")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
            m.setattr(torch.Tensor, name, read)
        for i in range(40):
            step(1e4 if i == 30 else 1.0)
    assert clipper.guard.spikes.item() == 1
    monitor.close()


def test_the_same_inputs_skip_the_same_steps_at_any_thread_count():
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            runs.append(_train("adamw", 280, bad={220, 270})[0])
    finally:
        torch.set_num_threads(threads)
    assert runs[0] == runs[1] and [i for i, r in enumerate(runs[0]) if r] == [220, 270]


def test_the_rule_compiles_without_a_graph_break():
    guard = SpikeGuard(warmup=4)

    def step(norm, loss):
        flag = guard.decide(norm, loss)
        guard.commit(flag)
        return flag

    compiled = torch.compile(step, backend="eager", fullgraph=True)
    eager_guard = SpikeGuard(warmup=4)
    for i, v in enumerate([1.0, 1.1, 0.9, 1.0, 1.05, 50.0, 1.0]):
        norm, loss = torch.tensor(v), torch.tensor(2.0 - 0.01 * i)
        expected = eager_guard.decide(norm, loss)
        eager_guard.commit(expected)
        assert compiled(norm, loss).item() == expected.item(), i
    assert guard.spikes.item() == eager_guard.spikes.item() == 1


# ----------------------------------------------------------------------------
# Counted and said: the monitor, its loggers, the diagnosis
# ----------------------------------------------------------------------------


def test_the_monitor_logs_the_spike_code_counts_it_and_the_console_says_it(tmp_path):
    console = io.StringIO()
    path = tmp_path / "metrics.jsonl"
    monitor = fastnorm.GradNormMonitor(
        25, [fastnorm.ConsoleLogger(console), fastnorm.JsonlLogger(str(path))], max_norm=10.0
    )
    reasons = []
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    clipper = StepClipper(opt, 10.0, skip_spikes=True)
    x = torch.randn(64, 16)
    for i in range(50):
        loss = model(x * (1e3 if i in (30, 31) else 1.0)).square().mean()
        loss.backward()
        norm = clipper.arm(loss=loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        monitor.update(norm, loss=loss.detach(), skipped=clipper.skip_reason)
        reasons.append(clipper.skip_reason.item())
    monitor.close()
    assert [i for i, r in enumerate(reasons) if r] == [30, 31]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    logged = {r["step"]: r["gradient_norm_skipped"] for r in rows if "gradient_norm_skipped" in r}
    assert logged[30] == logged[31] == 2.0 and logged[29] == 0.0
    last = next(r for r in rows if r["step"] == 49 and "gradient_norm_skipped_steps" in r)
    assert last["gradient_norm_skipped_steps"] == 2 and last["gradient_norm_spike_skipped_steps"] == 2
    assert "2 skipped (2 for a spike)" in console.getvalue()
    # Read back, the flags say the same: two spike skips, the losses of the bad batches left out.
    from fastnorm.monitoring.command import diagnose_series

    d = diagnose_series(fastnorm.read_series(path))
    skipped = [e for e in d.events if e.kind == "skipped"]
    assert skipped and "2 step(s) skipped for a spike" in skipped[0].detail
    assert d.verdict == "stable"


def test_a_guard_that_skips_everything_is_a_stalled_run():
    steps = list(range(300))
    norms = [1.0 + 0.01 * (i % 7) for i in range(200)] + [50.0 + 0.1 * (i % 3) for i in range(100)]
    flags = [0] * 200 + [2] * 100
    d = fastnorm.diagnose(steps, norms, skipped=(steps, flags))
    assert d.verdict == "stalled"
    event = next(e for e in d.events if e.kind == "stalled")
    assert event.start_step == 200 and "skipped every step" in event.detail
    # A short run of spike skips that ended is counted, not a fault.
    flags = [0] * 200 + [2] * 3 + [0] * 97
    norms = [1.0 + 0.01 * (i % 7) for i in range(300)]
    d = fastnorm.diagnose(steps, norms, skipped=(steps, flags))
    assert d.verdict == "stable" and any(e.kind == "skipped" for e in d.events)


def test_update_takes_the_spike_code_and_refuses_others():
    monitor = fastnorm.GradNormMonitor(10, [])
    monitor.update(torch.tensor(1.0), skipped=2)
    with pytest.raises(ValueError, match="0, 1 or 2"):
        monitor.update(torch.tensor(1.0), skipped=3)
    monitor.close()


def test_a_learning_rate_jump_is_flagged_and_a_warmup_or_a_lasting_change_is_not():
    guard = SpikeGuard(warmup=20, release_after=5)
    norm = torch.tensor(1.0)
    # A linear warm-up from 0 and a cosine decay: no flag.
    lrs = [1e-3 * i / 100 for i in range(100)] + [1e-3 * 0.5 * (1 + math.cos(math.pi * i / 200)) for i in range(200)]
    assert [guard.decide(norm, lrs=[lr, 2 * lr]).item() for lr in lrs] == [0.0] * len(lrs)
    # One step at 100x in one group: flagged; the next, back on the schedule, is not.
    assert guard.decide(norm, lrs=[1e-3, 100 * 2e-3]).item() == 1
    assert guard.decide(norm, lrs=[1e-3, 2e-3]).item() == 0
    # A lasting jump: flagged release_after times in a row, then the new level is the run's.
    flags = [guard.decide(norm, lrs=[0.5, 1.0]).item() for _ in range(8)]
    assert flags == [1.0] * 5 + [0.0] * 3
    # A group whose rate is not a host number (None: a Tensor, which StepClipper does not read) is passed
    # over; lr_jump=None reads none.
    assert guard.decide(norm, lrs=[None, None]).item() == 0
    off = SpikeGuard(lr_jump=None)
    assert all(off.decide(norm, lrs=[1e-3]).item() == 0 for _ in range(30))
    assert off.decide(norm, lrs=[1.0]).item() == 0
    for bad, error in [(1.0, ValueError), (math.inf, ValueError), ("10", TypeError), (True, TypeError)]:
        with pytest.raises(error, match="lr_jump"):
            SpikeGuard(lr_jump=bad)


def test_a_step_set_to_a_blip_of_the_learning_rate_is_skipped_by_the_fused_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    clipper = StepClipper(opt, 1.0, skip_spikes=True)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    reasons = []
    for i in range(40):
        opt.param_groups[0]["lr"] = 0.1 if i == 30 else 1e-3  # set before arm(), as a scheduler does
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        clipper.arm(loss=loss.detach())
        before = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()["state"]))
        opt.step()
        opt.zero_grad(set_to_none=True)
        reasons.append(clipper.skip_reason.item())
        if i == 30:
            assert all(torch.equal(v, model.state_dict()[k]) for k, v in before[0].items())
            assert all(torch.equal(v, opt.state_dict()["state"][p][k]) for p, s in before[1].items() for k, v in s.items())
    assert [i for i, r in enumerate(reasons) if r] == [30] and reasons[30] == 2.0


def test_a_positive_loss_is_judged_by_its_log_so_a_heavy_tail_is_no_spike():
    # The loss of a classifier that fits: near 0, log-normal. Its ratios are ordinary; read raw,
    # a 3-sigma batch is 7 standard deviations above the mean.
    rng = random.Random(5)
    guard = SpikeGuard()
    norm = torch.tensor(1.0)
    losses = [0.01 * math.exp(rng.gauss(0.0, 0.8)) for _ in range(2000)]
    flags = [guard.decide(norm, torch.tensor(v, dtype=torch.float64)).item() for v in losses]
    assert sum(flags) == 0
    # A bad batch of 1000x is still one (ln 1000 = 8.6 of these standard deviations).
    assert guard.decide(norm, torch.tensor(10.0, dtype=torch.float64)).item() == 1


def _guard_runs():
    """benchmarks/guard_runs.py, imported from its file (benchmarks/ is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "guard_runs.py"
    spec = importlib.util.spec_from_file_location("guard_runs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("guard_runs", module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fault", ["poison", "lr_blip"])
def test_the_injected_runs_of_one_family_short_guarded_and_not(fault, one_thread):
    runs = _guard_runs()
    steps, at = 300, 150
    healthy = runs.train("mlp", 0, steps, fault_at=at)
    unguarded = runs.train("mlp", 0, steps, fault, guarded=False, fault_at=at)
    guarded = runs.train("mlp", 0, steps, fault, guarded=True, fault_at=at)
    assert guarded.first_skips == [at] and guarded.skipped_for_spike == 1 and unguarded.skipped_for_spike == 0
    # The fault undid what the run had learned; skipped, it never reached the weights.
    assert unguarded.after_fault_loss > 3 * healthy.after_fault_loss
    assert guarded.after_fault_loss < 1.1 * healthy.after_fault_loss
    assert abs(guarded.final_loss / healthy.final_loss - 1) < 0.05
    assert healthy.skipped_for_spike == 0


@pytest.mark.cuda
def test_the_guard_captured_in_a_cuda_graph_replays_the_eager_flags():
    device = torch.device("cuda")
    norms = _series(240, 3, [(150, 1e3), (200, 50.0)])
    eager, graphed = SpikeGuard(), SpikeGuard()
    static = torch.zeros((), device=device)
    expected = []
    for v in norms:
        expected.append(eager.decide(torch.tensor(v, device=device)).item())
        eager.commit(eager.flagged)
    got = []
    # Three eager steps allocate the state; the step is then captured once and replayed.
    for v in norms[:3]:
        got.append(graphed.decide(torch.tensor(v, device=device)).item())
        graphed.commit(graphed.flagged)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flag = graphed.decide(static)
        graphed.commit(flag)
    torch.cuda.set_sync_debug_mode("error")  # a replay reads nothing on the host
    try:
        flags = []
        for v in norms[3:]:
            static.fill_(v)
            graph.replay()
            flags.append(flag.clone())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    got += torch.stack(flags).tolist()
    assert got == expected and sum(expected) == 2
