"""Mutants of issue 45's discrete `bcq` and `cql` (aiorl/algos/bcq.py, cql.py, their configs and
aiorl/algos/lib/offline_q.py): the ratio_threshold filter, the target, the behaviour loss, the
conservative term, the acting policy and the checks."""

T = "tests/algos/test_bcq_cql.py::"
BCQ = "aiorl/algos/bcq.py"
CQL = "aiorl/algos/cql.py"
BCQ_CONFIG = "aiorl/algos/bcq_config.py"
CQL_CONFIG = "aiorl/algos/cql_config.py"
LIB = "aiorl/algos/lib/offline_q.py"

MUTANTS = [
    dict(
        name="bcq-filter-keeps-the-ratio-boundary-the-wrong-way",
        path=BCQ,
        old="    return logits - logits.amax(dim=1, keepdim=True) <= math.log(ratio_threshold)\n",
        new="    return logits - logits.amax(dim=1, keepdim=True) >= math.log(ratio_threshold)\n",
        tests=[T + "test_the_filter_rules_out_actions_at_or_below_the_ratio"],
    ),
    dict(
        name="bcq-filter-uses-the-ratio-not-its-log",
        path=BCQ,
        old="    return logits - logits.amax(dim=1, keepdim=True) <= math.log(ratio_threshold)\n",
        new="    return logits - logits.amax(dim=1, keepdim=True) <= -ratio_threshold\n",
        tests=[T + "test_the_filter_rules_out_actions_at_or_below_the_ratio"],
    ),
    dict(
        name="bcq-target-ignores-the-filter",
        path=BCQ,
        old="    return n_step_q_target(reward, discount, q_next_target, allowed_only(chooser, logits_next, ratio_threshold))\n",
        new="    return n_step_q_target(reward, discount, q_next_target, chooser)\n",
        tests=[T + "test_the_target_takes_the_best_allowed_action_valued_by_the_target_net"],
    ),
    dict(
        name="bcq-target-always-double-q",
        path=BCQ,
        old="    chooser = q_next_online if double_q else q_next_target\n",
        new="    chooser = q_next_online\n",
        tests=[T + "test_the_target_takes_the_best_allowed_action_valued_by_the_target_net"],
    ),
    dict(
        name="bcq-acting-ignores-the-filter",
        path=BCQ,
        old="        return allowed_only(q, logits, self.ratio_threshold).argmax(dim=1)\n",
        new="        return q.argmax(dim=1)\n",
        tests=[T + "test_the_acting_policy_applies_the_filter"],
    ),
    dict(
        name="bcq-behaviour-loss-without-the-penalty",
        path=BCQ,
        old="    return nn.functional.cross_entropy(logits, action) + logit_penalty * logits.pow(2).mean()\n",
        new="    return nn.functional.cross_entropy(logits, action)\n",
        tests=[T + "test_behaviour_loss_is_cross_entropy_plus_the_logit_penalty"],
    ),
    dict(
        name="bcq-behaviour-head-not-trained",
        path=BCQ,
        old='        norms = self.apply([("loss", q_loss + imitation, self.params, self.optimizer)])\n',
        new='        norms = self.apply([("loss", q_loss, self.params, self.optimizer)])\n',
        tests=[T + "test_a_learner_step_lowers_its_loss_and_gives_priorities"],
    ),
    dict(
        name="cql-conservative-term-uses-the-max",
        path=CQL,
        old="    return (weights * (torch.logsumexp(q_all, dim=1) - q_taken)).mean()\n",
        new="    return (weights * (q_all.max(dim=1).values - q_taken)).mean()\n",
        tests=[T + "test_the_conservative_term_matches_a_hand_computation"],
    ),
    dict(
        name="cql-conservative-term-unweighted",
        path=CQL,
        old="    return (weights * (torch.logsumexp(q_all, dim=1) - q_taken)).mean()\n",
        new="    return (torch.logsumexp(q_all, dim=1) - q_taken).mean()\n",
        tests=[T + "test_the_conservative_term_matches_a_hand_computation"],
    ),
    dict(
        name="cql-alpha-not-applied",
        path=CQL,
        old='        norms = self.apply([("loss", q_loss + m.alpha * conservative, self.params, self.optimizer)])\n',
        new='        norms = self.apply([("loss", q_loss, self.params, self.optimizer)])\n',
        tests=[T + "test_cql_alpha_weighs_the_conservative_term_in_the_step"],
    ),
    dict(
        name="bcq-ratio-threshold-one-accepted",
        path=BCQ_CONFIG,
        old="        if not 0 <= m.ratio_threshold < 1:\n",
        new="        if not 0 <= m.ratio_threshold <= 1:\n",
        tests=[T + "test_config_checks_name_the_key"],
    ),
    dict(
        name="cql-negative-alpha-accepted",
        path=CQL_CONFIG,
        old="        if not m.alpha >= 0:\n",
        new="        if False:\n",
        tests=[T + "test_config_checks_name_the_key"],
    ),
    dict(
        name="offline-q-box-actions-accepted",
        path=LIB,
        old="    if isinstance(space, gym.spaces.Discrete) and int(space.start) == 0:\n        return int(space.n)\n",
        new="    if True:\n        return int(getattr(space, 'n', 1))\n",
        tests=[T + "test_box_actions_are_refused_in_one_line_saying_what_is_supported"],
    ),
]
