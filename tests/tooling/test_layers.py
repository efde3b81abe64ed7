"""The layout guard: packages by concern in floors, imports pointing one way, no circle.

Every module of `aiorl/` is parsed (function-local imports included; `if TYPE_CHECKING:`
blocks aside, they never run). A package may import its own floor or lower ones; nothing
imports in a circle; a function-local import of an aiorl module is there only to defer a
heavy third-party import (torch, gymnasium, ray, ...), so the module it names must bring
one (a name a package imports on first use, PEP 562, counts as the module it comes from);
modules are looked up by name (`importlib.import_module`, `__import__`) only by the
algorithm registry and by the loading of a user's `module:Env`. docs/architecture.md
describes the floors these lines hold.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "aiorl"

# Bottom to top. A module sits on the floor of the longest package prefix it matches.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("aiorl.core", "aiorl._ext"),
    ("aiorl.config",),
    ("aiorl.io", "aiorl.wire", "aiorl.envs"),
    ("aiorl.replay",),
    ("aiorl.runtime",),
    ("aiorl.algos",),
    ("aiorl.launch",),
    ("aiorl.experiment",),
    ("aiorl.evaluation",),
    ("aiorl.cli", "aiorl.api", "aiorl.__main__", "aiorl"),
)
MAX_LOOSE_MODULES = 8  # modules directly in aiorl/, __init__ included
# Third-party packages that take long to import: the only reason to import an aiorl module
# inside a function is that it brings one of these.
HEAVY = ("torch", "gymnasium", "ray", "matplotlib", "tensorboard", "wandb", "mlflow", "ale_py", "cv2", "scipy")
# Where a module may be imported by a name known only at run time.
# The package's own lazy attributes (PEP 562): `import aiorl` must not load the whole API.
# (module, what it imports late though light): the command's entry starts the warm spawner first.
LAZY_ALLOWED = {("aiorl", "aiorl.api"), ("aiorl.cli.entry", "aiorl.cli.main")}
LOOKUP_BY_NAME = {"aiorl.algos": "the algorithm registry", "aiorl.envs.gym": "a user's module:Env"}
CYTHON_IMPORT = re.compile(r"\s*(?:from|import)\s+(aiorl(?:\.\w+)*)\s+(?:import\b|$)")
MAX_LINES = 650
LONG_ALLOWED = {"aiorl.wire.protocol", "aiorl.replay.reference"}  # the frame protocol, the numpy oracles


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: list[tuple[str, int, bool]] = field(default_factory=list)  # (target, line, function-local)
    third_party: set[str] = field(default_factory=set)  # top-level packages imported at module level
    lookups: list[int] = field(default_factory=list)  # lines of import_module / __import__ calls


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, in_function: bool):
    """(node, in_function) for every node, skipping `if TYPE_CHECKING:` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for orelse in child.orelse:
                yield from _walk_one(orelse, in_function)
            continue
        yield from _walk_one(child, in_function)


def _walk_one(node: ast.AST, in_function: bool):
    yield node, in_function
    yield from _walk(node, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def load_modules(package: Path = PACKAGE) -> dict[str, Module]:
    modules = {}
    for path in sorted([*package.rglob("*.py"), *package.rglob("*.pyx")]):
        name, is_package = _module_name(path, package.parent)
        modules[name] = Module(name, path, is_package)
    trees = {m.name: ast.parse(m.path.read_text(), str(m.path)) for m in modules.values() if m.path.suffix == ".py"}
    lazy = {name: _lazy_names(modules[name], tree) for name, tree in trees.items() if modules[name].is_package}
    for module in modules.values():
        if module.path.suffix == ".pyx":  # Cython: its Python-level imports, read line by line
            for line, text in enumerate(module.path.read_text().splitlines(), 1):
                if match := CYTHON_IMPORT.match(text):
                    _add(module, modules, lazy, match.group(1), None, line, False)
            continue
        for node, in_function in _walk(trees[module.name], False):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    _add(module, modules, lazy, alias.name, None, node.lineno, in_function)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, node)
                for alias in node.names:
                    _add(module, modules, lazy, base, alias.name, node.lineno, in_function)
            elif isinstance(node, ast.Call):
                func = node.func
                if (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
                    isinstance(func, ast.Name) and func.id in ("__import__", "import_module")
                ):
                    module.lookups.append(node.lineno)
    return modules


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _lazy_names(package: Module, tree: ast.Module) -> dict[str, str]:
    """The names a package imports on first use (PEP 562 ``__getattr__``) -> the module each comes from."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom):
                    for alias in inner.names:
                        names[alias.asname or alias.name] = _absolute(package, inner)
    return names


def _add(
    module: Module,
    modules: dict[str, Module],
    lazy: dict[str, dict[str, str]],
    base: str,
    name: str | None,
    line: int,
    local: bool,
) -> None:
    if base.split(".")[0] != "aiorl":
        if not local:
            module.third_party.add(base.split(".")[0])
        return
    target = f"{base}.{name}" if name is not None and f"{base}.{name}" in modules else base
    if target == base and name in lazy.get(base, {}):
        target = lazy[base][name]  # `from package import name` runs the import that gives the name
    while target not in modules and "." in target:
        target = target.rsplit(".", 1)[0]
    if target != module.name:
        module.imports.append((target, line, local))


def floor_of(name: str) -> int | None:
    best, floor = -1, None
    for level, packages in enumerate(FLOORS):
        for package in packages:
            # "aiorl" is the package's own __init__, not a prefix: a loose module sits on no floor.
            inside = name.startswith(package + ".") and package != "aiorl"
            if (name == package or inside) and len(package) > best:
                best, floor = len(package), level
    return floor


def circles(modules: dict[str, Module]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph = {name: sorted({t for t, _, _ in m.imports}) for name, m in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return sorted(found)


def brings_heavy(name: str, modules: dict[str, Module]) -> str | None:
    """The heavy third-party package importing `name` at module level brings, if any (its
    parent packages' __init__ run first, so they count too)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in modules:
            continue
        seen.add(current)
        heavy = sorted(modules[current].third_party & set(HEAVY))
        if heavy:
            return f"{heavy[0]} (through {current})"
        todo += [t for t, _, local in modules[current].imports if not local]
        if "." in current:
            todo.append(current.rsplit(".", 1)[0])
    return None


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return load_modules()


def test_every_module_sits_on_a_floor_and_few_stay_loose(modules):
    unplaced = sorted(name for name in modules if floor_of(name) is None)
    assert not unplaced, f"modules on no floor (tests/tooling/test_layers.py FLOORS): {unplaced}"
    loose = sorted(name for name, m in modules.items() if m.path.parent == PACKAGE)
    assert len(loose) <= MAX_LOOSE_MODULES, f"{len(loose)} loose modules at the top of aiorl/: {loose}"


def test_no_import_circle(modules):
    found = circles(modules)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_point_down_never_up(modules):
    upward = []
    for name, m in sorted(modules.items()):
        for target, line, _ in m.imports:
            source_floor, target_floor = floor_of(name), floor_of(target)
            if None not in (source_floor, target_floor) and target_floor > source_floor:
                upward.append(
                    f"{m.path.relative_to(ROOT)}:{line}: {name} (floor {source_floor}) imports {target} "
                    f"(floor {target_floor})"
                )
    assert not upward, "imports from a lower floor to a higher one:\n" + "\n".join(upward)


def test_function_local_imports_only_defer_heavy_ones(modules):
    needless = []
    for m in modules.values():
        for target, line, local in m.imports:
            if local and (m.name, target) not in LAZY_ALLOWED and brings_heavy(target, modules) is None:
                needless.append(
                    f"{m.path.relative_to(ROOT)}:{line}: {target} brings no heavy import; import it at the top"
                )
    assert not needless, "function-local imports that defer nothing:\n" + "\n".join(needless)


def test_modules_are_looked_up_by_name_only_by_the_registry_and_custom_envs(modules):
    found = [
        f"{m.path.relative_to(ROOT)}:{line}"
        for name, m in sorted(modules.items())
        for line in m.lookups
        if name not in LOOKUP_BY_NAME
    ]
    assert not found, f"import by name outside {sorted(LOOKUP_BY_NAME)}: {found}"


def test_no_module_grows_past_its_size(modules):
    long = sorted(
        f"{m.path.relative_to(ROOT)}: {n} lines"
        for name, m in modules.items()
        if name not in LONG_ALLOWED and (n := len(m.path.read_text().splitlines())) > MAX_LINES
    )
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


def test_the_guard_sees_a_circle_an_upward_import_and_a_needless_local_import(tmp_path):
    # The guard itself, on a tiny tree: what it must catch, it catches.
    pkg = tmp_path / "aiorl"
    for sub in ("core", "runtime", "cli"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from aiorl.core import b\n")
    (pkg / "core" / "b.py").write_text("import aiorl.core.a\n")
    (pkg / "core" / "e.py").write_text("from aiorl.runtime import c\n")
    (pkg / "runtime" / "c.py").write_text("import torch\n")
    (pkg / "core" / "k.pyx").write_text("cimport numpy\nfrom aiorl.runtime.c import x\n")
    (pkg / "cli" / "d.py").write_text("def f():\n    from aiorl.core import a\n    from aiorl.runtime import c\n")
    # A package's name given on first use (PEP 562) is an import of the module it comes from.
    (pkg / "runtime" / "__init__.py").write_text(
        "def __getattr__(name):\n    from aiorl.runtime.c import Net\n    return Net\n"
    )
    (pkg / "cli" / "f.py").write_text("def g():\n    from aiorl.runtime import Net\n")
    found = load_modules(pkg)
    assert circles(found) == [["aiorl.core.a", "aiorl.core.b"]]
    assert found["aiorl.core.e"].imports == [("aiorl.runtime.c", 1, False)]
    assert floor_of("aiorl.runtime.c") > floor_of("aiorl.core.e")
    assert found["aiorl.core.k"].imports == [("aiorl.runtime.c", 2, False)]  # Cython's imports count too
    assert [(t, local) for t, _, local in found["aiorl.cli.d"].imports] == [
        ("aiorl.core.a", True),
        ("aiorl.runtime.c", True),
    ]
    assert brings_heavy("aiorl.core.a", found) is None  # a needless local import in d.f
    assert found["aiorl.cli.f"].imports == [("aiorl.runtime.c", 2, True)]  # not a needless one
    assert brings_heavy("aiorl.runtime.c", found) == "torch (through aiorl.runtime.c)"


def test_the_command_line_and_the_package_import_no_torch():
    # Imports hoisted to the top of a module run for every command: none may bring torch.
    code = (
        "import sys, contextlib, io\n"
        "import aiorl\n"
        "from aiorl.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = sorted(m for m in ('torch', 'gymnasium', 'ray', 'matplotlib') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# Loading a config and every `aiorl config` command: their module-level imports bring no heavy
# package (no torch, no gymnasium), nor does any algorithm's config side (aiorl/algos/*_config.py).
CONFIG_PATH = ("aiorl.experiment.loading", "aiorl.experiment.reference")


def test_loading_a_config_brings_no_heavy_import(modules):
    config_sides = sorted(name for name in modules if name.startswith("aiorl.algos.") and name.endswith("_config"))
    assert len(config_sides) >= 6, config_sides
    heavy = {name: brings_heavy(name, modules) for name in (*CONFIG_PATH, *config_sides)}
    assert not any(heavy.values()), "heavy imports on the config path:\n" + "\n".join(
        f"{name}: {found}" for name, found in heavy.items() if found
    )


def _this_tree() -> dict[str, str]:
    # `python -P` leaves the working directory off sys.path: name this tree, not an installed one.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.parametrize(
    "argv",
    [["config", "apex_dqn"], ["config", "show", "examples/dppo_cartpole.yaml"], ["config", "keys"]],
    ids=" ".join,
)
def test_config_commands_import_neither_torch_nor_gymnasium(argv):
    # The real command; -X importtime names every module it imports, on stderr.
    result = subprocess.run(
        [sys.executable, "-P", "-X", "importtime", "-m", "aiorl", *argv],
        cwd=ROOT,
        env=_this_tree(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {
        line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert "aiorl.experiment.reference" in imported
    assert not {m.split(".")[0] for m in imported} & {"torch", "gymnasium"}


def test_loading_every_example_and_its_launcher_side_import_no_torch(tmp_path):
    # The launcher of `aiorl run` loads the config and shows the panel while the warm spawner
    # imports torch: its own exit, after the run, then skips torch's teardown too.
    code = (
        "import sys, pathlib\n"
        "import aiorl.launch.local, aiorl.launch.spawner, aiorl.launch.notices\n"
        "from aiorl.experiment.loading import load_config\n"
        "from aiorl.launch.panel import Progress\n"
        "for path in sorted(pathlib.Path('examples').glob('*.yaml')):\n"
        "    cfg = load_config(path)\n"
        f"    progress = Progress(cfg, pathlib.Path({str(tmp_path)!r}), quiet=True)\n"
        "    assert 'torch' not in sys.modules, path\n"
        "    if cfg.algo != 'impala':\n"
        "        assert progress.state.panel_metrics, path\n"
    )
    result = subprocess.run(
        [sys.executable, "-P", "-c", code], cwd=ROOT, env=_this_tree(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
