"""Optional packages are imported only when used, and a missing one names the extra to install."""

import importlib
import sys

import pytest

from helpers import run_python


def test_import_fastnorm_imports_no_optional_package():
    optional = ["lightning", "mlflow", "wandb", "tensorboard", "matplotlib", "transformers", "torchtitan"]
    code = f"import sys, fastnorm; print([m for m in {optional!r} if m in sys.modules])"
    out = run_python(["-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_missing_lightning_names_the_extra(monkeypatch):
    for module in ("lightning", "lightning.pytorch", "lightning.pytorch.callbacks"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    monkeypatch.delitem(sys.modules, "fastnorm.integrations.lightning", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'torch-fastnorm\[lightning\]'"):
        importlib.import_module("fastnorm.integrations.lightning")


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import raises ImportError
    monkeypatch.delitem(sys.modules, "fastnorm.integrations.hf", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'torch-fastnorm\[hf\]'"):
        importlib.import_module("fastnorm.integrations.hf")
