"""Mutants of issue 45's `bc` and `marwil` (aiorl/algos/{bc,marwil}{,_config}.py) and the shared
offline pieces (aiorl/algos/lib/offline.py): the losses, the MARWIL weights and the moving
average of the squared advantage, the separate optimizers, checkpoints, no actors, the transition spec and the checks."""

T = "tests/algos/test_bc_marwil.py::"
BC = "aiorl/algos/bc.py"
MARWIL = "aiorl/algos/marwil.py"
BC_CONFIG = "aiorl/algos/bc_config.py"
MARWIL_CONFIG = "aiorl/algos/marwil_config.py"
LIB = "aiorl/algos/lib/offline.py"

MUTANTS = [
    dict(
        name="bc-loss-sign",
        path=BC,
        old="    return -log_prob.mean()\n",
        new="    return log_prob.mean()\n",
        tests=[T + "test_bc_loss_is_the_negative_mean_log_likelihood"],
    ),
    dict(
        name="bc-loss-sum-not-mean",
        path=BC,
        old="    return -log_prob.mean()\n",
        new="    return -log_prob.sum()\n",
        tests=[T + "test_bc_learner_loss_is_the_cross_entropy_of_the_dataset_actions"],
    ),
    dict(
        name="marwil-weights-not-normalised",
        path=MARWIL,
        old="    scaled = beta * advantage / (math.sqrt(squared_norm) + 1e-8)\n",
        new="    scaled = beta * advantage\n",
        tests=[T + "test_marwil_weights_are_exp_of_beta_times_the_normalised_advantage_clipped"],
    ),
    dict(
        name="marwil-weights-divided-by-the-square-not-its-root",
        path=MARWIL,
        old="    scaled = beta * advantage / (math.sqrt(squared_norm) + 1e-8)\n",
        new="    scaled = beta * advantage / (squared_norm + 1e-8)\n",
        tests=[T + "test_marwil_weights_are_exp_of_beta_times_the_normalised_advantage_clipped"],
    ),
    dict(
        name="marwil-weights-not-clipped",
        path=MARWIL,
        old="    return torch.exp(torch.clamp(scaled, max=math.log(max_weight)))\n",
        new="    return torch.exp(scaled)\n",
        tests=[T + "test_marwil_weights_are_exp_of_beta_times_the_normalised_advantage_clipped"],
    ),
    dict(
        name="marwil-moving-average-of-abs-not-square",
        path=MARWIL,
        old="    return average + rate * (float(advantage.pow(2).mean()) - average)\n",
        new="    return average + rate * (float(advantage.abs().mean()) - average)\n",
        tests=[T + "test_the_squared_advantage_norm_moves_toward_the_batchs_mean_square_at_its_rate"],
    ),
    dict(
        name="marwil-moving-average-never-moves",
        path=MARWIL,
        old="        self.squared_norm = update_squared_norm(self.squared_norm, advantage, m.moving_average_rate)\n",
        new="",
        tests=[T + "test_marwil_learner_on_a_constant_value_network"],
    ),
    dict(
        name="marwil-advantage-sign",
        path=MARWIL,
        old="        advantage = mc_return - value.detach()\n",
        new="        advantage = value.detach() - mc_return\n",
        tests=[T + "test_marwil_learner_on_a_constant_value_network"],
    ),
    dict(
        name="marwil-policy-loss-unweighted",
        path=MARWIL,
        old="    return -(weights * log_prob).mean(), 0.5 * (mc_return - value).pow(2).mean()\n",
        new="    return -log_prob.mean(), 0.5 * (mc_return - value).pow(2).mean()\n",
        tests=[T + "test_marwil_losses_by_hand", T + "test_marwil_learner_on_a_constant_value_network"],
    ),
    dict(
        name="marwil-value-loss-without-its-half",
        path=MARWIL,
        old="    return -(weights * log_prob).mean(), 0.5 * (mc_return - value).pow(2).mean()\n",
        new="    return -(weights * log_prob).mean(), (mc_return - value).pow(2).mean()\n",
        tests=[T + "test_marwil_losses_by_hand", T + "test_marwil_learner_on_a_constant_value_network"],
    ),
    dict(
        name="marwil-policy-steps-at-the-value-learning-rate",
        path=MARWIL,
        old="        self.policy_optimizer = Adam(self.policy_params, lr=m.learning_rate, eps=m.adam_eps)\n",
        new="        self.policy_optimizer = Adam(self.policy_params, lr=m.value_learning_rate, eps=m.adam_eps)\n",
        tests=[T + "test_marwil_with_beta_0_steps_exactly_as_bc"],
    ),
    dict(
        name="marwil-checkpoint-forgets-the-norm",
        path=MARWIL,
        old='        self.squared_norm = float(state["squared_norm"])\n',
        new="",
        tests=[T + "test_checkpoint_restores_the_learner"],
    ),
    dict(
        name="offline-actions-from-1-accepted",
        path=LIB,
        old="    if isinstance(space, gym.spaces.Discrete) and int(space.start) == 0:\n",
        new="    if isinstance(space, gym.spaces.Discrete):\n",
        tests=[T + "test_unsupported_action_spaces_are_refused_in_one_line"],
    ),
    dict(
        name="offline-integer-box-accepted",
        path=LIB,
        old="    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):\n",
        new="    if isinstance(space, gym.spaces.Box):\n",
        tests=[T + "test_unsupported_action_spaces_are_refused_in_one_line"],
    ),
    dict(
        name="offline-actors-made",
        path=LIB,
        old="    def make_actor(self, actor_index, num_actors, seed):\n        raise ConfigError(",
        new="    def make_actor(self, actor_index, num_actors, seed):\n        return None\n        raise ConfigError(",
        tests=[T + "test_no_actors"],
    ),
    dict(
        name="marwil-spec-without-mc-return",
        path=MARWIL,
        old='    dataset_fields = ("obs", "action", "mc_return")\n',
        new='    dataset_fields = ("obs", "action")\n',
        tests=[T + "test_transition_spec_names_dataset_fields_only"],
    ),
    dict(
        name="bc-not-offline-only",
        path=BC_CONFIG,
        old='    name = "bc"\n    offline_only = True\n',
        new='    name = "bc"\n    offline_only = False\n',
        tests=[T + "test_an_online_run_is_refused"],
    ),
    dict(
        name="bc-learning-rate-unchecked",
        path=BC_CONFIG,
        old='    check_positive(m.learning_rate, f"{key}.learning_rate")\n',
        new="",
        tests=[T + "test_config_errors"],
    ),
    dict(
        name="marwil-negative-beta-accepted",
        path=MARWIL_CONFIG,
        old="        if not m.beta >= 0:\n",
        new="        if m.beta < -10:\n",
        tests=[T + "test_config_errors"],
    ),
    dict(
        name="marwil-rate-above-1-accepted",
        path=MARWIL_CONFIG,
        old="        if not 0 < m.moving_average_rate <= 1:\n",
        new="        if not 0 < m.moving_average_rate:\n",
        tests=[T + "test_config_errors"],
    ),
]
