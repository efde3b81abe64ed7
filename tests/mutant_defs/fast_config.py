"""Mutants of "loading a config imports no torch" (issue 30, fast starts): each puts torch (or
gymnasium, where the env section needs none) back on the path of `load_config` and the `aiorl
config` commands, or breaks the algorithm the runtime gets from a loaded config."""

L = "tests/tooling/test_layers.py::"
STATIC = L + "test_loading_a_config_brings_no_heavy_import"
COMMANDS = L + "test_config_commands_import_neither_torch_nor_gymnasium"
EXAMPLES = L + "test_loading_every_example_and_its_launcher_side_import_no_torch"
BOUND = "tests/tooling/test_config_reference.py::test_a_loaded_config_binds_the_whole_algorithm_on_its_settings"
WRAPPERS = "tests/algos/test_atari.py::test_bad_wrappers_are_config_errors_naming_the_item"

MUTANTS = [
    dict(
        name="an-algorithms-config-side-imports-torch",
        path="aiorl/algos/apex_dqn_config.py",
        old="from dataclasses import dataclass\n",
        new="from dataclasses import dataclass\n\nimport torch  # noqa: F401\n",
        tests=[STATIC],
    ),
    dict(
        name="the-layer-list-imports-torch-for-its-activations",
        path="aiorl/algos/lib/layers.py",
        old='ACTIVATIONS = {"relu": "ReLU", "tanh": "Tanh", "elu": "ELU", "gelu": "GELU", "silu": "SiLU"}\n',
        new=(
            "from torch import nn  # noqa: E402\n\n"
            'ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU}\n'
        ),
        tests=[STATIC],
    ),
    dict(
        name="loading-checks-with-the-whole-algorithm",
        path="aiorl/experiment/loading.py",
        old="    settings = algos.get_settings(cfg.algo)  # the algorithm owns the model section\n",
        new="    settings = algos.get_algorithm(cfg.algo)  # the algorithm owns the model section\n",
        tests=[EXAMPLES],
    ),
    dict(
        name="the-agent-defaults-read-from-the-whole-algorithm",
        path="aiorl/experiment/loading.py",
        old="    defaults = algos.get_settings(name).agent_defaults\n",
        new="    defaults = algos.get_algorithm(name).agent_defaults\n",
        tests=[EXAMPLES],
    ),
    dict(
        name="the-reference-reads-the-whole-algorithm",
        path="aiorl/experiment/reference.py",
        old="from aiorl.algos import available_algorithms, get_settings\n",
        new="from aiorl.algos import available_algorithms\nfrom aiorl.algos import get_algorithm as get_settings\n",
        tests=[COMMANDS],
    ),
    dict(
        name="the-registry-warms-the-whole-algorithm",
        path="aiorl/algos/__init__.py",
        old='    settings = getattr(module, "SETTINGS", None)\n',
        new='    settings = getattr(module, "SETTINGS", None)\n    importlib.import_module(f"aiorl.algos.{name}")  # warm\n',
        tests=[COMMANDS],
    ),
    dict(
        name="the-env-checks-import-the-wrappers-at-the-top",
        path="aiorl/envs/checks.py",
        old="from aiorl.config import ConfigError, EnvConfig\n",
        new="from aiorl.config import ConfigError, EnvConfig\nfrom aiorl.envs import wrappers  # noqa: F401\n",
        tests=[STATIC],
    ),
    dict(
        name="the-envs-package-imports-its-names-eagerly",
        path="aiorl/envs/__init__.py",
        old='__all__ = ["EnvRunner", "EnvSpec", "env_spec", "make_env"]\n',
        new=(
            "from aiorl.envs.make import EnvSpec, env_spec, make_env  # noqa: E402, F811\n"
            "from aiorl.envs.vector import EnvRunner  # noqa: E402, F811\n\n"
            '__all__ = ["EnvRunner", "EnvSpec", "env_spec", "make_env"]\n'
        ),
        tests=[COMMANDS],
    ),
    dict(
        name="wrappers-checked-only-with-a-preset",
        path="aiorl/envs/checks.py",
        old="    if env_cfg.wrappers:\n",
        new="    if env_cfg.wrappers and env_cfg.preset is not None:\n",
        tests=[WRAPPERS],
    ),
    dict(
        name="an-algorithm-not-built-on-its-settings",
        path="aiorl/algos/dppo.py",
        old="class DPPO(DPPOSettings, Algorithm):\n",
        new="class DPPO(Algorithm):\n    name = DPPOSettings.name\n",
        tests=[BOUND],
    ),
    dict(
        name="the-panel-reads-its-metrics-from-the-whole-algorithm",
        path="aiorl/launch/panel.py",
        old="        settings = get_settings(cfg.algo)\n",
        new="        settings = cfg.algorithm\n",
        tests=[EXAMPLES],
    ),
]
