"""Mutants of issue 45's `iql` (aiorl/algos/iql.py and its config): the expectile value loss,
the clipped advantage weights, the critic target, the Gaussian actor, the exported mean and the
checks; each was checked by hand: applied, its tests run and seen failing, reverted."""

T = "tests/algos/test_iql.py::"
ALGO = "aiorl/algos/iql.py"
CONFIG = "aiorl/algos/iql_config.py"

MUTANTS = [
    dict(
        name="iql-expectile-weights-swapped",
        path=ALGO,
        old="    weight = torch.where(diff < 0, 1.0 - expectile, expectile)\n",
        new="    weight = torch.where(diff < 0, expectile, 1.0 - expectile)\n",
        tests=[
            T + "test_expectile_loss_weighs_positive_and_negative_errors_by_tau_and_1_minus_tau",
            T + "test_learner_losses_on_constant_networks",
        ],
    ),
    dict(
        name="iql-advantage-weights-not-clipped",
        path=ALGO,
        old="    return torch.exp(torch.clamp(beta * advantage, max=math.log(max_weight)))\n",
        new="    return torch.exp(beta * advantage)\n",
        tests=[
            T + "test_advantage_weights_are_exp_beta_a_clipped_at_max_weight",
            T + "test_learner_clips_the_weights_scales_rewards_and_a_terminal_row_does_not_bootstrap",
        ],
    ),
    dict(
        name="iql-value-target-max-of-critics",
        path=ALGO,
        old="            q_target = torch.min(self.critics_target[0](obs, action), self.critics_target[1](obs, action))\n",
        new="            q_target = torch.max(self.critics_target[0](obs, action), self.critics_target[1](obs, action))\n",
        tests=[T + "test_learner_losses_on_constant_networks"],
    ),
    dict(
        name="iql-critic-target-bootstraps-after-termination",
        path=ALGO,
        old="            y = m.reward_scale * reward + discount * self.value(next_obs)\n",
        new="            y = m.reward_scale * reward + m.gamma * self.value(next_obs)\n",
        tests=[T + "test_learner_clips_the_weights_scales_rewards_and_a_terminal_row_does_not_bootstrap"],
    ),
    dict(
        name="iql-reward-scale-ignored",
        path=ALGO,
        old="            y = m.reward_scale * reward + discount * self.value(next_obs)\n",
        new="            y = reward + discount * self.value(next_obs)\n",
        tests=[T + "test_learner_clips_the_weights_scales_rewards_and_a_terminal_row_does_not_bootstrap"],
    ),
    dict(
        name="iql-one-critic-trained",
        path=ALGO,
        old="        critic_loss = (y - q1).pow(2).mean() + (y - q2).pow(2).mean()\n",
        new="        critic_loss = (y - q1).pow(2).mean()\n",
        tests=[T + "test_learner_losses_on_constant_networks"],
    ),
    dict(
        name="iql-log-std-not-clipped",
        path=ALGO,
        old="        log_std = self.log_std.clamp(self.min_log_std, self.max_log_std)\n",
        new="        log_std = self.log_std\n",
        tests=[T + "test_actor_log_std_is_clipped_and_actions_taken_in_unit_range"],
    ),
    dict(
        name="iql-actor-log-prob-in-env-units",
        path=ALGO,
        old="        unit = self.mean.scale.to_unit(action.reshape(action.shape[0], -1)).clamp(-1.0, 1.0)\n",
        new="        unit = action.reshape(action.shape[0], -1)\n",
        tests=[T + "test_actor_log_std_is_clipped_and_actions_taken_in_unit_range"],
    ),
    dict(
        name="iql-exports-the-gaussian-actor",
        path=ALGO,
        old="        return copy.deepcopy(self.actor.mean).cpu(), self.algo.policy_meta(self.learner_steps)\n",
        new="        return copy.deepcopy(self.actor).cpu(), self.algo.policy_meta(self.learner_steps)\n",
        tests=[T + "test_exported_policy_is_the_actor_mean_within_bounds"],
    ),
    dict(
        name="iql-discrete-accepted",
        path=ALGO,
        old="        if not bounded or np.any(space.high <= space.low):\n",
        new="        if isinstance(space, gym.spaces.Box) and (not bounded or np.any(space.high <= space.low)):\n",
        tests=[T + "test_discrete_actions_refused_in_one_line"],
    ),
    dict(
        name="iql-not-offline-only",
        path=CONFIG,
        old="    offline_only = True\n",
        new="    offline_only = False\n",
        tests=[T + "test_offline_only"],
    ),
    dict(
        name="iql-expectile-1-accepted",
        path=CONFIG,
        old="    if not 0.5 <= m.expectile < 1:\n",
        new="    if not 0.5 <= m.expectile <= 1:\n",
        tests=[T + "test_config_errors_name_the_key"],
    ),
]
