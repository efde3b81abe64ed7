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
