"""timm and LightlyTrain train with fastnorm.patch() as with torch (see stack_harness).

Both need torchvision, whose PyPI build links CUDA and does not import beside
the CPU build of torch that CI installs: these tests skip there, and
``python tools/stacks.py`` runs them in an environment of their own (torch
2.14.1 and torchvision 0.29.1).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

WHY = "needs torchvision, whose PyPI build links CUDA and cannot sit beside CPU torch: run tools/stacks.py"
timm = pytest.importorskip("timm", reason=WHY)

from timm.optim import create_optimizer_v2  # noqa: E402
from timm.utils import NativeScaler, dispatch_clip_grad  # noqa: E402

import fastnorm  # noqa: E402
from stack_harness import Monitor, Run, Spy, assert_runs_agree, params_of, run_three  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 8


def resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("resnet10t", pretrained=False, num_classes=5)


def images(seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(STEPS):
        yield torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 5, (8,), generator=g)


@pytest.mark.parametrize("scaler", [False, True], ids=["dispatch_clip_grad", "NativeScaler"])
def test_timm_clips_with_fastnorm(one_thread, scaler):
    """timm's train.py clips through ``dispatch_clip_grad``, inside its ``NativeScaler`` with AMP."""

    def train(run, spy, monitor):
        model = resnet()
        optimizer = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
        loss_scaler = NativeScaler(device="cpu") if scaler else None
        losses = []
        for x, y in images(1):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if loss_scaler is not None:
                loss_scaler(loss, optimizer, clip_grad=1.0, clip_mode="norm", parameters=model.parameters())
            else:
                loss.backward()
                dispatch_clip_grad(model.parameters(), 1.0, mode="norm")
                optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return Run(losses, params_of(model), spy)

    runs = run_three(train)
    assert_runs_agree(runs, amplified=1e-5)  # BatchNorm nets amplify rounding (measured: 1.8e-7)
    assert runs["fastnorm"].spy.count("clip_grad_norm_") == STEPS
    assert runs["fastnorm"].monitor.values() == runs["fastnorm"].norms


lightly_train = pytest.importorskip("lightly_train", reason=WHY)
from lightly_train._task_models.image_classification import train_model as lightly_model  # noqa: E402


@pytest.fixture(scope="module")
def lightly_data(tmp_path_factory):
    """Two classes of random 32x32 images, and a random resnet10t backbone to start from (no download)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("lightly")
    g = torch.Generator().manual_seed(3)
    for split in ("train", "val"):
        for name in ("cat", "dog"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(8):
                pixels = torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8).numpy()
                Image.fromarray(pixels).save(folder / f"{i}.png")
    torch.manual_seed(0)
    torch.save(timm.create_model("resnet10t", pretrained=False, num_classes=0).state_dict(), root / "b.pt")
    return root


def lightly_fit(root: Path, out: Path, clip: float) -> dict:
    os.environ["LIGHTLY_TRAIN_EVENTS_DISABLED"] = "1"
    lightly_train.train_image_classification(
        out=out,
        overwrite=True,
        data={"train": root / "train", "val": root / "val", "classes": {0: "cat", 1: "dog"}},
        model="timm/resnet10t",
        steps=STEPS,
        batch_size=4,
        num_workers=0,
        accelerator="cpu",
        devices=1,
        precision="32-true",
        seed=0,
        logger_args={"tensorboard": None},
        model_args={"backbone_weights": root / "b.pt", "gradient_clip_val": clip, "lr": 1e-3},
        transform_args={"image_size": (32, 32)},
    )
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return {k: v for k, v in state["train_model"].items() if v.is_floating_point()}


@pytest.fixture(autouse=True)
def seeded_augmentations(monkeypatch):
    """LightlyTrain's albumentations pipelines seed themselves from the OS (seed=None): seeded
    here, so that the runs compared see the same batches."""
    from albumentations.core.composition import BaseCompose

    seed = BaseCompose.set_random_seed
    monkeypatch.setattr(BaseCompose, "set_random_seed", lambda self, s: seed(self, 0 if s is None else s))


class Losses:
    """Each training step's loss, read from LightlyTrain's model."""

    def __init__(self, monkeypatch) -> None:
        self.values: list[float] = []
        step = lightly_model.ImageClassificationTrain.training_step

        def recorded(model, *args, **kwargs):
            result = step(model, *args, **kwargs)
            self.values.append(result.loss.item())
            return result

        monkeypatch.setattr(lightly_model.ImageClassificationTrain, "training_step", recorded)


def test_lightly_train_with_gradient_clip_val_clips_with_fastnorm(
    lightly_data, tmp_path, monkeypatch, one_thread
):
    def train(run, spy, monitor):
        with monkeypatch.context() as m:
            losses = Losses(m)
            params = lightly_fit(lightly_data, tmp_path / run, clip=1.0)
        return Run(losses.values, params, spy)

    runs = run_three(train)
    # A BatchNorm net with Adam over 8 steps of 4 accumulated batches: its norms drift from
    # torch's by up to 2.3e-5 (measured), the float64 recipe's stay the same bit for bit.
    assert_runs_agree(runs, amplified=1e-4)
    ours = runs["fastnorm"]
    assert ours.spy.count("clip_grad_norm_") == STEPS  # Fabric's clip_gradients, every step
    assert ours.monitor.values() == ours.norms


def test_lightly_train_without_clipping_hands_every_steps_norm(
    lightly_data, tmp_path, monkeypatch, one_thread
):
    """gradient_clip_val=0: LightlyTrain's own per-parameter loop, rebound in the module that imported it."""
    original = lightly_model.total_gradient_norm
    theirs: list[float] = []

    def recorded(parameters):
        norm = original(parameters)
        theirs.append(norm.item())
        return norm

    with monkeypatch.context() as m:
        m.setattr(lightly_model, "total_gradient_norm", recorded)
        torch_params = lightly_fit(lightly_data, tmp_path / "torch", clip=0.0)
    monitor = Monitor()
    spy = Spy()
    with fastnorm.patch(monitor=monitor) as handle, spy.watching():
        assert f"{lightly_model.__name__}.total_gradient_norm" in handle.reached
        ours = lightly_fit(lightly_data, tmp_path / "fastnorm", clip=0.0)
    assert lightly_model.total_gradient_norm is original
    assert spy.calls == []  # no torch clip function: the norm is LightlyTrain's own helper's
    assert len(theirs) == len(monitor.norms) == STEPS
    assert monitor.values() == pytest.approx(theirs, rel=1e-5)
    for name, value in torch_params.items():  # the norm is only logged: the training is the same
        assert torch.equal(ours[name], value), name
