"""Mutants of acting in numpy (issue 28): each makes the numpy forward compute something other
than the torch module (a dropped bias, a wrong activation, an unscaled input, the dueling mean or
the normalizer's clip left out), read stale weights, or an actor act off its own choices;
tests/algos/test_numpy_forward.py and tests/algos/test_apex_dqn.py catch each."""

T = "tests/algos/test_numpy_forward.py::"
FWD = "aiorl/algos/lib/numpy_forward.py"
LAYERS = "aiorl/algos/lib/layers.py"
Q = T + "test_q_network_in_numpy_equals_torch"
ENCODERS = T + "test_observation_encoders_in_numpy_equal_torch"
AC = T + "test_actor_critic_act_in_numpy_equals_torch_with_normalized_observations"
POLICY = T + "test_each_acting_policy_takes_the_numpy_path_and_acts_as_through_torch"

MUTANTS = [
    dict(
        name="numpy-linear-drops-its-bias",
        path=FWD,
        old="        return x @ forward.w + forward.b\n\n    forward.source = module\n    return forward\n\n\ndef _layernorm",
        new="        return x @ forward.w\n\n    forward.source = module\n    return forward\n\n\ndef _layernorm",
        tests=[Q],
    ),
    dict(
        name="numpy-elu-is-relu",
        path=LAYERS,
        old='    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),\n',
        new='    "elu": lambda x: np.maximum(x, 0.0),\n',
        tests=[Q],
    ),
    dict(
        name="numpy-layernorm-without-eps",
        path=FWD,
        old="        y = (x - mean) / np.sqrt(var + eps)\n",
        new="        y = (x - mean) / np.sqrt(var + 1e-2)\n",
        tests=[Q],
    ),
    dict(
        name="numpy-dueling-keeps-the-advantage-mean",
        path=FWD,
        old="        return out[:, :1] + advantage - advantage.mean(axis=1, keepdims=True)\n",
        new="        return out[:, :1] + advantage\n",
        tests=[Q],
    ),
    dict(
        name="numpy-uint8-observations-unscaled",
        path=FWD,
        old="        return [lambda x: x.astype(np.float32) * scale if scale != 1 else x.astype(np.float32)]\n",
        new="        return [lambda x: x.astype(np.float32)]\n",
        tests=[ENCODERS + "[uint8]"],
    ),
    dict(
        name="numpy-normalizer-does-not-clip",
        path=FWD,
        old="        return np.clip((x.astype(np.float32) - forward.shift) * forward.scale, low, high)\n",
        new="        return (x.astype(np.float32) - forward.shift) * forward.scale\n",
        tests=[AC + "[categorical-two torsos]"],
    ),
    dict(
        name="numpy-shared-torso-value-from-the-raw-observation",
        path=FWD,
        old="            value = self.value(features if self.net.v_torso is None else x)[:, 0]\n",
        new="            value = self.value(x if self.net.v_torso is None else x)[:, 0]\n",
        tests=[AC + "[categorical-shared torso]"],
    ),
    dict(
        name="numpy-refresh-keeps-old-weights",
        path=FWD,
        old="            elif isinstance(source, nn.Linear):  # x @ W.T, with W.T laid out for the matmul\n"
        "                step.w = np.ascontiguousarray(weight.detach().numpy().T, np.float32)\n",
        new="            elif isinstance(source, nn.Linear):  # x @ W.T, with W.T laid out for the matmul\n"
        "                step.w = getattr(step, 'w', None)\n"
        "                step.w = np.ascontiguousarray(weight.detach().numpy().T, np.float32) if step.w is None else step.w\n",
        tests=[T + "test_a_numpy_forward_follows_new_weights_only_after_refresh"],
    ),
    dict(
        name="numpy-check-never-refuses",
        path=FWD,
        old="    if got.shape != expected.shape or not np.allclose(got, expected, rtol=RTOL, atol=ATOL):\n",
        new="    if got.shape != expected.shape:\n",
        tests=[T + "test_check_refuses_a_forward_that_differs_from_the_module"],
    ),
    dict(
        name="numpy-gelu-claimed",
        path=LAYERS,
        old='    "silu": lambda x: x / (1.0 + np.exp(-x)),\n',
        new='    "silu": lambda x: x / (1.0 + np.exp(-x)),\n    "gelu": np.tanh,\n',
        tests=[T + "test_layers_numpy_does_not_run_leave_the_module_to_torch"],
    ),
    dict(
        name="dqn-actor-does-not-refresh-on-new-weights",
        path="aiorl/algos/apex_dqn.py",
        old='        load_numpy_state(self.q, weights, "q")\n        if self.fast is not None:\n            self.fast.refresh()\n',
        new='        load_numpy_state(self.q, weights, "q")\n',
        tests=[POLICY + "[apex_dqn_cartpole]"],
    ),
    dict(
        name="impala-actor-does-not-refresh-on-new-weights",
        path="aiorl/algos/impala.py",
        old='        load_numpy_state(self.net, weights, "net")\n        if self.fast is not None:\n            self.fast.refresh()\n',
        new='        load_numpy_state(self.net, weights, "net")\n',
        tests=[POLICY + "[impala_cartpole]"],
    ),
    dict(
        name="ppo-actor-keeps-the-policy-features-as-value",
        path="aiorl/algos/dppo.py",
        old="            params, value, features = self.fast.act(obs)\n",
        new="            params, value, features = self.fast.act(obs)\n            value = features[:, 0]\n",
        tests=[POLICY + "[dppo_cartpole]"],
    ),
    dict(
        name="ddpg-actor-numpy-path-without-tanh",
        path="aiorl/algos/apex_ddpg.py",
        old="            nn.Sequential(self.actor.torso, self.actor.out, nn.Tanh()),\n",
        new="            nn.Sequential(self.actor.torso, self.actor.out),\n",
        tests=[POLICY + "[apex_ddpg_pendulum]"],
    ),
    dict(
        name="dqn-actor-explores-with-the-greedy-draw",
        path="aiorl/algos/apex_dqn.py",
        old="        return np.where(u[0] < self.epsilons, random, greedy).astype(np.int64)\n",
        new="        return np.where(u[0] > self.epsilons, random, greedy).astype(np.int64)\n",
        tests=["tests/algos/test_apex_dqn.py::test_actor_explores_with_its_epsilon"],
    ),
]
