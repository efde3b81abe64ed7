"""Mutants of issue #26, second half (R2D2 and its sequence adder).

Each is a plausible bug in the code written for it; the tests named here must fail on it.
Run them with `.venv/bin/python tests/mutants.py --only r2d2`.
"""

R2D2 = "tests/algos/test_r2d2.py"
SEQ = "tests/kernels/test_sequence.py"
FRAMES = "tests/cluster/test_r2d2_frames.py"
SAME_SAMPLES = FRAMES + "::test_frame_layout_samples_exactly_the_sequences_the_naive_layout_samples"

MUTANTS = [
    # ------------------------------------------------------------------ the sequence adder
    dict(
        name="adder_truncation_is_terminal",
        path="aiorl/_ext/sequence.pyx",
        old="                _emit(w, o, count, e, h, term[i] != 0)",
        new="                _emit(w, o, count, e, h, end)",
        tests=[SEQ],
    ),
    dict(
        name="adder_truncation_does_not_end_the_sequence",
        path="aiorl/_ext/sequence.pyx",
        old="            end = term[i] or trunc[i]",
        new="            end = term[i]",
        tests=[SEQ],
    ),
    dict(
        name="adder_flush_marks_terminal",
        path="aiorl/_ext/sequence.pyx",
        old="            _emit(&w, &o, i, e, self._held[e], False)",
        new="            _emit(&w, &o, i, e, self._held[e], True)",
        tests=[SEQ],
    ),
    dict(
        name="overlap_off_by_one",
        path="aiorl/algos/r2d2_config.py",
        old="    return m.sequence_length // 2 if m.sequence_overlap is None else m.sequence_overlap",
        new="    return m.sequence_length // 2 if m.sequence_overlap is None else m.sequence_overlap - 1",
        tests=[R2D2],
    ),
    dict(
        name="actor_stores_the_state_after_the_step",
        path="aiorl/algos/r2d2.py",
        old="        self.acted_from.append(before)",
        new="        self.acted_from.append(self.states.state)",
        tests=[R2D2],
    ),
    # ------------------------------------------------------------------ targets and loss
    dict(
        name="mask_flipped",
        path="aiorl/algos/r2d2.py",
        old="    delta = torch.where(valid, y - q_taken, torch.zeros_like(q_taken))",
        new="    delta = torch.where(~valid, y - q_taken, torch.zeros_like(q_taken))",
        tests=[R2D2],
    ),
    dict(
        name="value_rescaling_dropped",
        path="aiorl/algos/r2d2.py",
        old="            y = h(ret + discount * h_inverse(bootstrap, rescale_eps), rescale_eps)",
        new="            y = ret + discount * bootstrap",
        tests=[R2D2],
    ),
    dict(
        name="terminal_zeroes_every_bootstrap_of_the_sequence",
        path="aiorl/algos/r2d2.py",
        old="    ends_episode = (boot == length) & terminal[:, None]",
        new="    ends_episode = terminal[:, None].expand_as(boot)",
        tests=[R2D2],
    ),
    dict(
        name="terminal_ignored_truncation_and_termination_alike",
        path="aiorl/algos/r2d2.py",
        old="    ends_episode = (boot == length) & terminal[:, None]",
        new="    ends_episode = (boot == length) & False",
        tests=[R2D2],
    ),
    dict(
        name="n_step_window_one_short",
        path="aiorl/algos/r2d2.py",
        old="    k = (length - t).clamp(min=0, max=n)",
        new="    k = (length - t).clamp(min=0, max=n - 1)",
        tests=[R2D2],
    ),
    dict(
        name="target_net_picks_the_action",
        path="aiorl/algos/r2d2.py",
        old="        best = q_online.detach().gather(1, index).argmax(dim=2, keepdim=True)",
        new="        best = q_target.gather(1, index).argmax(dim=2, keepdim=True)",
        tests=[R2D2],
    ),
    dict(
        name="priority_eta_swapped",
        path="aiorl/algos/r2d2.py",
        old="    return eta * masked.max(dim=1).values + (1.0 - eta) * mean",
        new="    return (1.0 - eta) * masked.max(dim=1).values + eta * mean",
        tests=[R2D2],
    ),
    dict(
        name="importance_weights_dropped",
        path="aiorl/algos/r2d2.py",
        old="    return (weights * per_row).mean()",
        new="    return per_row.mean()",
        tests=[R2D2],
    ),
    # ------------------------------------------------------------------ burn-in and start state
    dict(
        name="burn_in_with_gradient",
        path="aiorl/algos/r2d2.py",
        old="        with torch.no_grad():  # burn-in: the state only, for both networks",
        new="        with torch.enable_grad():  # burn-in: the state only, for both networks",
        tests=[R2D2],
    ),
    dict(
        name="burn_in_skipped",
        path="aiorl/algos/r2d2.py",
        old="            online_state = self.online.advance(obs[:, :burn], state)",
        new="            online_state = state",
        tests=[R2D2],
    ),
    dict(
        name="zero_and_stored_swapped",
        path="aiorl/algos/r2d2.py",
        old='        if self.m.start_state == "stored" and "state" in batch:',
        new='        if self.m.start_state == "zero" and "state" in batch:',
        tests=[R2D2],
    ),
    # ------------------------------------------------------------------ export
    dict(
        name="export_hands_back_the_state_it_was_given",
        path="aiorl/algos/r2d2.py",
        old="        q, _, _, state = self.q.step(obs, state)\n        return q.argmax(dim=1), state",
        new="        q, _, _, _ = self.q.step(obs, state)\n        return q.argmax(dim=1), state",
        tests=[R2D2],
    ),
    # ------------------------------------------------------------------ pixel sequences (frame layout)
    dict(
        name="frame_sample_reverses_the_steps_of_a_sequence",
        path="aiorl/replay/frames.py",
        old="        stack_rows = (indices[:, None] * per + np.arange(per)).reshape(-1) if per > 1 else indices",
        new="        stack_rows = (indices[:, None] * per + np.arange(per)[::-1]).reshape(-1) if per > 1 else indices",
        tests=[SAME_SAMPLES],
    ),
    dict(
        name="max_frames_ignores_the_lead_dims",
        path="aiorl/replay/frames.py",
        old="        return len(self.fields) * self.stacks_per_field * self.stack",
        new="        return len(self.fields) * self.stack",
        tests=[FRAMES + "::test_a_message_with_more_frames_than_its_rows_reference_is_refused"],
    ),
    dict(
        name="frame_count_bound_dropped",
        path="aiorl/replay/frames.py",
        old="        elif frame_ids.ndim != 1 or len(frame_ids) > self.layout.max_frames(n):",
        new="        elif frame_ids.ndim != 1:",
        tests=[FRAMES + "::test_a_message_with_more_frames_than_its_rows_reference_is_refused"],
    ),
    dict(
        name="actor_keeps_the_zero_padding_of_frame_ids",
        path="aiorl/algos/r2d2.py",
        old='            batch["obs"] = pad_with_last_observation(batch["obs"], batch["mask"])',
        new="            pass",
        tests=[FRAMES],
    ),
    dict(
        name="padding_overwrites_the_bootstrap_observation",
        path="aiorl/algos/r2d2.py",
        old="    steps = np.minimum(np.arange(obs.shape[1]), last[:, None])",
        new="    steps = np.minimum(np.arange(obs.shape[1]), np.maximum(last[:, None] - 1, 0))",
        tests=[SAME_SAMPLES],
    ),
]
