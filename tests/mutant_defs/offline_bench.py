"""Mutants of issue 45's peer bench, bench/offline.py and its helpers (bench/offline_peer/): the
threshold, the ratio table, the d3rlpy config derived from aiorl's, the .npz d3rlpy reads and the
shared evaluation's seeds; each was checked by hand."""

TEST = "tests/tooling/test_bench_offline.py"
BENCH = "bench/offline.py"

MUTANTS = [
    dict(
        name="bench-offline-threshold-strict",
        path=BENCH,
        old='    reached = next((p for p in points if p["eval_mean"] >= threshold), None)\n',
        new='    reached = next((p for p in points if p["eval_mean"] > threshold), None)\n',
        tests=[f"{TEST}::test_a_row_reaches_the_threshold_at_its_first_point_at_or_above_it"],
    ),
    dict(
        name="bench-offline-ratio-upside-down",
        path=BENCH,
        old="    return None if a is None or b is None or b == 0 else a / b\n",
        new="    return None if a is None or b is None or b == 0 else b / a\n",
        tests=[f"{TEST}::test_tables_show_both_sides_and_their_ratio"],
    ),
    dict(
        name="bench-offline-bcq-flexibility-not-aiorls",
        path=BENCH,
        old='            params["action_flexibility"] = get("ratio_threshold", 0.3)\n',
        new='            params["action_flexibility"] = 0.3\n',
        tests=[f"{TEST}::test_d3rlpy_gets_aiorls_knobs"],
    ),
    dict(
        name="bench-offline-bcq-logit-penalty-d3rlpys-default",
        path=BENCH,
        old='            params["beta"] = get("behaviour_logit_penalty", 0.5)\n',
        new='            params["beta"] = 0.5\n',
        tests=[f"{TEST}::test_d3rlpy_gets_aiorls_knobs"],
    ),
    dict(
        name="bench-offline-iql-temperature-not-beta",
        path=BENCH,
        old='        "weight_temp": get("beta", 3.0),\n',
        new='        "weight_temp": 3.0,\n',
        tests=[f"{TEST}::test_d3rlpy_gets_aiorls_knobs"],
    ),
    dict(
        name="bench-offline-data-env-unchecked",
        path=BENCH,
        old='        if "=" not in item or item.split("=", 1)[0] not in THRESHOLDS:\n',
        new='        if "=" not in item:\n',
        tests=[f"{TEST}::test_a_bad_argument_is_refused"],
    ),
    dict(
        name="bench-offline-npz-terminals-from-truncated",
        path="bench/offline_peer/datasets.py",
        old='        "terminals": np.asarray(dataset.terminated, dtype=bool),\n',
        new='        "terminals": np.asarray(dataset.truncated, dtype=bool),\n',
        tests=[f"{TEST}::test_the_npz_holds_the_same_rows_and_episodes"],
    ),
    dict(
        name="bench-offline-eval-one-seed",
        path="bench/offline_peer/episodes.py",
        old="            obs, _ = env.reset(seed=seed + k)\n",
        new="            obs, _ = env.reset(seed=seed)\n",
        tests=[f"{TEST}::test_both_sides_are_scored_on_the_episodes_aiorl_eval_plays"],
    ),
]
