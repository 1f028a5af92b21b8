"""The Lightning callback: clips with fastnorm, logs every step through the trainer's loggers."""

import csv
import math

import pytest
import torch

from fastnorm import JsonlLogger, Logger, MonitorWarning, read_series

lightning = pytest.importorskip("lightning")
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from fastnorm.integrations.lightning import GradNormCallback  # noqa: E402


class Regression(lightning.LightningModule):
    """A tiny MLP that records torch's own norm of every step's gradients, before and after clipping."""

    def __init__(self, fail_at=None, poison_at=None):
        super().__init__()
        self.poison_at = poison_at
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.fail_at = fail_at
        self.before, self.after, self.losses = [], [], []

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at:
            raise RuntimeError("the run dies here")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def on_after_backward(self):
        if self.global_step == self.poison_at:  # one NaN in the last layer's gradient; SGD spreads it
            self.net[2].weight.grad[0, 0] = float("nan")
        self.before.append(torch.nn.utils.get_total_norm([p.grad for p in self.parameters()]).item())

    def on_before_optimizer_step(self, optimizer):  # runs after the callbacks' hook
        self.after.append(torch.nn.utils.get_total_norm([p.grad for p in self.parameters()]).item())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=g)
        return torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x, 3 * x.sum(1, keepdim=True)), batch_size=8
        )


def fit(tmp_path, callback, steps=23, fail_at=None, poison_at=None, **trainer_kwargs):
    torch.manual_seed(0)
    model = Regression(fail_at, poison_at)
    trainer = lightning.Trainer(
        max_steps=steps,
        logger=CSVLogger(tmp_path, name="csv"),
        callbacks=[callback],
        accelerator="cpu",
        log_every_n_steps=5,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer_kwargs,
    )
    trainer.fit(model)
    return model, trainer


def logged(trainer):
    with open(f"{trainer.logger.log_dir}/metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {int(r["step"]): r for r in rows if r.get("gradient_norm")}


def test_clips_and_logs_every_step(tmp_path):
    model, trainer = fit(
        tmp_path, GradNormCallback(max_norm=1.0, loggers=[JsonlLogger(tmp_path / "m.jsonl")])
    )
    rows = logged(trainer)
    assert sorted(rows) == list(range(23))
    assert [float(rows[s]["gradient_norm"]) for s in range(23)] == pytest.approx(model.before, rel=1e-5)
    assert max(model.before) > 1.0  # the test clips something
    assert all(a <= 1.0 + 1e-5 for a in model.after)
    clipped = sum(b > 1.0 for b in model.before[:5])
    assert float(rows[4]["gradient_norm_clipped_fraction"]) == clipped / 5
    # The same numbers, with each step's loss, went to fastnorm's own logger; the CSV reads back too.
    series = read_series(tmp_path / "m.jsonl")
    assert series.values == pytest.approx(model.before, rel=1e-5)
    assert series.loss.key == "gradient_norm_loss"
    assert series.loss.steps == tuple(range(23)) and series.loss.values == pytest.approx(
        model.losses, rel=1e-6
    )
    assert read_series(f"{trainer.logger.log_dir}/metrics.csv").values == pytest.approx(
        model.before, rel=1e-5
    )


def test_per_layer_norms_once_per_window(tmp_path):
    model, trainer = fit(tmp_path, GradNormCallback(per_layer=True, log_every_n_steps=10), steps=20)
    rows = logged(trainer)
    layer_steps = sorted(s for s, r in rows.items() if r.get("gradient_norm_layer/net.0"))
    assert layer_steps == [9, 19]
    total = float(rows[19]["gradient_norm"])
    parts = [float(rows[19][f"gradient_norm_layer/{name}"]) for name in ("net.0", "net.2")]
    assert math.hypot(*parts) == pytest.approx(total, rel=1e-5)
    assert total == pytest.approx(model.before[19], rel=1e-5)


def test_layer_stats_name_the_module_that_went_non_finite_first(tmp_path):
    callback = GradNormCallback(per_layer=True, layer_stats=True, log_every_n_steps=10, diagnose=True)
    model, trainer = fit(tmp_path, callback, steps=20, poison_at=13)
    window = callback.monitor.layer_window
    assert window.steps == 10
    assert window.layers["net.2"]["first_nonfinite"] == 13 and window.layers["net.2"]["nonfinite_steps"] == 7
    assert window.layers["net.0"]["first_nonfinite"] == 14 and window.layers["net.0"]["nonfinite_steps"] == 6
    row = logged(trainer)[19]
    assert float(row["gradient_norm_locate_layers_nonfinite_first/net.2"]) == 13
    line = "layers: `net.2`'s gradient went non-finite first, at step 13, on 7 of the window's 10 steps"
    assert any(x.startswith(line) for x in callback.monitor.diagnosis.located)


def test_an_exception_loses_nothing(tmp_path):
    callback = GradNormCallback(loggers=[JsonlLogger(tmp_path / "m.jsonl")])
    with pytest.raises(RuntimeError, match="dies here"):
        fit(tmp_path, callback, fail_at=13)
    assert read_series(tmp_path / "m.jsonl").steps == tuple(range(13))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_norm": "1"}, TypeError, "GradNormCallback: max_norm must be a number >= 0 or None, got '1'"),
        ({"max_norm": -1.0}, ValueError, "GradNormCallback: max_norm must be >= 0"),
        ({"log_every_n_steps": 0}, ValueError, "GradNormCallback: log_every_n_steps must be a positive int"),
        ({"per_layer": "yes"}, TypeError, "GradNormCallback: per_layer must be True or False"),
        ({"layer_depth": 1.5}, TypeError, "GradNormCallback: layer_depth must be a positive int"),
        ({"layer_stats": True}, ValueError, "GradNormCallback: layer_stats needs per_layer=True"),
        ({"layer_stats": True, "per_layer": True, "norm_type": 1}, ValueError, "layer_stats needs norm_type 2"),
        ({"layer_stats": 1}, TypeError, "GradNormCallback: layer_stats must be True or False"),
        ({"diagnose": None}, TypeError, "GradNormCallback: diagnose must be a bool or a Diagnoser"),
        ({"loggers": Logger()}, TypeError, "GradNormCallback: loggers must be a sequence"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        GradNormCallback(**kwargs)


def test_a_failing_logger_does_not_stop_training(tmp_path):
    class Down(Logger):
        def log_metrics(self, metrics, step):
            raise ConnectionError("tracking server down")

    with pytest.warns(MonitorWarning, match="tracking server down"):
        model, trainer = fit(tmp_path, GradNormCallback(loggers=[Down(), JsonlLogger(tmp_path / "m.jsonl")]))
    assert trainer.global_step == 23
    assert read_series(tmp_path / "m.jsonl").steps == tuple(range(23))


def test_refuses_to_clip_twice(tmp_path):
    with pytest.raises(ValueError, match="gradient_clip_val"):
        fit(tmp_path, GradNormCallback(max_norm=1.0), gradient_clip_val=1.0)


def test_the_trainers_precision_and_optimizer_reach_the_log(tmp_path):
    fit(tmp_path, GradNormCallback(loggers=[JsonlLogger(tmp_path / "m.jsonl")]))
    series = read_series(tmp_path / "m.jsonl")
    assert series.precision == "32-true"  # Lightning's own name, so the advice uses its wording
    assert series.lr.key == "gradient_norm_lr" and set(series.lr.values) == {0.5}
    assert series.optimizer["momentum"].values[0] == 0.0


class Stepped(Regression):
    """The Regression with a schedule that lowers the rate 10x after step 9, and each step's rate as used."""

    def __init__(self, fail_at=None):
        super().__init__(fail_at)
        self.used = []

    def on_before_optimizer_step(self, optimizer):
        super().on_before_optimizer_step(optimizer)
        self.used.append(optimizer.param_groups[0]["lr"])

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.5)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def test_the_learning_rate_is_dated_to_the_step_that_used_it(tmp_path):
    """The scheduler steps before the batch's end, where the step is recorded: the rate logged at each
    step is the one its optimizer step used, so the schedule's drop is dated to step 10, not 9."""
    torch.manual_seed(0)
    model = Stepped()
    trainer = lightning.Trainer(
        max_steps=15, logger=False, callbacks=[GradNormCallback(loggers=[JsonlLogger(tmp_path / "m.jsonl")])],
        accelerator="cpu", log_every_n_steps=5, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    lr = read_series(tmp_path / "m.jsonl").lr
    assert model.used[9:11] == pytest.approx([0.5, 0.05])
    assert dict(zip(lr.steps, lr.values)) == pytest.approx({0: 0.5, 4: 0.5, 9: 0.5, 10: 0.05, 14: 0.05})


def test_one_callback_logs_a_second_fit_and_a_fit_after_a_failed_one(tmp_path):
    """The loggers given are the user's: the first fit's end (or failure) flushes them, never closes
    them, and the next fit's monitor logs to them."""
    jsonl = JsonlLogger(tmp_path / "m.jsonl")
    callback = GradNormCallback(loggers=[jsonl])
    with pytest.raises(RuntimeError, match="dies here"):
        fit(tmp_path / "a", callback, steps=8, fail_at=5)
    assert read_series(tmp_path / "m.jsonl").steps == tuple(range(5))
    fit(tmp_path / "b", callback, steps=8)
    assert read_series(tmp_path / "m.jsonl").steps == tuple(range(8))  # the new run replaces the failed one
    fit(tmp_path / "c", callback, steps=6)
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert len([line for line in lines if '"gradient_norm":' in line]) == 5 + 8 + 6
    assert callback.monitor.closed and jsonl._file is not None
    jsonl.close()
