"""Helpers shared by the tests (pytest puts this folder on sys.path): forcing a backend,
what each backend serves, child processes."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

# conftest.py decides this before triton is imported.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def patch_triton_language_once_per_launch() -> bool:
    """Makes Triton's interpreter patch ``triton.language`` once per kernel launch.

    The interpreter replaces the language's builtins with NumPy ones when a kernel
    is launched and puts them back when it returns; it also does so again at every
    call of a ``@triton.jit`` device function inside the kernel, where they are
    replaced already (and never puts those back: the launch does). That second
    patching reads every member of the language modules and was half of the time
    the interpreted kernels took. Here a device call whose language modules hold
    no builtin any more (each module's ``load`` replaced) skips it; a launch, or a
    device function seeing a module the launch did not patch, patches as before.
    The kernels run the same code either way. False (and nothing changed) when
    this Triton's interpreter is not laid out as expected.
    """
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    scope = getattr(interpreter, "_LangPatchScope", None)
    tl = getattr(interpreter, "tl", None)
    if original is None or scope is None or tl is None or getattr(original, "once_per_launch", False):
        return False

    found: dict[int, tuple[dict, list]] = {}  # id of a function's globals -> (them, the language modules)

    def patch_lang(fn):
        # A module's globals hold the language modules it imported for good: read once per module.
        held = found.get(id(fn.__globals__))
        if held is None or held[0] is not fn.__globals__:
            langs = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)]
            held = found[id(fn.__globals__)] = (fn.__globals__, langs)
        langs = held[1]
        if langs and not any(tl.core.is_builtin(getattr(lang, "load", None)) for lang in langs):
            return scope()  # inside a launch: already patched
        return original(fn)

    patch_lang.once_per_launch = True
    interpreter._patch_lang = patch_lang
    return True


def skip_discarded_overflow_checks() -> bool:
    """Makes Triton's interpreter skip the integer-overflow checks it would throw away.

    With ``sanitize_overflow`` on (the interpreter's default), every 32-bit integer
    add, sub and mul of a kernel is also done in int64 and compared with int32's
    range, and the comparison is handed to ``device_assert``, which drops it
    unless ``debug`` is on (it never is in the interpreter's options): 40% of the
    time the interpreted kernels took, for no check. Here the option is turned
    off while ``debug`` is off; with ``debug`` on nothing changes and the checks
    run. False (and nothing changed) when there is nothing to turn off.
    """
    import dataclasses

    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or getattr(options, "debug", True) or not getattr(options, "sanitize_overflow", False):
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def use_backend(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Forces a backend for CPU tensors; triton needs the interpreter for those."""
    if name == "triton" and not INTERPRETED:
        pytest.skip("the triton backend runs on CPU tensors only under TRITON_INTERPRET=1")
    monkeypatch.setenv("FASTNORM_BACKEND", name)
    return name


def cpp_env(pool: str) -> dict[str, str]:
    """The environment of a child process on the C++ backend, on OpenMP's threads (``"openmp"``) or on
    fastnorm's own pool (``"own"``)."""
    return {"FASTNORM_BACKEND": "cpp"} | ({"FASTNORM_OWN_THREADS": "1"} if pool == "own" else {})


def run_python(
    args: list[str], *, stdin: str | None = None, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess:
    """``python ARGS`` in a child process, from this folder: a child started in the
    repository root would import the source tree instead of the installed package."""
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
        cwd=os.path.dirname(os.path.abspath(__file__)),
        check=False,
    )


# The child of run_scripts: each script in turn, as ``python -c SCRIPT ARGS...`` would run it, its
# stdout kept apart; what a script leaves set that would slow or kill the next (a short switch
# interval, a faulthandler timer) is put back after it.
_BATCH = """
import contextlib, faulthandler, gc, io, json, sys, traceback
out = {}
for name, code, argv in json.load(sys.stdin):
    print(f"running {name}", file=sys.stderr, flush=True)  # a child killed by a script says which
    interval, buf = sys.getswitchinterval(), io.StringIO()
    sys.argv = ["-c", *argv]
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(code, name, "exec"), {"__name__": "__main__"})
        error = None
    except BaseException:
        error = traceback.format_exc()
    finally:
        faulthandler.cancel_dump_traceback_later()
        sys.setswitchinterval(interval)
        gc.collect()
    out[name] = {"stdout": buf.getvalue(), "error": error}
sys.stdout.write(json.dumps(out))
"""


def run_scripts(scripts: dict[str, tuple[str, list[str]]], **env: str) -> dict[str, tuple[str, str]]:
    """Runs several child scripts (name -> (code, argv)) in ONE child process, in order: each
    ``(stdout, error)``, error empty where the script ran to its end, else its traceback, or the
    child's exit status and stderr where the child died (every script then has that error).

    For the scripts that need a process of their own environment (a pool, a backend) but not one
    each: starting a child that imports torch costs about 3 s of CPU on a slow machine.
    """
    payload = [[name, code, argv] for name, (code, argv) in scripts.items()]
    result = run_python(["-c", _BATCH], stdin=json.dumps(payload), timeout=600, **env)
    if result.returncode != 0:
        died = f"the child exited with {result.returncode}: {result.stderr[-3000:]}"
        return dict.fromkeys(scripts, ("", died))
    return {name: (r["stdout"], r["error"] or "") for name, r in json.loads(result.stdout).items()}


def serves(backend: str, p: float = 2.0, dense: bool = True) -> bool:
    """Whether a backend serves a call: the fused ones (cpp, triton) compute
    p-norms with p > 0 or inf of tensors whose elements lie consecutively in
    memory; torch computes everything, and auto hands it what the fused ones do
    not serve. A forced backend never hands a call on."""
    fused_p = p > 0 or p == float("inf")
    return backend in ("torch", "auto") or (fused_p and dense)


def refused(backend: str):
    """The refusal of a forced backend that cannot serve a call, naming the backend."""
    from fastnorm.backends import BackendUnavailableError

    return pytest.raises(BackendUnavailableError, match=f"FASTNORM_BACKEND={backend} cannot serve")


class NoMemoryWrapper(torch.Tensor):
    """A wrapper subclass: a tensor with no memory of its own, as some frameworks pass."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.inner if isinstance(t, NoMemoryWrapper) else t  # noqa: E731
        return func(*map(unwrap, args), **{k: unwrap(v) for k, v in (kwargs or {}).items()})


class CountSyncs(TorchFunctionMode):
    """Counts the host reads of tensors: ``item``, ``__bool__``, ``tolist``, ``__float__``, ``__int__``."""

    READS = {"item", "__bool__", "tolist", "__float__", "__int__", "numpy"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))
