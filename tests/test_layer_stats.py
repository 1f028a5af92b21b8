"""Each layer's gradient statistics from the norm's pass (LayerGradNorms.with_stats), kept by the monitor
over every step of its window (GradNormMonitor.update(layer_stats=)), logged, read back and reported."""

import math

import pytest
import torch

import fastnorm
from fastnorm.monitoring import layer_stats
from fastnorm.monitoring.command import diagnose_series
from fastnorm.monitoring.diagnosis.events import layers_lines
from fastnorm.stats import COLUMNS
from helpers import CountSyncs

SHAPES = {  # name -> (shape, dtype): two layers of two tensors, one of one, in float32 and bfloat16
    "enc.weight": ((37, 29), torch.float32),
    "enc.bias": ((29,), torch.float32),
    "mid.weight": ((300,), torch.bfloat16),
    "dec.weight": ((17, 5), torch.float32),
    "dec.bias": ((5,), torch.bfloat16),
}
NAMES = ["enc", "mid", "dec"]


def parameters(gen):
    out = []
    for name, (shape, dtype) in SHAPES.items():
        p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
        p.grad = torch.randn(shape, generator=gen).to(dtype)
        out.append((name, p))
    return out


def poison(params, gen, step_faults):
    """Writes each fault (tensor index, kind) into fresh random positions of the gradients."""
    for index, kind in step_faults:
        g = params[index][1].grad.view(-1)
        tiny, big = torch.finfo(g.dtype).tiny, torch.finfo(g.dtype).max
        at = torch.randint(0, g.numel(), (3,), generator=gen)
        g[at] = {"nan": math.nan, "inf": -math.inf, "zero": 0.0, "sub": tiny / 4, "big": big / 8}[kind]


def reference(params):
    """float64 per-layer rows of COLUMNS, by torch on the host."""
    rows = {n: [0.0] * len(COLUMNS) for n in NAMES}
    for name, p in params:
        g = p.grad
        info = torch.finfo(g.dtype)
        x = g.double()
        finite = torch.isfinite(x)
        r = rows[name.split(".")[0]]
        r[0] += float(x.pow(2).sum())
        r[1] = max(r[1], float(x[finite].abs().max()) if finite.any() else 0.0)
        r[2] += int((~finite).sum())
        r[3] += int((x == 0).sum())
        r[4] += int(((x != 0) & (x.abs() < info.tiny)).sum())
        r[5] += int((finite & (x.abs() > info.max / 16)).sum())
    return rows


def test_the_monitor_reads_its_columns_in_the_order_the_statistics_give_them():
    assert layer_stats.GIVEN == COLUMNS


@pytest.mark.parametrize("p", [2.0, math.inf])
def test_with_stats_gives_the_total_the_layers_and_their_statistics_of_one_pass(p):
    gen = torch.Generator().manual_seed(5)
    params = parameters(gen)
    poison(params, gen, [(0, "zero"), (1, "sub"), (2, "sub"), (2, "big"), (3, "zero"), (4, "big")])
    layers = fastnorm.LayerGradNorms(params, norm_type=p)
    total, per_layer, stats = layers.with_stats()
    assert torch.equal(total, fastnorm.total_norm([q for _, q in params], p))
    want = reference(params)
    for i, name in enumerate(NAMES):
        assert stats[i, 2:].tolist() == want[name][2:], name  # counts exact
        assert stats[i, 1].item() == want[name][1], name
        assert stats[i, 0].item() == pytest.approx(want[name][0], rel=1e-6), name
    _, plain = layers()
    torch.testing.assert_close(per_layer, plain, rtol=1e-6, atol=0)
    poison(params, gen, [(3, "nan"), (1, "inf")])
    _, per_layer, stats = layers.with_stats()
    _, plain = layers()
    assert stats[:, 2].tolist() == [3.0, 0.0, 3.0]
    assert per_layer.isnan().tolist() == [False, False, True] and per_layer[0].isinf()
    assert per_layer.isnan().tolist() == plain.isnan().tolist()
    assert per_layer.isinf().tolist() == plain.isinf().tolist()


def test_with_stats_refuses_a_norm_its_rows_do_not_hold():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="norm_type is 1; the statistics give"):
        fastnorm.LayerGradNorms(parameters(gen), norm_type=1.0).with_stats()
    with pytest.raises(ValueError, match="norm_type is -inf"):
        fastnorm.LayerGradNorms(parameters(gen), norm_type="-inf").with_stats()


def run_windows(faults, steps, n, seed=11, loggers=()):
    """A monitor of window ``n`` fed ``steps`` steps; ``faults``: step -> [(tensor, kind)]. Returns the
    monitor (closed), each step's reference rows, and the layer windows seen after each flush."""
    gen = torch.Generator().manual_seed(seed)
    monitor = fastnorm.GradNormMonitor(n, list(loggers), layer_names=NAMES, warn=False)
    seen, rows = [], []
    for step in range(steps):
        params = parameters(gen)
        poison(params, gen, faults.get(step, []))
        layers = fastnorm.LayerGradNorms(params)
        total, per_layer, stats = layers.with_stats()
        rows.append(reference(params))
        monitor.update(total, step=100 + step, layers=per_layer, layer_stats=stats)
        if (step + 1) % n == 0:
            seen.append(monitor.layer_window)
    monitor.close()
    return monitor, rows, seen


def expected_window(rows, first_step):
    out = {}
    for name in NAMES:
        col = [r[name] for r in rows]
        bad = [i for i, r in enumerate(col) if r[2] > 0]
        out[name] = {
            "max_abs": max(r[1] for r in col),
            "nonfinite": sum(r[2] for r in col),
            "zeros": sum(r[3] for r in col),
            "subnormal": sum(r[4] for r in col),
            "overflow": sum(r[5] for r in col),
            "nonfinite_steps": float(len(bad)),
            "overflow_steps": float(sum(r[5] > 0 for r in col)),
            "first_nonfinite": first_step + bad[0] if bad else None,
        }
    return out


def test_every_step_of_the_window_is_counted_and_the_next_window_starts_afresh():
    faults = {1: [(3, "nan")], 2: [(0, "inf"), (2, "big")], 4: [(3, "nan"), (1, "zero")], 6: [(4, "sub")]}
    monitor, rows, seen = run_windows(faults, 12, 5)
    assert len(seen) == 2
    assert seen[0].steps == 5 and seen[0].layers == expected_window(rows[:5], 100)
    assert seen[1].steps == 5 and seen[1].layers == expected_window(rows[5:10], 105)
    assert monitor.layer_window.steps == 2  # close() flushed the partial third window
    assert monitor.layer_window.layers == expected_window(rows[10:], 110)
    assert not seen[1].metrics()  # a subnormal is no finding
    keys = seen[0].metrics()
    assert keys["locate_layers_nonfinite/dec"] == 2 and keys["locate_layers_nonfinite_first/dec"] == 101
    assert keys["locate_layers_nonfinite/enc"] == 1 and keys["locate_layers_nonfinite_first/enc"] == 102
    assert keys["locate_layers_overflow/mid"] == 1 and keys["locate_layers_nonfinite_steps"] == 5
    assert seen[0].report().startswith(
        "layers: `dec`'s gradient went non-finite first, at step 101, on 2 of the window's 5 steps; "
        "also non-finite: `enc` (1 step)"
    )


def test_steps_without_statistics_leave_the_window_as_it_is():
    gen = torch.Generator().manual_seed(3)
    monitor = fastnorm.GradNormMonitor(4, [], layer_names=NAMES, warn=False)
    params = parameters(gen)
    poison(params, gen, [(2, "nan")])
    total, _, stats = fastnorm.LayerGradNorms(params).with_stats()
    monitor.update(total, layer_stats=stats)
    for _ in range(3):
        monitor.update(1.0)
    assert monitor.layer_window.steps == 1
    assert monitor.layer_window.layers["mid"]["first_nonfinite"] == 0
    for _ in range(4):
        monitor.update(1.0)
    assert monitor.layer_window is None  # no step of that window gave any


def test_no_host_read_between_windows():
    gen = torch.Generator().manual_seed(2)
    params = parameters(gen)
    layers = fastnorm.LayerGradNorms(params)
    monitor = fastnorm.GradNormMonitor(8, [], layer_names=NAMES, warn=False)
    total, per_layer, stats = layers.with_stats()
    monitor.update(total, layers=per_layer, layer_stats=stats)  # the first update allocates
    with CountSyncs() as counter:
        for _ in range(6):
            total, per_layer, stats = layers.with_stats()
            monitor.update(total, layers=per_layer, layer_stats=stats)
    assert counter.count == 0 and monitor.transfers == 0
    monitor.close()
    assert monitor.transfers == 1


def test_the_finding_is_logged_diagnosed_and_read_back(tmp_path):
    path = tmp_path / "metrics.jsonl"
    faults = {23: [(2, "nan")], 24: [(2, "nan"), (0, "nan")], 30: [(4, "big")]}
    monitor, _, _ = run_windows(faults, 40, 10, loggers=[fastnorm.JsonlLogger(str(path))])
    line = "layers: `mid`'s gradient went non-finite first, at step 123, on 2 of the window's 10 steps"
    located = monitor.diagnosis.located
    assert any(x.startswith(line) for x in located), located
    assert any(x.startswith("layers: `dec`'s gradient came within 16x") for x in located), located
    assert "  where: " + line in monitor.diagnosis.report()
    offline = diagnose_series(fastnorm.read_series(path))
    assert offline.located == located


def test_many_layers_gone_non_finite_are_named_up_to_a_few_and_counted():
    names = [f"block{i}" for i in range(20)]
    monitor = fastnorm.GradNormMonitor(2, [], layer_names=names, warn=False)
    stats = torch.zeros(20, 6, dtype=torch.float64)
    stats[:, 2] = 1.0
    monitor.update(float("nan"), layer_stats=stats)
    monitor.update(float("nan"), layer_stats=stats)
    keys = monitor.layer_window.metrics()
    assert sum(k.startswith("locate_layers_nonfinite/") for k in keys) == layer_stats.NAMED
    assert keys["locate_layers_nonfinite_more"] == 20 - layer_stats.NAMED
    (line,) = layers_lines(keys)
    assert line.startswith("layers: gradients went non-finite first at step 0 in 8 layers at once: `block0`")
    assert line.endswith("; also non-finite: 12 more layers")
    monitor.close()


@pytest.mark.parametrize(
    "value, error, match",
    [
        ([[0.0] * 6] * 3, TypeError, "layer_stats must be a Tensor"),
        (torch.zeros(3, 5), ValueError, r"shape \(3, 6\)"),
        (torch.zeros(6), ValueError, r"shape \(3, 6\)"),
        (torch.zeros(3, 6, dtype=torch.int64), TypeError, "dense floating tensor"),
        (torch.zeros(3, 6, device="meta"), TypeError, "meta"),
    ],
)
def test_bad_layer_stats_are_refused_before_anything_is_recorded(value, error, match):
    monitor = fastnorm.GradNormMonitor(4, [], layer_names=NAMES, warn=False)
    with pytest.raises(error, match=match):
        monitor.update(1.0, layer_stats=value)
    monitor.update(2.0)
    monitor.flush()
    assert monitor.layer_window is None and monitor.transfers == 1
    with pytest.raises(ValueError, match="layer_stats needs layer_names"):
        fastnorm.GradNormMonitor(4, [], warn=False).update(1.0, layer_stats=torch.zeros(0, 6))


def test_the_layer_named_first_is_the_earliest_not_the_most_frequent():
    keys = {
        "locate_layers_nonfinite_steps": 50.0,
        "locate_layers_nonfinite/blocks.7.attn.qkv": 1.0,
        "locate_layers_nonfinite_first/blocks.7.attn.qkv": 1201.0,
        "locate_layers_nonfinite/head": 3.0,
        "locate_layers_nonfinite_first/head": 1230.0,
    }
    assert layers_lines(keys) == (
        "layers: `blocks.7.attn.qkv`'s gradient went non-finite first, at step 1201, on 1 of the window's "
        "50 steps; also non-finite: `head` (3 steps)",
    )
    assert layers_lines({"locate_layers_nonfinite/x": "a lot"}) == ()  # a key that does not parse


def test_the_docs_example_names_the_layer_and_its_steps(capsys):
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    runpy.run_path(str(root / "examples" / "layer_stats_window.py"))
    out = capsys.readouterr().out
    line = "layers: `2`'s gradient went non-finite first, at step 7, on 2 of the window's 20 steps"
    assert out.startswith(line + "\n")
    assert "  where: " + line in out
    assert "```\n" + out in (root / "docs" / "monitoring.md").read_text()  # the page shows what it prints
