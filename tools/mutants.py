"""A mutation campaign: plausible bugs planted one at a time; the tests must catch each.

Each mutant (``tools/mutant_list.py``) is one small source edit, an exact
snippet replaced by another, in the C++ kernels, the Triton kernels, the
front, the plan cache, the distributed stage, the monitor, the diagnosis, the
loggers or StepClipper, with the tests meant to catch it. For each mutant the
campaign plants the edit, rebuilds the extension in place when C++ changed,
runs those tests (or the whole suite with ``--full``) and records whether a
test failed (caught, and which), or every one passed (survived), or the edit
no longer applies (stale: its snippet is not in the source exactly once, or
the mutated C++ does not compile). The tree is restored after every mutant,
also on an error or Ctrl-C; a run killed outright (SIGKILL, a power cut)
leaves a journal that the next run restores from before anything else.

Before the first mutant, the tests are run once on the clean tree: a test
that fails there would make every mutant look caught.

Run it from the repository root, in an environment where fastnorm is
installed in editable mode with its build requirements (``pip install -e
".[test]" pybind11``), so that the tests see the planted edits::

    python tools/mutants.py                 # every mutant, each on its own tests
    python tools/mutants.py --list          # names and what each plants
    python tools/mutants.py --only NAME     # one mutant (repeatable)
    python tools/mutants.py --full          # the whole suite for every mutant (hours)
    python tools/mutants.py --report FILE   # also write the table as Markdown

Exit status: 0 when every mutant was caught, 1 when one survived, 2 when one
is stale or the environment is wrong, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOURNAL = ROOT / "build" / "mutants-journal.json"  # build/ is ignored by git
sys.path.insert(0, str(ROOT / "tools"))

from mutant_list import MUTANTS  # noqa: E402


@dataclass(frozen=True)
class Mutant:
    """One planted bug: ``old`` (exactly once in ``path``) becomes ``new``."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str
    requires: str | None = None  # an instruction set the planted code needs to run at all

    @property
    def native(self) -> bool:
        return self.path.startswith("csrc/")


@dataclass
class Outcome:
    mutant: Mutant
    result: str  # caught, survived, stale, skipped
    detail: str  # the test that failed, or why not
    seconds: float


def load() -> list[Mutant]:
    mutants = [Mutant(**{**spec, "tests": tuple(spec["tests"])}) for spec in MUTANTS]
    names = [m.name for m in mutants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SystemExit(f"mutants.py: duplicate mutant names: {duplicates}")
    for m in mutants:
        if m.old == m.new or not m.tests:
            raise SystemExit(f"mutants.py: mutant {m.name} changes nothing or names no test")
    return mutants


# ----------------------------------------------------------------------------
# The tree: plant, restore, and the journal that survives a killed run
# ----------------------------------------------------------------------------


def _extension() -> Path | None:
    built = sorted((ROOT / "fastnorm").glob("_C.*.so")) + sorted((ROOT / "fastnorm").glob("_C.*.pyd"))
    return built[0] if built else None


class Tree:
    """Plants one mutant at a time and puts everything back.

    The clean build of the extension is copied aside once; after a C++ mutant
    it is copied back instead of being rebuilt.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.saved_extension: Path | None = None

    def save_extension(self) -> None:
        built = _extension()
        if built is not None:
            self.saved_extension = self.workdir / built.name
            shutil.copy2(built, self.saved_extension)

    def plant(self, mutant: Mutant) -> str | None:
        """Writes the mutant; returns why it cannot be planted, or None."""
        path = ROOT / mutant.path
        if not path.is_file():
            return f"{mutant.path} does not exist"
        original = path.read_text()
        count = original.count(mutant.old)
        if count != 1:
            return f"its snippet occurs {count} times in {mutant.path}"
        planted = original.replace(mutant.old, mutant.new)
        self._journal(mutant.path, original, planted, path.stat().st_mtime_ns)
        path.write_text(planted)
        return None

    def restore(self) -> None:
        """Puts the planted file (and the extension) back, as the journal says.

        Ctrl-C and SIGTERM wait until it is done (the journal covers a SIGKILL).
        """
        if not JOURNAL.exists():
            return
        handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._restore()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _restore(self) -> None:
        entry = json.loads(JOURNAL.read_text())
        path = ROOT / entry["path"]
        path.write_text(entry["original"])
        # The original timestamp too: nothing (build, bytecode) sees a change.
        os.utime(path, ns=(entry["mtime_ns"], entry["mtime_ns"]))
        if entry["path"].startswith("csrc/"):
            built = _extension()
            if self.saved_extension is not None and built is not None:
                staged = built.with_suffix(".restoring")
                shutil.copy2(self.saved_extension, staged)
                os.replace(staged, built)
            else:
                build()
        JOURNAL.unlink()

    @staticmethod
    def _journal(path: str, original: str, planted: str, mtime_ns: int) -> None:
        JOURNAL.parent.mkdir(exist_ok=True)
        staged = JOURNAL.with_suffix(".tmp")
        entry = {"path": path, "original": original, "planted": planted, "mtime_ns": mtime_ns}
        staged.write_text(json.dumps(entry))
        os.replace(staged, JOURNAL)


def recover() -> str | None:
    """Restores a file a killed run left planted (its journal is still there).

    Only while the file still holds exactly what was planted: a file edited,
    restored or updated since is left alone, and the reason is returned.
    """
    if not JOURNAL.exists():
        return None
    entry = json.loads(JOURNAL.read_text())
    path = ROOT / entry["path"]
    current = path.read_text() if path.is_file() else None
    if current == entry["original"]:
        JOURNAL.unlink()  # put back already (killed between the restore and the journal's removal)
        return None
    if current != entry.get("planted"):
        return (
            f"{JOURNAL} says a killed run planted a mutant in {entry['path']}, but the file has "
            "changed since: check it (`git diff`), then delete the journal"
        )
    print(f"mutants.py: restoring {entry['path']}, left planted by a run that was killed", file=sys.stderr)
    tree = Tree(Path(tempfile.gettempdir()))
    tree.restore()  # a C++ file: rebuilt, since no clean build was saved
    return None


def build() -> str | None:
    """Rebuilds fastnorm._C in place from csrc/; returns the compiler's complaint, or None.

    Objects and the linked library go to a directory of their own, never to
    build/: a restored source gets its old timestamp back, so a mutant's build
    left in build/lib would look newer than the sources, and a later
    ``pip install .`` or ``setup.py build_ext`` would install it without compiling.
    """
    with tempfile.TemporaryDirectory(prefix="fastnorm-mutants-build-") as temp:
        objects, library = os.path.join(temp, "objects"), os.path.join(temp, "lib")
        result = subprocess.run(
            [
                sys.executable,
                "setup.py",
                "-q",
                "build_ext",
                "--inplace",
                "--force",
                "--build-temp",
                objects,
                "--build-lib",
                library,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "FASTNORM_FORCE_CPP_BUILD": "1"},
            check=False,
        )
    if result.returncode == 0:
        return None
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    return (errors or result.stderr.strip().splitlines() or ["unknown error"])[0][:300]


# ----------------------------------------------------------------------------
# Running the tests
# ----------------------------------------------------------------------------


def run_tests(tests: tuple[str, ...], timeout: float) -> tuple[str, str]:
    """``('passed' | 'failed' | 'skipped', detail)`` for one pytest run of ``tests``
    (skipped: it passed, but not one of its tests ran here).

    pytest runs in a session of its own, so that on a timeout or Ctrl-C its
    whole process tree (torchrun, spawned ranks) is killed, not only pytest.
    """
    command = [sys.executable, "-m", "pytest", "-x", "-v", "-p", "no:cacheprovider", *tests]
    # No bytecode written: a planted .py file must never leave a .pyc that a
    # later run would take for the restored source.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        out.seek(0)
        lines = out.read().splitlines()
    if code is None:
        running = [line.split(" ")[0] for line in lines if line.startswith("tests/") and "::" in line]
        where = f" in {running[-1]}" if running else ""
        return "failed", f"hung{where}: killed after {timeout:.0f} s"
    if code == 0:
        if not any(line.endswith(" PASSED") or " PASSED " in line for line in lines):
            return "skipped", "every test it names was skipped here"
        return "passed", "every test passed"
    if code in (4, 5):  # a test named that does not exist, or nothing collected
        complaint = next((line for line in lines if line.startswith("ERROR: ")), lines[-1] if lines else "")
        raise RuntimeError(f"pytest cannot run {' '.join(tests)}: {complaint}")
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    if failed:
        return "failed", failed[0].split(" - ")[0]
    return "failed", f"pytest exited with {code}: " + (lines[-1] if lines else "no output")


def baseline(tests: tuple[str, ...], timeout: float) -> str | None:
    """Why the tests cannot judge mutants (one fails on the clean tree), or None."""
    result, detail = run_tests(tests, timeout)
    return None if result == "passed" else detail


def check_environment() -> tuple[str | None, set[str]]:
    """Why the campaign cannot run here (or None), and the instruction sets this CPU runs."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import fastnorm, fastnorm._C as c, pybind11; from fastnorm import _build; "
            "from pathlib import Path; print(fastnorm.__file__); print(c.__file__); "
            "print(c.source_hash() == _build.source_hash(Path(fastnorm.__file__).parents[1] / 'csrc')); "
            "print(','.join(c.supported_isas()))",
        ],
        cwd=ROOT / "tests",
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f'{last}: run `pip install -e ".[test]" pybind11` first', set()
    package, extension, fresh, isas = probe.stdout.split()
    for what, where in (("fastnorm", package), ("fastnorm._C", extension)):
        if not Path(where).resolve().is_relative_to(ROOT):
            return (
                f"the tests import {what} from {where}, not from this tree: "
                'run `pip install -e ".[test]"` here so that they see the mutants'
            ), set()
    if fresh != "True":
        print("mutants.py: fastnorm._C was built from other sources than csrc/: rebuilding", file=sys.stderr)
        problem = build()
        if problem:
            return f"csrc/ does not build: {problem}", set()
    return None, set(isas.split(","))


# ----------------------------------------------------------------------------
# The campaign
# ----------------------------------------------------------------------------


def campaign(mutants: list[Mutant], full: bool, timeout: float, tree: Tree, isas: set[str]) -> list[Outcome]:
    outcomes = []
    for i, m in enumerate(mutants, 1):
        t0 = time.monotonic()
        try:
            if m.requires is not None and m.requires not in isas:
                result, detail = "skipped", f"the planted code runs only on a CPU with {m.requires}"
            elif (why := tree.plant(m)) is not None:
                result, detail = "stale", why
            elif m.native and (problem := build()) is not None:
                result, detail = "stale", f"does not compile: {problem}"
            else:
                ran, detail = run_tests(("tests",) if full else m.tests, timeout)
                result = {"failed": "caught", "passed": "survived", "skipped": "skipped"}[ran]
        finally:
            tree.restore()
        outcomes.append(Outcome(m, result, detail, time.monotonic() - t0))
        print(
            f"[{i:2d}/{len(mutants)}] {result:8s} {m.name:36s} {outcomes[-1].seconds:5.0f} s  {detail}",
            flush=True,
        )
    return outcomes


def commit() -> str:
    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return result.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (
        " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    )


def table(outcomes: list[Outcome]) -> str:
    rows = ["| mutant | file | planted bug | outcome | caught by |", "| --- | --- | --- | --- | --- |"]
    for o in outcomes:
        by = o.detail.removeprefix("FAILED ").removeprefix("ERROR ")
        rows.append(f"| `{o.mutant.name}` | `{o.mutant.path}` | {o.mutant.what} | {o.result} | `{by}` |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this mutant (repeatable)")
    parser.add_argument("--full", action="store_true", help="run the whole suite for every mutant")
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds allowed per test run (default 600)"
    )
    parser.add_argument(
        "--skip-baseline", action="store_true", help="do not run the tests on the clean tree first"
    )
    parser.add_argument("--report", metavar="FILE", help="also write the results as a Markdown table")
    args = parser.parse_args(argv)

    mutants = load()
    if args.list:
        for m in mutants:
            print(f"{m.name:36s} {m.path:42s} {m.what}")
        return 0
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in mutants})
        if unknown:
            print(f"mutants.py: no mutant named {', '.join(unknown)} (see --list)", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.name in args.only]

    # SIGTERM (a CI job cancelled) unwinds like Ctrl-C, through the restores.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.monotonic()
    try:
        problem = recover()
        if problem:
            print(f"mutants.py: {problem}", file=sys.stderr)
            return 2
        problem, isas = check_environment()
        if problem:
            print(f"mutants.py: {problem}", file=sys.stderr)
            return 2
        if not args.skip_baseline:
            selected = ("tests",) if args.full else tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            print(
                f"mutants.py: running the tests of {len(mutants)} mutants on the clean tree first", flush=True
            )
            failing = baseline(selected, args.timeout * 4)
            if failing:
                print(f"mutants.py: a test fails without any mutant: {failing}", file=sys.stderr)
                return 2
        with tempfile.TemporaryDirectory(prefix="fastnorm-mutants-") as workdir:
            tree = Tree(Path(workdir))
            tree.save_extension()
            outcomes = campaign(mutants, args.full, args.timeout, tree, isas)
    except KeyboardInterrupt:
        print("\nmutants.py: interrupted; the tree is restored", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"mutants.py: {exc}; the tree is restored", file=sys.stderr)
        return 2

    counts = {k: sum(o.result == k for o in outcomes) for k in ("caught", "survived", "stale", "skipped")}
    stamp = datetime.date.today().isoformat()
    summary = (
        f"{counts['caught']} of {len(outcomes)} caught, {counts['survived']} survived, "
        f"{counts['stale']} stale, {counts['skipped']} skipped "
        f"({time.monotonic() - started:.0f} s, {stamp}, commit {commit()}"
        f"{', whole suite per mutant' if args.full else ''})"
    )
    print(f"\n{table(outcomes)}\n\n{summary}")
    if args.report:
        Path(args.report).write_text(f"{table(outcomes)}\n\n{summary}\n")
    if counts["stale"]:
        return 2
    return 1 if counts["survived"] else 0


if __name__ == "__main__":
    sys.exit(main())
