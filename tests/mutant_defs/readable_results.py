"""Mutants of "results a person can read and trust" (issue 27), the first hour's rough edges and
reproducibility: each breaks one rule a test pins. The evaluation curve and evaluations on time
are in eval_curves.py."""

EVAL = "tests/test_eval.py::"

MUTANTS = [
    dict(
        name="video-looks-for-a-display",
        path="aiorl/evaluation/options.py",
        old='        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")\n',
        new="        pass\n",
        tests=[EVAL + "test_video_on_a_headless_host_prints_nothing_on_stderr"],
    ),
]

API = "tests/test_api.py::"
THREAD_RUN = API + "test_run_from_a_thread_blocks_and_returns_the_summary"
CALLBACK_RAISES = API + "test_an_on_metrics_callback_that_raises_stops_the_run_cleanly_and_its_error_surfaces"

MUTANTS += [
    dict(
        name="on-metrics-not-called-when-quiet",
        path="aiorl/launch/panel.py",
        old="            if self.on_row is not None:\n                self._read()\n            return",
        new="            return",
        tests=[THREAD_RUN],
    ),
    dict(
        name="on-metrics-error-does-not-stop-the-run",
        path="aiorl/launch/local.py",
        old="            if progress.on_row_error is not None and self.signals == 0:\n",
        new="            if False:\n",
        tests=[CALLBACK_RAISES],
    ),
    dict(
        name="on-metrics-error-swallowed",
        path="aiorl/api.py",
        old="        raise callback.error\n",
        new="        pass\n",
        tests=[CALLBACK_RAISES],
    ),
    dict(
        name="run-result-repr-is-the-whole-summary",
        path="aiorl/api.py",
        old="        return f\"<RunResult {' '.join(parts)}>\"\n",
        new="        return f\"<RunResult {' '.join(parts)} {self.summary}>\"\n",
        tests=[THREAD_RUN],
    ),
]

SUGGEST = "tests/test_suggest.py::"

MUTANTS += [
    dict(
        name="suggest-by-spelling-only",
        path="aiorl/core/suggest.py",
        old="    holding = [c for c in pool if _holds_every_word(name, c)]\n",
        new="    holding = []\n",
        tests=[SUGGEST + "test_a_name_made_of_words_gets_the_candidate_holding_them_the_preferred_one_first"],
    ),
    dict(
        name="suggest-ignores-prefer",
        path="aiorl/core/suggest.py",
        old="        if ranked:\n",
        new="        if False:\n",
        tests=[SUGGEST + "test_a_name_made_of_words_gets_the_candidate_holding_them_the_preferred_one_first"],
    ),
    dict(
        name="env-suggestion-from-the-registry-only",
        path="aiorl/envs/gym.py",
        old='        hint = did_you_mean(name, own + list(gym.registry), prefix=f"{module_name}:")\n',
        new='        hint = did_you_mean(name, list(gym.registry), prefix=f"{module_name}:")\n',
        tests=[SUGGEST + "test_a_misspelt_class_of_a_users_module_is_suggested_before_a_registered_id"],
    ),
]
