"""Mutants of issue 45's datasets in and out: the format readers and writers, their checks, and
`aiorl collect`'s behaviour probabilities; each was checked by hand."""

FORMATS = "tests/offline/test_formats.py"
COLLECT = "tests/offline/test_collect.py"
BAD = "tests/offline/test_bad_datasets.py"
CHECKS = "aiorl/offline/formats/checks.py"
NATIVE = "aiorl/offline/formats/native.py"
EASYRL = "aiorl/offline/formats/easyrl.py"
MINARI = "aiorl/offline/formats/minari_data.py"
SNAPSHOT = "aiorl/offline/formats/snapshot.py"
BEHAVIOUR = "aiorl/evaluation/collect.py"

MUTANTS = [
    # --- checks: a bad dataset is refused, naming the row
    dict(
        name="offline-data-nan-not-checked",
        path=CHECKS,
        old="    _check_finite(dataset, where)\n",
        new="",
        tests=[f"{BAD}::test_a_bad_dataset_is_one_line_from_load_dataset"],
    ),
    dict(
        name="offline-data-discrete-action-upper-bound-not-checked",
        path=CHECKS,
        old="        row = first_bad((action < start) | (action >= start + int(space.n)))\n",
        new="        row = first_bad(action < start)\n",
        tests=[f"{BAD}::test_a_bad_dataset_is_one_line_from_load_dataset"],
    ),
    dict(
        name="offline-data-ragged-fields-not-checked",
        path=CHECKS,
        old="        if len(value) != rows:\n",
        new="        if False:\n",
        tests=[f"{BAD}::test_a_bad_dataset_is_one_line_from_load_dataset"],
    ),
    dict(
        name="offline-data-first-bad-row-off-by-one",
        path=CHECKS,
        old="    return int(hit[0]) if hit.size else None\n",
        new="    return int(hit[0]) + 1 if hit.size else None\n",
        tests=[f"{BAD}::test_a_bad_dataset_is_one_line_from_load_dataset"],
    ),
    dict(
        name="offline-data-env-spaces-not-compared",
        path="aiorl/offline/formats/__init__.py",
        old="    check_spaces_match(dataset, observation_space, action_space)\n",
        new="",
        tests=[f"{FORMATS}::test_spaces_are_checked_against_the_envs"],
    ),
    dict(
        name="offline-data-last-row-left-open",
        path=CHECKS,
        old="        dataset.truncated[-1] = True  # the log stopped, the episode did not end\n",
        new="        pass\n",
        tests=[f"{FORMATS}::test_a_log_that_stops_mid_episode_ends_it_truncated"],
    ),
    # --- readers and writers
    dict(
        name="offline-data-native-propensity-dropped",
        path=NATIVE,
        old='            propensity=arrays.get("propensity"),\n',
        new="            propensity=None,\n",
        tests=[f"{FORMATS}::test_aiorl_format_round_trips_every_field_and_the_spaces"],
    ),
    dict(
        name="offline-data-truncated-file-row-not-named",
        path=NATIVE,
        old="        raise DatasetError(cut_short(data_path) or ",
        new="        raise DatasetError(None or ",
        tests=[f"{BAD}::test_a_bad_dataset_is_one_line_from_load_dataset"],
    ),
    dict(
        name="offline-data-easyrl-done-read-as-truncated",
        path=EASYRL,
        old="            terminated=np.asarray(done, bool),\n            truncated=np.zeros(len(done), bool),\n",
        new="            terminated=np.zeros(len(done), bool),\n            truncated=np.asarray(done, bool),\n",
        tests=[f"{FORMATS}::test_easyrl_demo_lines_read_as_easyrl_writes_them"],
    ),
    dict(
        name="offline-data-easyrl-discrete-space-one-short",
        path=EASYRL,
        old="gym.spaces.Discrete(int(act.max()) + 1 if act.max() >= 0 else 1)",
        new="gym.spaces.Discrete(int(act.max()) if act.max() >= 1 else 1)",
        tests=[f"{FORMATS}::test_easyrl_demo_lines_read_as_easyrl_writes_them"],
    ),
    dict(
        name="offline-data-minari-next-obs-is-obs",
        path=MINARI,
        old='        "next_obs": obs[1:],\n',
        new='        "next_obs": obs[:-1],\n',
        tests=[f"{FORMATS}::test_a_dataset_written_by_minaris_own_data_collector_reads"],
    ),
    dict(
        name="offline-data-minari-propensity-not-written",
        path=MINARI,
        old='        infos = {} if dataset.propensity is None else {"propensity": ',
        new='        infos = {} if True else {"propensity": ',
        tests=[f"{FORMATS}::test_minari_round_trip_by_path_and_by_id"],
    ),
    dict(
        name="offline-data-snapshot-done-ignored",
        path=SNAPSHOT,
        old='    done = arrays["done"].astype(bool)\n',
        new='    done = np.zeros(len(arrays["done"]), bool)\n',
        tests=[f"{FORMATS}::test_replay_snapshots_read_as_rows_each_its_own_episode"],
    ),
    # --- aiorl collect: the behaviour's probability of the action taken
    dict(
        name="offline-data-epsilon-propensity-forgets-greedy-share",
        path=BEHAVIOUR,
        old="            return action, (1 - self.epsilon) * (action == greedy) + self.epsilon / n\n",
        new="            return action, (1 - self.epsilon) * (action == greedy) + 0 * self.epsilon / n\n",
        tests=[f"{COLLECT}::test_epsilon_greedy_propensities_of_a_policy"],
    ),
    dict(
        name="offline-data-gaussian-density-without-normaliser",
        path=BEHAVIOUR,
        old="np.exp(-0.5 * (z**2).sum(1)) / (np.sqrt(2 * np.pi) * self.noise) ** z.shape[1]\n",
        new="np.exp(-0.5 * (z**2).sum(1))\n",
        tests=[f"{COLLECT}::test_gaussian_noise_records_the_density_of_the_action"],
    ),
    dict(
        name="offline-data-box-density-of-the-clipped-action",
        path=BEHAVIOUR,
        old="            z = ((drawn - mean) / self.noise).reshape(rows, -1)\n",
        new="            z = ((action - mean) / self.noise).reshape(rows, -1)\n",
        tests=[f"{COLLECT}::test_box_epsilon_mixes_the_uniform_density_in"],
    ),
    dict(
        name="offline-data-episodes-reset-with-one-seed",
        path=BEHAVIOUR,
        old="                    obs[k] = np.asarray(envs[k].reset(seed=seed + started)[0])\n",
        new="                    obs[k] = np.asarray(envs[k].reset(seed=seed)[0])\n",
        tests=[f"{COLLECT}::test_episode_k_is_reset_with_seed_plus_k_beyond_the_first_lanes"],
    ),
    dict(
        name="offline-data-collect-overwrites-a-full-directory",
        path=BEHAVIOUR,
        old="    if out.exists() and (not out.is_dir() or any(out.iterdir())):\n",
        new="    if out.exists() and not out.is_dir():\n",
        tests=[f"{COLLECT}::test_an_existing_output_directory_is_refused"],
    ),
]
