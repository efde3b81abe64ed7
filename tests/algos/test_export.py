"""The exported policy: torch.export (.pt2), loadable with plain torch and no aiorl, for every algorithm;
older runs' TorchScript policy.pt still evaluates when trusted (--trust-program)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from apex_helpers import make_algo

from aiorl.cli.main import main
from aiorl.evaluation.policies import EvalError, load_policy

EXPORTING = [
    ("apex_dqn", "CartPole-v1"),
    ("apex_ddpg", "Pendulum-v1"),
    ("dppo", "CartPole-v1"),
    ("dppo", "Pendulum-v1"),
    ("es", "CartPole-v1"),
]

# Runs in `python -I` (no PYTHONPATH, no cwd on sys.path) with aiorl made unimportable even
# through the editable install's path hook: only torch reads the files.
PLAIN_TORCH = """
import json, sys
sys.modules["aiorl"] = None
try:
    import aiorl
except ImportError:
    pass
else:
    raise SystemExit("aiorl is importable")
import torch
out = []
for path, batches in json.loads(sys.stdin.read()):
    policy = torch.export.load(path).module()
    out.append([policy(torch.tensor(obs, dtype=torch.float32)).tolist() for obs in batches])
print(json.dumps(out))
"""


def test_every_algorithms_exported_policy_loads_with_plain_torch_and_no_aiorl(tmp_path):
    rng = np.random.default_rng(0)
    jobs = []
    for algo_name, env_id in EXPORTING:
        learner = make_algo(algo_name, env_id).make_learner(0, 1, seed=1)
        root = tmp_path / f"{algo_name}-{env_id}"
        path = learner.export_policy(str(root))
        assert path.endswith("policy.pt2") and not (root / "policy.pt").exists()
        meta = json.loads((root / "policy.json").read_text())
        assert meta["format"] == "torch.export" and meta["file"] == "policy.pt2" and meta["env_id"] == env_id
        # The batch dimension stays dynamic, size 1 included.
        jobs.append((path, [rng.normal(size=(b, *meta["observation_shape"])).astype(np.float32) for b in (1, 3)]))
    out = subprocess.run(
        [sys.executable, "-I", "-c", PLAIN_TORCH],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        input=json.dumps([(p, [o.tolist() for o in obs]) for p, obs in jobs]),
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    for (path, batches), actions_by_batch in zip(jobs, results, strict=True):
        policy = load_policy(path)
        for obs, actions in zip(batches, actions_by_batch, strict=True):
            expected = policy(torch.from_numpy(obs)).numpy()
            assert len(expected) == len(obs)
            np.testing.assert_allclose(np.asarray(actions), expected, rtol=1e-5, atol=1e-6, err_msg=path)


def test_a_re_export_replaces_an_older_torchscript_policy(tmp_path):
    (tmp_path / "policy.pt").write_bytes(b"old")
    make_algo("apex_dqn", "CartPole-v1").make_learner(0, 1, seed=0).export_policy(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.json", "policy.pt2", "policy.safetensors"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_older_run_with_a_torchscript_policy_still_evaluates(tmp_path, capsys):
    class Left(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return torch.zeros(obs.shape[0], dtype=torch.int64)

    make_algo("apex_dqn", "CartPole-v1").cfg.dump(tmp_path / "config.yaml")
    (tmp_path / "policy").mkdir()
    torch.jit.script(Left()).save(str(tmp_path / "policy" / "policy.pt"))
    assert main(["eval", str(tmp_path), "--episodes", "2", "--json"]) == 2  # a program: only when trusted
    assert "policy.pt is a TorchScript program, not data" in capsys.readouterr().err
    assert main(["eval", str(tmp_path), "--episodes", "2", "--json", "--trust-program"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["policy"].endswith("policy.pt") and result["episodes"] == 2
    assert max(result["lengths"]) < 30  # always pushing left topples the pole fast


def test_a_garbage_pt2_is_named_not_a_traceback(tmp_path):
    (tmp_path / "policy.pt2").write_bytes(b"not a zip archive")
    with pytest.raises(EvalError, match=r"policy.pt2 is a torch.export program, not data"):
        load_policy(tmp_path / "policy.pt2")
    with pytest.raises(EvalError, match=r"policy.pt2 is not a torch.export policy"):
        load_policy(tmp_path / "policy.pt2", trust_program=True)


PLAIN_TORCH_RECURRENT = """
import json, sys
sys.modules["aiorl"] = None
import torch
path, steps = json.loads(sys.stdin.read())
meta = json.load(open(path.replace("policy.pt2", "policy.json")))
policy = torch.export.load(path).module()
state = torch.zeros(len(steps[0]), meta["recurrent"]["state_size"])
out = []
for obs in steps:
    action, state = policy(torch.tensor(obs, dtype=torch.float32), state)
    out.append(action.tolist())
print(json.dumps(out))
"""


@pytest.mark.parametrize("algo_name", ["impala", "dppo"])
def test_a_recurrent_export_takes_and_returns_the_state_in_plain_torch(tmp_path, algo_name):
    """The exported program, run with plain torch (no aiorl) and the state carried step to step,
    acts as the learner's network stepped in the run, and as `aiorl eval`'s loader."""
    from aiorl.experiment.loading import load_config
    from aiorl.runtime.algorithm import build_algorithm

    cfg = load_config(
        data={
            "algo": algo_name,
            "env": {"id": "CartPole-v1", "wrappers": ["mask_velocity"]},
            "agent": {"sample_batch_size": 16, "batch_size": 32},
            "model": {"network": ["linear:16", "tanh"], "recurrent": {"type": "lstm", "hidden": 8}},
        }
    )
    learner = build_algorithm(cfg).make_learner(0, 1, seed=1)
    torch.manual_seed(0)
    with torch.no_grad():  # away from the near-uniform first policy: actions that vary with the inputs
        for p in learner.net.parameters():
            p.add_(torch.randn_like(p))
    path = learner.export_policy(str(tmp_path))
    meta = json.loads((tmp_path / "policy.json").read_text())
    assert meta["recurrent"] == {"type": "lstm", "hidden": 8, "state_size": 16}
    assert "state[B, 16]" in meta["signature"] and meta["observation_shape"] == [2]
    rng = np.random.default_rng(0)
    steps = [rng.normal(size=(3, 2)).astype(np.float32) * 2 for _ in range(6)]
    out = subprocess.run(
        [sys.executable, "-I", "-c", PLAIN_TORCH_RECURRENT],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        input=json.dumps([path, [o.tolist() for o in steps]]),
    )
    assert out.returncode == 0, out.stderr
    plain = np.asarray(json.loads(out.stdout))
    # aiorl's loader: the network rebuilt from the data beside the program, and the program trusted.
    net, loaded, program = learner.net, load_policy(path), load_policy(path, trust_program=True)
    assert loaded.state_size == 16 and program.state_size == 16
    state, loaded_state, program_state = torch.zeros(3, net.state_size), torch.zeros(3, 16), torch.zeros(3, 16)
    with torch.no_grad():
        for t, obs in enumerate(steps):
            params, _, _, state = net.step(torch.from_numpy(obs), state)
            in_run = net.head.mode(params).numpy()
            action, loaded_state = loaded(torch.from_numpy(obs), loaded_state)
            from_program, program_state = program(torch.from_numpy(obs), program_state)
            np.testing.assert_array_equal(plain[t], in_run)
            np.testing.assert_array_equal(action.numpy(), in_run)
            np.testing.assert_array_equal(from_program.numpy(), in_run)
    assert len({tuple(a) for a in plain}) > 1  # the actions depend on the inputs (a live test)
