"""`aiorl plot`: centred smoothing, bands only across runs of one config, x axes, formats, unknown metrics."""

import json

import numpy as np
import pytest
import yaml

from aiorl.cli.main import main
from aiorl.cli.plot import across_runs, group_runs, series, smooth


def fake_run(path, seed=0, algo="apex_dqn", n=40, offset=0.0):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        yaml.safe_dump({"algo": algo, "env": {"id": "CartPole-v1"}, "run": {"dir": str(path), "seed": seed}})
    )
    rows = [
        {
            "time_s": 0.5 * k,
            "env_steps": 100 * k,
            "learner_steps": 10 * k,
            "return_mean_100": k + offset,
            "phase": "RUNNING",
        }
        for k in range(n)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_smoothing_is_centred_and_does_not_lag():
    ramp = np.arange(50, dtype=np.float64)
    smoothed = smooth(ramp, 9)
    np.testing.assert_allclose(smoothed[4:-4], ramp[4:-4])  # a trailing mean would sit 4 rows behind
    assert smoothed[0] == pytest.approx(np.mean(ramp[:5])) and len(smoothed) == len(ramp)
    np.testing.assert_array_equal(smooth(ramp, 1), ramp)


def test_runs_of_one_config_form_one_group_with_a_min_max_band(tmp_path):
    a, b = fake_run(tmp_path / "a", seed=1), fake_run(tmp_path / "b", seed=2, offset=2.0, n=30)
    other = fake_run(tmp_path / "c", algo="dppo")
    assert group_runs([a, other, b]) == [[a, b], [other]]
    curves = [series(json_rows(p), "env_steps", "return_mean_100") for p in (a, b)]
    grid, mean, low, high = across_runs(curves)
    assert grid[-1] == 2900  # the range both runs cover
    np.testing.assert_allclose(mean, grid / 100 + 1.0)
    np.testing.assert_allclose(high - low, 2.0)


def json_rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name,magic", [("c.svg", b"<?xml"), ("c.pdf", b"%PDF"), ("c.png", b"\x89PNG")])
def test_format_follows_the_extension(tmp_path, name, magic, capsys):
    runs = [str(fake_run(tmp_path / "a", seed=1)), str(fake_run(tmp_path / "b", seed=2))]
    assert main(["plot", *runs, "-o", str(tmp_path / name), "--x", "learner_steps"]) == 0
    assert (tmp_path / name).read_bytes().startswith(magic)


def test_x_learner_steps_reads_learner_steps():
    x, y = series([{"learner_steps": 3, "env_steps": 300, "return_mean_100": 1.0}], "learner_steps", "return_mean_100")
    assert list(x) == [3.0] and list(y) == [1.0]


def test_unknown_metric_and_format_exit_2_naming_what_exists(tmp_path, capsys):
    run = str(fake_run(tmp_path / "a"))
    assert main(["plot", run, "-o", str(tmp_path / "c.png"), "--metric", "retrun_mean_100"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--metric 'retrun_mean_100': no run has values of it; did you mean 'return_mean_100'?" in err
    assert "(metrics there: env_steps, learner_steps, return_mean_100, time_s)" in err
    assert main(["plot", run, "-o", str(tmp_path / "c.jpg")]) == 2
    assert "expected a file name ending in .png, .svg, .pdf" in capsys.readouterr().err


def test_a_metric_named_in_words_suggests_the_evaluation_return_not_its_spread(tmp_path, capsys):
    run = fake_run(tmp_path / "a")
    evaluation = {"eval/return_mean": 9.0, "eval/return_std": 1.0, "eval/learner_steps": 10}
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"time_s": 30.0, "env_steps": 4000, "learner_steps": 400, **evaluation}) + "\n")
    assert main(["plot", str(run), "-o", str(tmp_path / "c.png"), "--metric", "eval_return"]) == 2
    assert "did you mean 'eval/return_mean'?" in capsys.readouterr().err
