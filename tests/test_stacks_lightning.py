"""Lightning's Trainer and Fabric train with fastnorm.patch() as with torch (see stack_harness)."""

from __future__ import annotations

import pytest
import torch

lightning = pytest.importorskip("lightning")
from lightning.pytorch.utilities import grad_norm  # noqa: E402  (bound at import, as users write it)

from fastnorm.integrations import patch as patching  # noqa: E402
from stack_harness import Run, assert_runs_agree, params_of, run_three  # noqa: E402

STEPS = 20


def data(seed: int = 0) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(STEPS * 8, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 2)
    )


class Classifier(lightning.LightningModule):
    """A small classifier that keeps each step's loss and logs Lightning's own grad_norm."""

    def __init__(self) -> None:
        super().__init__()
        self.net = model()
        self.losses: list[float] = []
        self.grad_totals: list[float] = []
        self.grad_norm_fn = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.grad_norm_fn = grad_norm
        norms = grad_norm(self, norm_type=2)  # the module global: rebound by the patch
        self.grad_totals.append(float(norms["grad_2.0_norm_total"]))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def test_lightning_trainer_clips_with_fastnorm(tmp_path, one_thread):
    def train(run, spy, monitor):
        torch.manual_seed(0)
        module = Classifier()
        trainer = lightning.Trainer(
            max_steps=STEPS,
            gradient_clip_val=0.5,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        trainer.fit(module, data())
        served = module.grad_norm_fn.__module__
        return Run(
            module.losses, params_of(module), spy, extra={"grad_totals": module.grad_totals, "by": served}
        )

    runs = run_three(train)
    assert_runs_agree(runs)
    ours = runs["fastnorm"]
    assert ours.spy.count("clip_grad_norm_") == STEPS  # every step clipped by fastnorm
    assert ours.monitor.values() == ours.norms  # and handed to the monitor
    assert ours.extra["by"] == patching.__name__  # Lightning's grad_norm, rebound where it was imported
    assert runs["torch"].extra["by"] == "lightning.pytorch.utilities.grads"
    assert ours.extra["grad_totals"] == pytest.approx(runs["torch"].extra["grad_totals"], rel=1e-5)


@pytest.mark.parametrize("error_if_nonfinite", [True, False])
def test_fabric_clip_gradients_uses_fastnorm(error_if_nonfinite, one_thread):
    from lightning.fabric import Fabric

    def train(run, spy, monitor):
        fabric = Fabric(accelerator="cpu", devices=1)
        torch.manual_seed(0)
        net = model()
        optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
        net, optimizer = fabric.setup(net, optimizer)
        losses = []
        for x, y in fabric.setup_dataloaders(data()):
            loss = torch.nn.functional.cross_entropy(net(x), y)
            fabric.backward(loss)
            fabric.clip_gradients(net, optimizer, max_norm=0.5, error_if_nonfinite=error_if_nonfinite)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return Run(losses, params_of(net), spy)

    runs = run_three(train)
    assert_runs_agree(runs)
    assert runs["fastnorm"].spy.count("clip_grad_norm_") == STEPS
    assert runs["fastnorm"].monitor.values() == runs["fastnorm"].norms


def test_the_fabric_recipe_of_the_trainers_page_logs_every_step(tmp_path, monkeypatch, one_thread):
    import json

    from lightning.fabric import Fabric
    from test_docs import ROOT, blocks, section

    import fastnorm

    text = section(ROOT / "docs" / "trainers.md", "Every step's norm from inside a trainer")
    (recipe,) = [code for code in blocks(text, "python") if "fabric.clip_gradients" in code]
    fabric = Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(0)
    net = model()
    model_, optimizer = fabric.setup(net, torch.optim.AdamW(net.parameters(), lr=3e-3))
    monkeypatch.chdir(tmp_path)
    namespace = {"fastnorm": fastnorm, "torch": torch, "fabric": fabric, "model": model_}
    namespace.update(optimizer=optimizer, loader=fabric.setup_dataloaders(data()))
    exec(compile(recipe, "docs/trainers.md", "exec"), namespace)
    rows = [json.loads(line) for line in (tmp_path / "run" / "norms.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "gradient_norm" in r] == list(range(1, STEPS + 1))
    assert namespace["monitor"].closed
