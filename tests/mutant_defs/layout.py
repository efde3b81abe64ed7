"""Mutants of the layout guard (issue 24): each breaks one rule of tests/tooling/test_layers.py."""

LAYERS = "tests/tooling/test_layers.py"

MUTANTS = [
    dict(
        name="runtime-imports-the-launcher",
        path="aiorl/runtime/coordinator/service.py",
        old="from aiorl.runtime.algorithm import build_algorithm\n",
        new="from aiorl.runtime.algorithm import build_algorithm\nfrom aiorl.launch import launcher_for  # noqa: F401\n",
        tests=[f"{LAYERS}::test_imports_point_down_never_up"],
    ),
    dict(
        name="wire-stream-imports-its-protocol",
        path="aiorl/wire/stream.py",
        old="from .message import _EOF, Message\n",
        new="from .message import _EOF, Message\nfrom .protocol import WireProtocol  # noqa: F401\n",
        tests=[f"{LAYERS}::test_no_import_circle"],
    ),
    dict(
        name="a-local-import-that-defers-nothing",
        path="aiorl/io/rundir.py",
        old="    owner = read_json(path / OWNER_FILE)\n    if not path.is_dir()",
        new="    from aiorl.io import checkpoint  # noqa: F401\n\n    owner = read_json(path / OWNER_FILE)\n    if not path.is_dir()",
        tests=[f"{LAYERS}::test_function_local_imports_only_defer_heavy_ones"],
    ),
    dict(
        name="the-registry-looked-up-by-name",
        path="aiorl/cli/help.py",
        old="from aiorl.algos import available_algorithms\n",
        new='import importlib\n\navailable_algorithms = importlib.import_module("aiorl.algos").available_algorithms\n',
        tests=[f"{LAYERS}::test_modules_are_looked_up_by_name_only_by_the_registry_and_custom_envs"],
    ),
    dict(
        name="the-command-line-imports-torch",
        path="aiorl/cli/plot.py",
        old="import numpy as np\n",
        new="import numpy as np\nimport torch  # noqa: F401\n",
        tests=[f"{LAYERS}::test_the_command_line_and_the_package_import_no_torch"],
    ),
]
