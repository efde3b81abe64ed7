"""Mutants of building an algorithm without initializing a weight (issue 30): each puts a real
network (an orthogonal init, a QR per layer) back where only shapes are needed, or gets the
shapes wrong; tests/algos/test_algorithm_shapes.py catches each."""

T = "tests/algos/test_algorithm_shapes.py::test_building_an_algorithm_and_its_weights_spec_initializes_no_weight"

MUTANTS = [
    dict(
        name="dppo-checks-shapes-on-a-real-network",
        path="aiorl/algos/dppo.py",
        old="        self.state_size = shapes_only(self.network).state_size  # shape errors surface now\n",
        new="        self.state_size = self.network().state_size  # shape errors surface now\n",
        tests=[T + "[dppo_cartpole.yaml]"],
    ),
    dict(
        name="apex-dqn-weights-spec-from-a-real-network",
        path="aiorl/algos/apex_dqn.py",
        old='        return weights_spec_of_module(shapes_only(self.q_network), "q")\n',
        new='        return weights_spec_of(state_to_numpy(self.q_network(), "q"))\n',
        tests=[T + "[apex_dqn_cartpole.yaml]"],
    ),
    dict(
        name="ddpg-weights-spec-leaves-out-the-critic",
        path="aiorl/algos/apex_ddpg.py",
        old='            **weights_spec_of_module(shapes_only(self.critic_network), "critic"),\n',
        new="",
        tests=[T + "[apex_ddpg_pendulum.yaml]"],
    ),
    dict(
        name="spec-dtype-read-wrong",
        path="aiorl/algos/lib/common.py",
        old='        f"{prefix}.{k}": (tuple(v.shape), np.dtype(str(v.dtype).removeprefix("torch.")).str)\n',
        new='        f"{prefix}.{k}": (tuple(v.shape), "<f4")\n',
        tests=[T + "[dppo_cartpole.yaml]"],
    ),
    dict(
        name="es-dim-counts-every-parameter",
        path="aiorl/algos/es.py",
        old="        self.dim = dim = sum(p.numel() for p in trainable(shapes_only(self.network)))\n",
        new="        self.dim = dim = sum(p.numel() for p in shapes_only(self.network).parameters()) + 1\n",
        tests=[T + "[es_cartpole.yaml]"],
    ),
]
