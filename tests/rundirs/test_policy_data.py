"""A policy aiorl opens is data, not a program (issue 44): the network rebuilt by aiorl's own code from
policy.json's ``rebuild`` record, its weights read from policy.safetensors; a program (.pt2, .pt) only
with --trust-program; every doctored record refused in one line, before anything is allocated."""

import copy
import errno
import json
import os
import resource
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from apex_helpers import DISCRETE_OBS_ENV, IMAGE_ENV, make_algo

import aiorl
from aiorl.evaluation.policies import EvalError, load_policy
from aiorl.io import export
from aiorl.io.export import PolicyWriteError, save_policy
from aiorl.io.policy_data import WEIGHTS_FILE
from aiorl.io.tensor_file import read_tensors, write_tensors

ALGOS = [
    ("apex_dqn", "CartPole-v1", {}),
    ("apex_dqn", "CartPole-v1", {"dueling": True}),
    ("apex_dqn", IMAGE_ENV, {"network": ["conv:8:4:2", "relu", "flatten", "linear:16", "relu"]}),
    ("apex_dqn", DISCRETE_OBS_ENV, {}),
    ("apex_ddpg", "Pendulum-v1", {}),
    ("dppo", "CartPole-v1", {}),
    ("dppo", "Pendulum-v1", {"obs_norm": True}),
    ("dppo", "CartPole-v1", {"network": ["linear:16", "tanh"], "recurrent": {"type": "lstm", "hidden": 8}}),
    ("impala", "CartPole-v1", {}),
    ("impala", "CartPole-v1", {"network": ["linear:16", "tanh"], "recurrent": {"type": "gru", "hidden": 8}}),
    ("r2d2", "CartPole-v1", {"network": ["linear:16", "relu"], "recurrent": {"type": "lstm", "hidden": 8}}),
    ("es", "CartPole-v1", {"obs_norm": True}),
]


def _perturbed(module):
    """`module` with every tensor of its state moved off its initial value, so that a rebuilt module
    that kept its own fresh initialisation (instead of the weights read) would act differently."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for tensor in module.state_dict().values():
            if tensor.dtype.is_floating_point:
                tensor.add_(torch.randn(tensor.shape, generator=g, dtype=tensor.dtype) * 0.3)
    return module


def _observations(meta, n=6):
    shape, dtype = meta["observation_shape"], np.dtype(meta["observation_dtype"])
    rng = np.random.default_rng(1)
    if dtype.kind in "iu":
        high = 255 if dtype == np.uint8 else 5
        return torch.from_numpy(rng.integers(0, high, size=(n, *shape)).astype(dtype))
    return torch.from_numpy(rng.normal(size=(n, *shape)).astype(dtype))


def _actions(module, obs, state_size):
    with torch.no_grad():
        if state_size:
            state = torch.zeros(len(obs), state_size)
            out = []
            for _ in range(3):  # a few steps: the state carried must be the same too
                action, state = module(obs, state)
                out.append(action)
            return torch.stack(out), state
        return module(obs), None


def _export(tmp_path, algo_name, env_id, model):
    learner = make_algo(algo_name, env_id, model).make_learner(0, 1, seed=1)
    module, meta = learner.acting_policy()
    module = _perturbed(module)
    root = tmp_path / f"{algo_name}-{len(list(tmp_path.iterdir()))}"
    save_policy(module, root, meta)
    return module, meta, root


@pytest.mark.parametrize(("algo_name", "env_id", "model"), ALGOS, ids=[f"{a}-{e}-{sorted(m)}" for a, e, m in ALGOS])
def test_the_rebuilt_policy_acts_as_the_module_exported(tmp_path, algo_name, env_id, model):
    module, meta, root = _export(tmp_path, algo_name, env_id, model)
    assert sorted(p.name for p in root.iterdir()) == ["policy.json", "policy.pt2", "policy.safetensors"]
    loaded = load_policy(root / WEIGHTS_FILE)
    assert type(loaded) is type(module) and not loaded.training
    assert not any(p.requires_grad for p in loaded.parameters())
    state_size = (meta.get("recurrent") or {}).get("state_size", 0)
    assert getattr(loaded, "state_size", 0) == state_size
    obs = _observations(meta)
    want, want_state = _actions(module.eval(), obs, state_size)
    got, got_state = _actions(loaded, obs, state_size)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if state_size:
        torch.testing.assert_close(got_state, want_state)


def test_a_run_dir_opens_the_data_and_the_api_names_it(tmp_path):
    _, meta, root = _export(tmp_path, "apex_dqn", "CartPole-v1", {})
    run = tmp_path / "run"
    (run / "policy").mkdir(parents=True)
    for p in root.iterdir():
        os.replace(p, run / "policy" / p.name)
    policy = aiorl.load_policy(run)
    assert policy.path.name == WEIGHTS_FILE and policy.meta["algo"] == "apex_dqn"
    assert isinstance(policy(np.zeros(4, np.float32)), int)


def _program_only(tmp_path):
    _, _, root = _export(tmp_path, "apex_dqn", "CartPole-v1", {})
    (root / WEIGHTS_FILE).unlink()
    return root


def test_a_program_alone_is_refused_without_trust_program(tmp_path):
    root = _program_only(tmp_path)
    with pytest.raises(EvalError, match=r"policy.pt2 is a torch.export program, not data.*--trust-program"):
        load_policy(root / "policy.pt2")
    run = tmp_path / "run"
    run.mkdir()
    os.replace(root, run / "policy")
    with pytest.raises(EvalError, match="--trust-program"):
        aiorl.load_policy(run)
    policy = aiorl.load_policy(run, trust_program=True)
    assert policy.path.name == "policy.pt2" and isinstance(policy(np.zeros(4, np.float32)), int)
    assert isinstance(policy.module, torch.fx.GraphModule)  # the program, trusted


def test_a_program_named_with_its_weights_beside_it_opens_the_weights(tmp_path, monkeypatch):
    _, _, root = _export(tmp_path, "apex_dqn", "CartPole-v1", {})

    def no_program(path):
        raise AssertionError(f"{path} was loaded as a program")

    monkeypatch.setattr(export, "_load_program", no_program)
    assert isinstance(load_policy(root / "policy.pt2"), torch.nn.Module)


# --------------------------------------------------------------------------
# A full disk


@pytest.mark.parametrize("fails", ["weights", "program", "description", "rename"])
def test_a_failed_write_leaves_no_temporary_file_and_says_what_in_one_line(tmp_path, monkeypatch, fails):
    learner = make_algo("apex_dqn", "CartPole-v1").make_learner(0, 1, seed=1)
    module, meta = learner.acting_policy()
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if fails == "rename":

        def replace(src, dst):
            raise full

        monkeypatch.setattr(export.os, "replace", replace)
    else:
        real_write = export._write

        def write(tmp, final, what, fn):
            if what == fails:

                def partial(f):
                    f.write(b"half")
                    raise full

                return real_write(tmp, final, what, partial)
            return real_write(tmp, final, what, fn)

        monkeypatch.setattr(export, "_write", write)
    with pytest.raises(PolicyWriteError) as raised:
        save_policy(module, tmp_path / "policy", meta)
    message = str(raised.value)
    assert "\n" not in message and "No space left on device" in message, message
    assert str(tmp_path / "policy") in message
    assert sorted(p.name for p in (tmp_path / "policy").iterdir()) == []


def test_a_full_disk_under_torch_export_save_is_one_line_too(tmp_path, monkeypatch):
    learner = make_algo("apex_dqn", "CartPole-v1").make_learner(0, 1, seed=1)
    module, meta = learner.acting_policy()

    def save(program, f):
        f.write(b"PK")
        raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file")

    monkeypatch.setattr(torch.export, "save", save)
    with pytest.raises(PolicyWriteError, match=r"could not write the policy's program to .*policy.pt2: "):
        save_policy(module, tmp_path, meta)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------
# Doctored records and weights: `aiorl eval` refuses each in one line, exit 2, memory bounded


def _run_dir(tmp_path):
    """A run directory with the final policy of an apex_dqn CartPole learner (data only)."""
    run = tmp_path / "run"
    (run / "policy").mkdir(parents=True)
    learner = make_algo("apex_dqn", "CartPole-v1").make_learner(0, 1, seed=1)
    learner.export_policy(str(run / "policy"))
    (run / "policy" / "policy.pt2").unlink()
    (run / "config.yaml").write_text("algo: apex_dqn\nenv: {id: CartPole-v1}\n")
    return run


# Each doctoring: (name, how it changes (meta, tensors), what the one line says)
def _doctor_meta(key_path, value):
    def doctor(meta, tensors):
        node = meta
        for key in key_path[:-1]:
            node = node[key]
        node[key_path[-1]] = value

    return doctor


def _huge_layer(meta, tensors):
    meta["rebuild"]["config"]["model"]["network"] = [f"linear:{10**12}", "relu"]


def _wrong_size(meta, tensors):
    meta["rebuild"]["config"]["model"]["network"] = ["linear:65", "relu", "linear:64", "relu"]


def _unknown_layer(meta, tensors):
    meta["rebuild"]["config"]["model"]["network"] = ["from_file:/etc/passwd"]


def _huge_space(meta, tensors):
    meta["rebuild"]["observation_space"]["shape"] = [2**20, 2**20]


def _extra_tensor(meta, tensors):
    tensors["q.extra"] = np.zeros(3, np.float32)


def _missing_tensor(meta, tensors):
    tensors.pop(next(iter(tensors)))


def _wrong_dtype(meta, tensors):
    name = next(iter(tensors))
    tensors[name] = tensors[name].astype(np.float64)


DOCTORED_RECORDS = [
    ("unknown algorithm", _doctor_meta(["rebuild", "config", "algo"], "evil"), "unknown algorithm 'evil'"),
    ("unknown layer", _unknown_layer, "model.network"),
    ("a layer that does not fit the weights", _wrong_size, "do not fit the network"),
    ("a gigantic layer", _huge_layer, "over the"),
    ("a gigantic observation space", _huge_space, "entries, over the"),
    ("no rebuild record", lambda meta, tensors: meta.pop("rebuild"), "no 'rebuild' record"),
    ("a bad config value", _doctor_meta(["rebuild", "config", "model", "dueling"], "yes please"), "model.dueling"),
    ("an extra tensor", _extra_tensor, "unexpected ['q.extra']"),
    ("a missing tensor", _missing_tensor, "missing"),
    ("a tensor of another dtype", _wrong_dtype, "F64 in the file"),
    ("a recurrent state size", _doctor_meta(["recurrent"], {"state_size": 7}), "state size 7"),
    ("an observation shape not a list", _doctor_meta(["observation_shape"], 5), "must be a list of integers"),
]


def _rewrite(run, doctor):
    policy = run / "policy"
    meta = json.loads((policy / "policy.json").read_text())
    tensors = read_tensors(policy / WEIGHTS_FILE, 1 << 30)
    doctor(meta, tensors)
    (policy / "policy.json").write_text(json.dumps(meta))
    with open(policy / WEIGHTS_FILE, "wb") as f:
        write_tensors(f, tensors)


# `aiorl eval` in a child whose peak memory is read back: nothing refused may allocate much.
EVAL_AND_MEASURE = textwrap.dedent(
    """
    import resource, sys
    from aiorl.cli.main import main
    code = main(["eval", sys.argv[1], "--episodes", "1"] + sys.argv[2:])
    print("MAXRSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
    sys.exit(code)
    """
)
MAX_RSS_KB = 1_500_000  # torch and gymnasium imported: ~500 MB; a 10**12-unit layer would be terabytes


def _eval(run, *args):
    out = subprocess.run(
        [sys.executable, "-c", EVAL_AND_MEASURE, str(run), *args], capture_output=True, text=True, timeout=300
    )
    lines = [line for line in out.stderr.splitlines() if not line.startswith("MAXRSS")]
    rss = [int(line.split()[1]) for line in out.stderr.splitlines() if line.startswith("MAXRSS")]
    return out.returncode, lines, rss[0] if rss else None


@pytest.mark.parametrize(("case", "doctor", "says"), DOCTORED_RECORDS, ids=[c for c, _, _ in DOCTORED_RECORDS])
def test_a_doctored_record_is_refused_in_one_line_exit_2(tmp_path, case, doctor, says):
    run = _run_dir(tmp_path)
    _rewrite(run, doctor)
    code, lines, rss = _eval(run)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("aiorl eval: ") and says in lines[0], lines
    assert "Traceback" not in lines[0]
    assert rss is not None and rss < MAX_RSS_KB, rss


def test_the_eval_of_a_real_policy_scores_and_a_program_alone_needs_trust_program(tmp_path):
    run = _run_dir(tmp_path)
    code, lines, _ = _eval(run, "--json")
    assert code == 0, lines
    run2 = tmp_path / "run2"
    (run2 / "policy").mkdir(parents=True)
    (run2 / "config.yaml").write_text((run / "config.yaml").read_text())
    learner = make_algo("apex_dqn", "CartPole-v1").make_learner(0, 1, seed=1)
    learner.export_policy(str(run2 / "policy"))
    (run2 / "policy" / WEIGHTS_FILE).unlink()
    code, lines, _ = _eval(run2)
    assert code == 2 and len(lines) == 1 and "--trust-program" in lines[0], lines
    code, lines, _ = _eval(run2, "--trust-program")
    assert code == 0, lines


def test_rebuild_allocates_nothing_before_the_sizes_are_checked(tmp_path, monkeypatch):
    """The gigantic layer is refused with torch's allocator never asked for its weights."""
    run = _run_dir(tmp_path)
    _rewrite(run, _huge_layer)
    asked = []
    real_empty = torch.empty

    def empty(*size, **kwargs):
        tensor = real_empty(*size, **kwargs)
        if tensor.device.type != "meta" and tensor.numel() > 10**8:
            asked.append(tensor.numel())
        return tensor

    monkeypatch.setattr(torch, "empty", empty)
    with pytest.raises(EvalError, match="over the"):
        load_policy(run / "policy" / WEIGHTS_FILE)
    assert asked == []
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4_000_000


def test_the_meta_as_exported_records_the_spaces_as_data(tmp_path):
    _, meta, root = _export(tmp_path, "apex_ddpg", "Pendulum-v1", {})
    written = json.loads((root / "policy.json").read_text())
    record = written["rebuild"]
    assert record["observation_space"] == {
        "type": "box",
        "shape": [3],
        "dtype": "<f4",
        "low": [-1.0, -1.0, -8.0],
        "high": [1.0, 1.0, 8.0],
    }
    assert record["action_space"] == {"type": "box", "shape": [1], "dtype": "<f4", "low": -2.0, "high": 2.0}
    assert record["config"]["algo"] == "apex_ddpg" and isinstance(record["config"]["model"], dict)
    assert written["weights"] == WEIGHTS_FILE
    assert copy.deepcopy(written) == json.loads(json.dumps(written))  # plain data


def _split(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _join(header, data, length=None):
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob) if length is None else length) + blob + data


def _first(header):
    return next(k for k in header if k != "__metadata__")


def _overlap(header, data):
    names = [k for k in header if k != "__metadata__"]
    header[names[1]]["data_offsets"] = header[names[0]]["data_offsets"]
    return _join(header, data)


def _huge_shape(header, data):
    header[_first(header)].update(shape=[2**31, 2**31], data_offsets=[0, 4 * 2**62])
    return _join(header, data)


def _duplicate(header, data):
    name = _first(header)
    text = json.dumps(header)
    blob = text[:-1] + f", {json.dumps(name)}: {json.dumps(header[name])}}}"
    return struct.pack("<Q", len(blob)) + blob.encode() + data


DOCTORED_WEIGHTS = [
    ("header too long", lambda h, d: _join(h, d, length=1 << 40)),
    ("header beyond the file", lambda h, d: _join(h, b"", length=len(json.dumps(h)) + 64)),
    ("bad dtype", lambda h, d: (h[_first(h)].update(dtype="F128"), _join(h, d))[1]),
    ("overlapping spans", _overlap),
    ("a huge shape", _huge_shape),
    ("truncated", lambda h, d: _join(h, d[:-4])),
    ("trailing bytes", lambda h, d: _join(h, d + b"\0" * 8)),
    ("duplicate keys", _duplicate),
    ("not the layout at all (a zip)", lambda h, d: b"PK\x03\x04" + bytes(60)),
]


@pytest.mark.parametrize(("case", "change"), DOCTORED_WEIGHTS, ids=[c for c, _ in DOCTORED_WEIGHTS])
def test_a_doctored_weights_file_is_refused_in_one_line_exit_2(tmp_path, case, change):
    run = _run_dir(tmp_path)
    path = run / "policy" / WEIGHTS_FILE
    path.write_bytes(change(*_split(path)))
    code, lines, rss = _eval(run)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith(f"aiorl eval: {path} is refused, nothing of it was loaded: "), lines
    assert rss is not None and rss < MAX_RSS_KB, rss


def test_a_policy_json_with_a_duplicate_key_is_refused(tmp_path):
    run = _run_dir(tmp_path)
    meta_path = run / "policy" / "policy.json"
    text = meta_path.read_text().rstrip().removesuffix("}")
    meta_path.write_text(text + ', "rebuild": {"config": {"algo": "evil"}}}')
    with pytest.raises(EvalError, match=r"policy.json: the key 'rebuild' appears twice"):
        load_policy(run / "policy" / WEIGHTS_FILE)


def test_a_policy_json_over_its_cap_is_refused_unread(tmp_path, monkeypatch):
    from aiorl.io import policy_data

    run = _run_dir(tmp_path)
    monkeypatch.setattr(policy_data, "MAX_META_BYTES", 100)
    with pytest.raises(EvalError, match=r"policy.json: over 100 bytes"):
        aiorl.load_policy(run)
