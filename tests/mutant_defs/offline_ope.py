"""Mutants of issue 45's off-policy evaluation (aiorl/ope, `aiorl ope`, the ope/* keys of the
evaluations during training); each was checked by hand: applied, its tests run and seen failing,
reverted."""

T = "tests/offline/test_ope.py::"
UNBIASED = T + "test_ips_and_dr_are_unbiased_on_a_small_mdp"
CARTPOLE = T + "test_wips_dr_fqe_estimate_three_cartpole_policies_within_10_percent"
SEEDED = T + "test_bootstrap_intervals_are_seeded"
CLI_BAD = T + "test_cli_refuses_bad_inputs_in_one_line"
CLI_OK = T + "test_cli_reports_every_estimate_with_its_interval"
TRAINING = T + "test_training_ope_scores_each_policy_and_rows_carry_the_estimates"

MUTANTS = [
    # --- the estimators
    dict(
        name="ips-without-the-episode-weight",
        path="aiorl/ope/importance.py",
        old="return _mean_over(counts, self.episode_weight * self.episode_return)",
        new="return _mean_over(counts, self.episode_return)",
        tests=[UNBIASED],
    ),
    dict(
        name="episodes-start-at-the-previous-end",
        path="aiorl/ope/episodes.py",
        old="starts = np.concatenate([[0], ends[:-1] + 1])",
        new="starts = np.concatenate([[0], ends[:-1]])",
        tests=[UNBIASED],
    ),
    dict(
        name="dr-model-term-with-the-weight-before-this-step",
        path="aiorl/ope/doubly_robust.py",
        old="weights * (trajectories.pad(reward, 0.0) - trajectories.pad(q_taken, 0.0))",
        new="weights * trajectories.pad(reward, 0.0) - previous * trajectories.pad(q_taken, 0.0)",
        tests=[UNBIASED],
    ),
    dict(
        name="dr-without-the-model-term",
        path="aiorl/ope/doubly_robust.py",
        old="(trajectories.pad(reward, 0.0) - trajectories.pad(q_taken, 0.0))",
        new="trajectories.pad(reward, 0.0)",
        tests=[UNBIASED],
    ),
    dict(
        name="swips-normalised-over-the-episodes-reaching-each-step",  # EasyRL's nanmean
        path="aiorl/ope/importance.py",
        old="        total = counts @ self.weights\n",
        new="        total = (counts @ (self.weights * (self.discounted != 0))) * counts.sum(axis=1, keepdims=True) / "
        "np.maximum(counts @ (self.discounted != 0), 1)\n",
        tests=[CARTPOLE],
    ),
    dict(
        name="wips-not-normalised",
        path="aiorl/ope/importance.py",
        old="return _ratio(counts @ (self.episode_weight * self.episode_return), counts @ self.episode_weight, np.nan)",
        new="return _ratio(counts @ (self.episode_weight * self.episode_return), counts.sum(axis=1), np.nan)",
        tests=[UNBIASED],
    ),
    dict(
        name="fqe-bootstraps-past-termination",
        path="aiorl/ope/fqe.py",
        old="self.live = torch.as_tensor(gamma * (1.0 - np.asarray(dataset.terminated, np.float32)))",
        new="self.live = torch.as_tensor(gamma * np.ones(len(dataset), np.float32))",
        tests=[CARTPOLE],
    ),
    dict(
        name="fqe-stops-at-the-behaviour-values",
        path="aiorl/ope/fqe.py",
        old="        for k in range(iterations):\n",
        new="        for k in range(iterations // 100):\n",
        tests=[CARTPOLE],
    ),
    dict(
        name="target-epsilon-ignored",
        path="aiorl/ope/target.py",
        old="probs = np.full((len(actions), n_actions), epsilon / n_actions)",
        new="probs = np.full((len(actions), n_actions), 0.0)",
        tests=[CARTPOLE],
    ),
    # --- behaviour probabilities, bootstrap
    dict(
        name="recorded-propensity-ignored",
        path="aiorl/ope/behaviour.py",
        old="    if dataset.propensity is not None:\n",
        new="    if False:\n",
        tests=[CARTPOLE],
    ),
    dict(
        name="bootstrap-unseeded",
        path="aiorl/ope/bootstrap.py",
        old="rng = np.random.default_rng(seed)",
        new="rng = np.random.default_rng()",
        tests=[SEEDED],
    ),
    # --- aiorl ope
    dict(
        name="ope-cli-user-error-exit-1",
        path="aiorl/cli/ope.py",
        old='        print(f"aiorl ope: {exc}", file=sys.stderr)\n        return 2\n',
        new='        print(f"aiorl ope: {exc}", file=sys.stderr)\n        return 1\n',
        tests=[CLI_BAD],
    ),
    dict(
        name="ope-policy-shape-unchecked",
        path="aiorl/ope/loading.py",
        old="    check_against_dataset(path, dataset)\n",
        new="",
        tests=[CLI_BAD],
    ),
    dict(
        name="ope-cli-no-fqe-progress",
        path="aiorl/cli/ope.py",
        old="            progress=progress,\n",
        new="",
        tests=[CLI_OK],
    ),
    # --- during training
    dict(
        name="evaluation-rows-drop-the-estimates",
        path="aiorl/runtime/evaluator.py",
        old='        **{f"ope/{k[len(OPE_PREFIX) :]}": v for k, v in evaluation.items() if k.startswith(OPE_PREFIX)},\n',
        new="",
        tests=[TRAINING],
    ),
    dict(
        name="training-fqe-starts-over-each-evaluation",
        path="aiorl/ope/training.py",
        old="        q = self.fqe.fit(next_target, None if self.scored == 0 else LATER_FQE_ITERATIONS)\n",
        new="        fqe = self.fqe if self.scored == 0 else FittedQ(self.dataset, self.gamma, seed=7)\n"
        "        q = fqe.fit(next_target, None if self.scored == 0 else LATER_FQE_ITERATIONS)\n",
        tests=[TRAINING],
    ),
]
