"""The node targets a policy archive may name (`aiorl.io.policy_archive.ALLOWED_TARGETS`) are the ops
aiorl's own networks export: every algorithm's acting policy, in every layer kind, head, recurrent
cell and wrapper, exported here; each passes the archive check, and each op it calls is on the list.
A network change that exports a new op fails here, not in a user's `aiorl eval`."""

import json
import zipfile
from pathlib import Path

import pytest
from apex_helpers import DISCRETE_OBS_ENV, IMAGE_ENV, build_example, register_test_envs

from aiorl.algos import available_algorithms
from aiorl.experiment.loading import load_config
from aiorl.io.export import save_policy
from aiorl.io.policy_archive import ALLOWED_TARGETS, check_policy_archive

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EVERY_LAYER = "[linear:8, layernorm, elu, linear:8, gelu, silu, tanh, relu]"
# Every example as it is, then each option that changes what the acting network computes.
VARIANTS = [(p.name, []) for p in sorted(EXAMPLES.glob("*.yaml"))] + [
    ("apex_dqn_cartpole.yaml", [f"model.network={EVERY_LAYER}", "model.dueling=false"]),
    ("dppo_cartpole.yaml", [f"model.network={EVERY_LAYER}", "model.obs_norm=true", "model.shared_torso=true"]),
    ("dppo_cartpole.yaml", ["model.recurrent={type: gru, hidden: 8}", "model.obs_norm=true"]),
    ("dppo_pendulum.yaml", ["model.sde=true", "model.obs_norm=true"]),
    ("impala_cartpole.yaml", ["model.recurrent={type: gru, hidden: 8}", f"model.network={EVERY_LAYER}"]),
    ("r2d2_cartpole_novel.yaml", ["model.recurrent={type: gru, hidden: 8}", f"model.network={EVERY_LAYER}"]),
    ("apex_ddpg_pendulum.yaml", [f"model.actor_network={EVERY_LAYER}"]),
    ("es_cartpole.yaml", ["model.network=[linear:8, elu, silu, tanh, relu]", "model.obs_norm=true"]),
    ("impala_pong.yaml", ["model.network=[conv:8:8:4, elu, conv:8:4:2, gelu, flatten, layernorm, linear:16, silu]"]),
    # The observation wrappers: HWC frames permuted to CHW, Discrete observations one-hot encoded.
    ("apex_dqn_cartpole.yaml", [f"env.id={IMAGE_ENV}", "model.network=[conv:8:4:2, relu, flatten, linear:16, relu]"]),
    ("dppo_cartpole.yaml", [f"env.id={DISCRETE_OBS_ENV}"]),
]


def targets(path: str) -> set[str]:
    found = set()
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if "/models/" in name:
                stack = [json.loads(archive.read(name))]
                while stack:
                    item = stack.pop()
                    if isinstance(item, dict):
                        found.update(v for k, v in item.items() if k == "target" and isinstance(v, str))
                        stack.extend(item.values())
                    elif isinstance(item, list):
                        stack.extend(item)
    return found


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, set[str]]:
    """Each variant's algorithm -> the targets its exported policy calls (checked archives only)."""
    register_test_envs()
    used: dict[str, set[str]] = {}
    for i, (example, overrides) in enumerate(VARIANTS):
        cfg = load_config(EXAMPLES / example, overrides)
        if hasattr(cfg.model, "device"):
            cfg.model.device = "cpu"
        policy = build_example(cfg).make_learner(0, 1, seed=0).acting_policy()
        if policy is None:
            continue
        path = save_policy(policy[0], tmp_path_factory.mktemp(f"policy{i}"), policy[1])
        check_policy_archive(path)
        used.setdefault(cfg.algo, set()).update(targets(path))
    return used


def test_every_op_aiorls_networks_export_is_allowed(exported):
    for algo, ops in exported.items():
        assert ops <= ALLOWED_TARGETS, f"{algo} exports {sorted(ops - ALLOWED_TARGETS)}, not on ALLOWED_TARGETS"


def test_every_algorithm_with_a_policy_was_exported(exported):
    with_policy = {algo for algo in available_algorithms() if algo != "random_agent"}
    assert with_policy <= set(exported), f"no variant exports {sorted(with_policy - set(exported))}"


def test_the_list_holds_no_op_that_reads_or_writes_files_or_mutates():
    for target in ALLOWED_TARGETS:
        op = target.rsplit(".", 2)[-2]
        assert not op.endswith("_") or op.startswith("_"), f"{target} mutates its input"
        assert not any(word in op for word in ("file", "save", "load", "copy", "set", "storage")), target
