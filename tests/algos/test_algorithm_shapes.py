"""Building an algorithm (every role does: the coordinator, memory hosts, actors, learners, the
preflight) runs no torch op on a real weight: its shape checks and its weights spec come from
networks built on torch's meta device. The spec must still be exactly what the learner publishes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from apex_helpers import build_example

from aiorl.algos.lib.common import state_to_numpy, weights_spec_of
from aiorl.experiment.loading import load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))
# Where an algorithm's learner takes its published weights from (module builders and prefixes).
NETWORKS = {
    "apex_dqn": [("q_network", "q")],
    "apex_ddpg": [("actor_network", "actor"), ("critic_network", "critic")],
    "dppo": [("network", "net")],
    "impala": [("network", "net")],
    "r2d2": [("q_network", "q")],
}


@pytest.fixture
def real_qr_calls(monkeypatch):
    # An orthogonal init runs one QR per layer: count those on tensors that hold values.
    calls = []
    qr = torch.linalg.qr

    def counting(a, *args, **kwargs):
        if not a.is_meta:
            calls.append(tuple(a.shape))
        return qr(a, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "qr", counting)
    return calls


@pytest.mark.parametrize("example", EXAMPLES)
def test_building_an_algorithm_and_its_weights_spec_initializes_no_weight(example, real_qr_calls):
    cfg = load_config(ROOT / "examples" / example)
    algo = build_example(cfg)
    spec = algo.weights_spec()
    assert spec and not real_qr_calls, f"{example}: {len(real_qr_calls)} QR call(s) on real weights"
    real = {}
    for builder, prefix in NETWORKS.get(cfg.algo, []):
        real.update(state_to_numpy(getattr(algo, builder)(), prefix))
    if real:
        assert spec == weights_spec_of(real)  # what the learner's weights will be, name for name
    if cfg.algo == "es":
        theta = spec["theta"]
        assert theta == ((algo.dim,), "<f4")
        net = algo.network()
        assert algo.dim == sum(p.numel() for p in net.parameters() if p.requires_grad)


def test_the_action_scale_is_what_torch_would_compute():
    from aiorl.algos.lib.networks import ActionScale

    low = np.array([-2.0, 0.1, -1e-3], np.float32)
    high = np.array([2.0, 0.7, 3e5], np.float32)
    scale = ActionScale(low, high)
    lt, ht = torch.as_tensor(low), torch.as_tensor(high)
    assert torch.equal(scale.center, (ht + lt) / 2) and torch.equal(scale.half_range, (ht - lt) / 2)
    assert scale.center.dtype == torch.float32
