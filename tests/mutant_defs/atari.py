"""Mutants of the pixel work (issue 16): frames stored and sent once, the Atari envs.

Each was applied by hand, its tests run and seen to fail, then reverted.
"""

FRAMES = "tests/replay/test_replay_frames.py::test_frame_layout_samples_exactly_what_the_naive_layout_samples"
ORACLE = "tests/kernels/test_framestore.py::test_compiled_store_matches_the_oracle"

MUTANTS = [
    dict(
        name="run-extends-into-a-used-slot",
        path="aiorl/_ext/framestore.pyx",
        old="if pos + 1 < self.run_frames and self._fill[run] == pos + 1:",
        new="if pos + 1 < self.run_frames and self._fill[run] >= pos + 1:",
        tests=[
            "tests/kernels/test_framestore.py::test_a_frame_goes_after_its_predecessor_so_streams_stay_contiguous",
            FRAMES,
        ],
    ),
    dict(
        name="run-freed-with-a-live-frame",
        path="aiorl/_ext/framestore.pyx",
        old="        if self._run_live[run] == 0:\n            self._free_runs[self._nfree_runs] = run",
        new="        if self._run_live[run] <= 1:\n            self._free_runs[self._nfree_runs] = run",
        tests=[ORACLE, FRAMES],
    ),
    dict(
        name="new-id-may-displace-keep-from",
        path="aiorl/_ext/framestore.pyx",
        old="                if holder >= keep_from:",
        new="                if holder > keep_from:",
        tests=["tests/kernels/test_framestore.py::test_stream_holds_ids_until_keep_from_passes_them", ORACLE],
    ),
    dict(
        name="keep-from-release-skips-an-id",
        path="aiorl/_ext/framestore.pyx",
        old="                for frame_id in range(self.keep_from, keep_from):",
        new="                for frame_id in range(self.keep_from + 1, keep_from):",
        tests=[ORACLE, FRAMES],
    ),
    dict(
        name="evicted-row-keeps-its-frames",
        path="aiorl/replay/frames.py",
        old="        evicted = slots[max(0, self.capacity - before) :]\n",
        new="        evicted = slots[max(0, self.capacity - before) + 1 :]\n",
        tests=[FRAMES, "tests/replay/test_replay_frames.py::test_evicted_rows_release_their_frames"],
    ),
    dict(
        name="keep-from-ignores-the-rows-sent",
        path="aiorl/replay/frame_sender.py",
        old="        keep_from = min(future, int(refs.min())) if len(refs) else future",
        new="        keep_from = future",
        tests=[FRAMES],
    ),
    dict(
        name="sender-assumes-every-step-shifts-the-stack",
        path="aiorl/replay/frame_sender.py",
        old="        if np.array_equal(stack[:-1], previous[1:]):",
        new="        if True:",
        tests=[FRAMES],
    ),
    dict(
        name="life-loss-resets-the-game",
        path="aiorl/envs/atari.py",
        old="        if self.game_over or seed is not None or self._last is None:",
        new="        if True:",
        tests=["tests/algos/test_atari.py::test_life_loss_ends_a_training_episode_but_not_the_game"],
    ),
    dict(
        name="vector-padding-off-by-one",
        path="aiorl/envs/atari.py",
        old="        first = k - 1 - int(steps[e])",
        new="        first = k - 2 - int(steps[e])",
        tests=["tests/algos/test_atari.py::test_ale_vector_backend_gives_the_gymnasium_transitions"],
    ),
    dict(
        name="eval-uses-the-training-variant",
        path="aiorl/evaluation/episodes.py",
        old="make_env(render_env_config(env_cfg, video_dir, render), evaluation=True)",
        new="make_env(render_env_config(env_cfg, video_dir, render))",
        tests=["tests/algos/test_atari.py::test_eval_plays_full_games_with_raw_rewards"],
    ),
    dict(
        name="cuda-not-checked-before-start",
        path="aiorl/runtime/algorithm.py",
        old="        if not torch.cuda.is_available():",
        new="        if False:",
        tests=["tests/algos/test_atari.py::test_a_cuda_device_without_cuda_is_a_config_error_before_anything_starts"],
    ),
    dict(
        name="compressed-frame-count-unchecked",
        path="aiorl/replay/frames.py",
        old="    if not 0 <= count <= layout.max_frames(rows):",
        new="    if not 0 <= count:",
        tests=["tests/replay/test_replay_frames.py::test_compressed_frames_are_checked_before_they_are_unpacked"],
    ),
    dict(
        name="wrapper-keywords-unchecked",
        path="aiorl/envs/wrappers.py",
        old="            if kw not in accepted:",
        new="            if False:",
        tests=["tests/algos/test_atari.py::test_bad_wrappers_are_config_errors_naming_the_item"],
    ),
]
