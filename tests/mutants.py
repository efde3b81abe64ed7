"""Mutation runner: apply each recorded mutant, run the tests named to kill it, revert.

A mutant is a small plausible bug (a flipped condition, a dropped argument)
that some test must catch. Definitions live in ``tests/mutant_defs/*.py``;
each file defines::

    MUTANTS = [dict(name="...", path="aiorl/x.py", old="...", new="...",
                    tests=["tests/test_x.py::test_y", ...]), ...]

``old`` must occur exactly once in ``path``; a definition that breaks a rule
is refused, by name, before anything is touched. For each mutant the runner
writes the mutated file, rebuilds the extension in place when the path is a
``.pyx``, runs ``pytest -x -q -p no:cacheprovider TESTS``, and always puts the
original bytes back (also on Ctrl-C or SIGTERM), checking the file is restored
byte for byte. One line per mutant (killed / survived / error, seconds), then
the kill rate.

    .venv/bin/python tests/mutants.py                  # every mutant
    .venv/bin/python tests/mutants.py --list
    .venv/bin/python tests/mutants.py --only tests_bite --json mutants.json
    .venv/bin/python tests/mutants.py --only dqn_double_q_off

``--baseline`` first runs each distinct test selection on the unmutated
code: a mutant whose tests already fail there is an error, not a kill.
The full run is slow (it runs cluster tests once per mutant) and is not part
of `make test`; its own unit test is (tests/tooling/test_mutants.py).

Exit code: 0 when every mutant was killed, 1 when one survived or errored,
2 when a definition is refused, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("name", "path", "old", "new", "tests")
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider")
# Where the original of the file being mutated is kept while its mutant runs,
# so that a runner killed with SIGKILL still leaves a way back (restored on the next start).
BACKUP_DIR = Path("build") / "mutants-backup"


class DefinitionError(ValueError):
    """A mutant definition the runner refuses; the message names it."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM while a mutant was applied."""


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the root
    old: str
    new: str
    tests: tuple[str, ...]
    source: str  # the definition file it came from


@dataclass
class Outcome:
    name: str
    source: str
    status: str  # killed, survived, error
    seconds: float
    detail: str = ""
    output_tail: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- definitions


def _load_file(path: Path) -> list:
    spec = importlib.util.spec_from_file_location(f"_mutant_defs_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise DefinitionError(f"{path.name}: cannot be loaded: {type(exc).__name__}: {exc}") from None
    mutants = getattr(module, "MUTANTS", None)
    if not isinstance(mutants, list):
        raise DefinitionError(f"{path.name}: defines no MUTANTS list")
    return mutants


def _check(raw, source: str, position: int, root: Path) -> Mutant:
    where = f"{source}[{position}]"
    if not isinstance(raw, dict):
        raise DefinitionError(
            f"{where}: expected dict(name=..., path=..., old=..., new=..., tests=[...]), got {type(raw).__name__}"
        )
    name = raw.get("name")
    if isinstance(name, str) and name:
        where = f"{source}: mutant {name!r}"
    missing = [k for k in KEYS if k not in raw]
    extra = sorted(set(raw) - set(KEYS))
    if missing or extra:
        raise DefinitionError(
            f"{where}: "
            + "; ".join(
                ([f"missing key(s) {', '.join(missing)}"] if missing else [])
                + ([f"unknown key(s) {', '.join(extra)}"] if extra else [])
            )
        )
    for key in ("name", "path", "old", "new"):
        if not isinstance(raw[key], str) or (key != "new" and not raw[key]):
            raise DefinitionError(f"{where}: {key} must be a non-empty string, got {raw[key]!r}")
    tests = raw["tests"]
    if (
        not isinstance(tests, (list, tuple))
        or not tests
        or not all(isinstance(t, str) and t.startswith("tests/") for t in tests)
    ):
        raise DefinitionError(f"{where}: tests must be a non-empty list of pytest ids under tests/, got {tests!r}")
    if raw["old"] == raw["new"]:
        raise DefinitionError(f"{where}: old and new are the same text")
    target = root / raw["path"]
    if Path(raw["path"]).is_absolute() or ".." in Path(raw["path"]).parts or not target.is_file():
        raise DefinitionError(f"{where}: path {raw['path']!r} is not a file under {root}")
    count = target.read_text().count(raw["old"])
    if count != 1:
        raise DefinitionError(
            f"{where}: old text occurs {count} times in {raw['path']}, expected exactly once: {raw['old'][:80]!r}"
        )
    return Mutant(raw["name"], raw["path"], raw["old"], raw["new"], tuple(tests), source)


def load_definitions(defs_dir: Path, root: Path) -> list[Mutant]:
    """Every mutant under `defs_dir`, checked; raises DefinitionError listing every refusal."""
    mutants: list[Mutant] = []
    errors: list[str] = []
    for path in sorted(defs_dir.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            raws = _load_file(path)
        except DefinitionError as exc:
            errors.append(str(exc))
            continue
        for i, raw in enumerate(raws):
            try:
                mutants.append(_check(raw, path.name, i, root))
            except DefinitionError as exc:
                errors.append(str(exc))
    seen: dict[str, str] = {}
    for m in mutants:
        if m.name in seen:
            errors.append(f"{m.source}: mutant {m.name!r}: the name is already used in {seen[m.name]}")
        seen.setdefault(m.name, m.source)
    if errors:
        raise DefinitionError("\n".join(errors))
    return mutants


def select(mutants: list[Mutant], only: list[str]) -> list[Mutant]:
    """Mutants named in `only` (a mutant name, or a definition file with or without .py)."""
    if not only:
        return mutants
    chosen = []
    unknown = []
    for key in only:
        hits = [m for m in mutants if key in (m.name, m.source, Path(m.source).stem)]
        if not hits:
            unknown.append(key)
        chosen += [m for m in hits if m not in chosen]
    if unknown:
        files = sorted({Path(m.source).stem for m in mutants})
        raise DefinitionError(
            f"--only {', '.join(unknown)}: no mutant or definition file of that name "
            f"(files: {', '.join(files)}; --list shows the mutants)"
        )
    return chosen


# ---------------------------------------------------------------------------- applying


def _raise_interrupted(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def _backup_path(root: Path, rel: str) -> Path:
    return root / BACKUP_DIR / rel


def _drop_backup(root: Path, backup: Path) -> None:
    backup.unlink()
    base = root / BACKUP_DIR
    for parent in backup.parents:  # and the folders it leaves empty
        if parent == base.parent or any(parent.iterdir()):
            break
        parent.rmdir()


def restore_leftovers(root: Path) -> list[str]:
    """Put back any original a previous, killed runner left in the backup folder."""
    restored = []
    base = root / BACKUP_DIR
    if not base.is_dir():
        return restored
    for backup in sorted(p for p in base.rglob("*") if p.is_file()):
        rel = backup.relative_to(base)
        (root / rel).write_bytes(backup.read_bytes())
        _drop_backup(root, backup)
        restored.append(str(rel))
    return restored


def _rebuild(root: Path, python: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "setup.py", "--quiet", "build_ext", "--inplace"], cwd=root, capture_output=True, text=True
    )


def _run_tests(tests: tuple[str, ...], root: Path, python: str, timeout_s: float) -> tuple[int | None, str]:
    """pytest's exit code (None on timeout) and its output. PYTHONPATH puts the mutated tree first for the
    role processes the tests start too: from their own working directory they would otherwise import
    whichever aiorl the interpreter has installed, which need not be this tree."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [python, "-m", "pytest", *PYTEST_ARGS, *tests],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out
    finally:
        if proc.poll() is None:  # interrupted: end the test run and whatever it started
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _tail(text: str, lines: int = 15) -> list[str]:
    return text.strip().splitlines()[-lines:]


def run_mutant(m: Mutant, root: Path = ROOT, python: str = sys.executable, timeout_s: float = 1800.0) -> Outcome:
    """Apply `m`, run its tests, revert (always) and verify the revert."""
    target = root / m.path
    original = target.read_bytes()
    text = original.decode()
    if text.count(m.old) != 1:  # the file changed since the definitions were checked
        return Outcome(m.name, m.source, "error", 0.0, f"old text occurs {text.count(m.old)} times in {m.path}")
    backup = _backup_path(root, m.path)
    backup.parent.mkdir(parents=True, exist_ok=True)
    backup.write_bytes(original)
    is_pyx = m.path.endswith(".pyx")
    t0 = time.monotonic()
    status, detail, out = "error", "", ""
    try:
        target.write_bytes(text.replace(m.old, m.new, 1).encode())
        built = _rebuild(root, python) if is_pyx else None
        if built is not None and built.returncode != 0:
            detail, out = "the mutated extension does not build", built.stdout + built.stderr
        else:
            code, out = _run_tests(m.tests, root, python, timeout_s)
            if code is None:
                status, detail = "killed", f"timed out after {timeout_s:g} s"
            elif code == 0:
                status = "survived"
            elif code == 1:
                status = "killed"
            else:  # 2 interrupted, 3 internal error, 4 usage error, 5 nothing collected
                detail = f"pytest exit code {code}"
    finally:
        # A second Ctrl-C must not cut the revert short: hold signals until it is done.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            target.write_bytes(original)
            if target.read_bytes() != original:
                raise RuntimeError(f"{m.path} was not restored; its original is kept at {backup}")
            _drop_backup(root, backup)
            if is_pyx:
                rebuilt = _rebuild(root, python)
                if rebuilt.returncode != 0:
                    raise RuntimeError(f"{m.path} restored, but the extension does not rebuild:\n{rebuilt.stderr}")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return Outcome(m.name, m.source, status, round(time.monotonic() - t0, 1), detail, _tail(out))


def baseline(tests: tuple[str, ...], root: Path, python: str, timeout_s: float) -> str | None:
    """None when `tests` pass on the unmutated code, else why not."""
    code, out = _run_tests(tests, root, python, timeout_s)
    if code == 0:
        return None
    return f"its tests fail without the mutant (pytest exit code {code}): {' | '.join(_tail(out, 3))}"


def installed_tree(python: str) -> Path | None:
    """The tree `python` imports aiorl from without PYTHONPATH (None if it imports none).

    Tests that start the `aiorl` script as a user would drop PYTHONPATH, so they test that
    tree, whatever root the mutants were applied to."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [python, "-P", "-c", "import aiorl, pathlib; print(pathlib.Path(aiorl.__file__).resolve().parent.parent)"],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
    )
    return Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None


# ---------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME_OR_FILE",
        help="run only this mutant, or the mutants of this definition file; repeatable",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--json", metavar="OUT", help="write every outcome here")
    parser.add_argument("--baseline", action="store_true", help="first check that each mutant's tests pass without it")
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="seconds one mutant's tests may run; a timeout counts as killed (default 1800)",
    )
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--defs", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    defs = (args.defs or root / "tests" / "mutant_defs").resolve()

    for rel in restore_leftovers(root):
        print(f"mutants: restored {rel} from a previous run that was killed", file=sys.stderr)
    try:
        mutants = select(load_definitions(defs, root), args.only)
    except DefinitionError as exc:
        for line in str(exc).splitlines():
            print(f"mutants: refused: {line}", file=sys.stderr)
        return 2
    if args.list:
        for m in mutants:
            print(f"{m.name:40} {m.source:24} {m.path}  <- {' '.join(m.tests)}")
        print(f"{len(mutants)} mutant(s)")
        return 0

    installed = installed_tree(sys.executable)
    if installed != root:
        print(
            f"mutants: warning: without PYTHONPATH this interpreter imports aiorl from {installed}, not from "
            f"{root}: the tests that run the `aiorl` script without PYTHONPATH test that tree, so their "
            "mutants may survive here; run from the tree the venv is installed from",
            file=sys.stderr,
        )
    old_handlers = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    outcomes: list[Outcome] = []
    t0 = time.monotonic()
    try:
        failing: dict[tuple[str, ...], str | None] = {}
        for m in mutants:
            if args.baseline and m.tests not in failing:
                failing[m.tests] = baseline(m.tests, root, sys.executable, args.timeout)
            if failing.get(m.tests):
                outcome = Outcome(m.name, m.source, "error", 0.0, failing[m.tests])
            else:
                outcome = run_mutant(m, root, sys.executable, args.timeout)
            outcomes.append(outcome)
            note = f"  ({outcome.detail})" if outcome.detail else ""
            print(f"{outcome.status:8} {outcome.seconds:7.1f} s  {m.name}{note}", flush=True)
            if outcome.status == "error" and outcome.output_tail:
                print("\n".join(f"         | {line}" for line in outcome.output_tail[-5:]), flush=True)
    except Interrupted as exc:
        print(f"mutants: interrupted by {exc}; every file is restored", file=sys.stderr)
        return 130
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "outcomes": [asdict(o) for o in outcomes],
                        "seconds": round(time.monotonic() - t0, 1),
                        "python": sys.version.split()[0],
                        "root": str(root),
                        "installed_tree": str(installed),
                    },
                    indent=1,
                )
                + "\n"
            )
    killed = sum(o.status == "killed" for o in outcomes)
    survived = [o.name for o in outcomes if o.status == "survived"]
    errors = [o.name for o in outcomes if o.status == "error"]
    rate = killed / len(outcomes) if outcomes else 1.0
    print(
        f"kill rate {killed}/{len(outcomes)} ({100 * rate:.0f}%) in {time.monotonic() - t0:.0f} s"
        + (f"; survived: {', '.join(survived)}" if survived else "")
        + (f"; errors: {', '.join(errors)}" if errors else "")
    )
    return 0 if killed == len(outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
