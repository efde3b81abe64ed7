"""Offline benchmark: aiorl's offline algorithms beside d3rlpy's implementation of the same
algorithm, on the same dataset file, in one run.

For each case (an algorithm on a dataset: bc, bcq, cql and marwil on CartPole-v1; iql and marwil on
Pendulum-v1), both sides train the same number of gradient steps at the same batch size, and their
greedy policies are scored on the same grid (every ``--eval-every`` gradient steps and at the end)
by the same evaluation (`offline_peer.episodes.greedy_returns`: ``--eval-episodes`` episodes of the plain
gymnasium env, episode k with seed ``--eval-seed`` + k).

- aiorl: ``aiorl run CONFIG --set offline.dataset=DATA`` (the example's config: its own budget,
  ``offline.epochs``, or ``--steps``), checkpointing every ``--eval-every`` learner steps, with its
  evaluation during training and its target return off; once it has exited, each checkpoint's
  policy is scored. The time of an evaluation point is when its checkpoint was written, since the
  launch; the total is launch to exit.
- d3rlpy (`offline_peer/d3rlpy_worker.py`, in its own venv: d3rlpy 2.8 pins gymnasium 1.0, aiorl's venv has a
  newer one): the dataset exported to a .npz (`offline_peer.datasets.export_npz`), the same steps through
  d3rlpy's own `update`, scored between chunks; its times count from its process's launch with the
  evaluations left out. A missing venv is made on first use (``--d3rlpy-venv``: python -m venv, then
  ``pip install torch==2.13.0`` first, so that pip never pulls a CUDA torch, then d3rlpy).

Each row: the final return, the wall time (and gradient steps) to the threshold (475 on
CartPole-v1, -200 on Pendulum-v1: the first evaluation point at or above it), the total wall time.
Then the ratio table, aiorl over d3rlpy (< 1: aiorl is faster). d3rlpy has no MARWIL: its row
says so.

    python bench/offline.py --data CartPole-v1=datasets/cartpole_dqn_200 --data Pendulum-v1=datasets/pendulum_ddpg \
        --json bench-offline.json
    python bench/offline.py --cases bcq cql --eval-every 500
    python bench/offline.py --heuristic 20000 --cases bc bcq --steps 3000   # hand-made datasets, no `aiorl collect`
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import common
from common import ROOT

D3RLPY_VERSION = "2.8.1"
TORCH_PIN = "torch==2.13.0"  # the CPU wheel on disk; installed first so that d3rlpy's torch requirement is met
DEFAULT_VENV = ROOT / "bench" / ".venv-d3rlpy"
THRESHOLDS = {"CartPole-v1": 475.0, "Pendulum-v1": -200.0}


def log(line: str) -> None:
    print(line, flush=True)


# ---------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    name: str  # what --cases names
    algo: str  # aiorl's algorithm
    env: str
    config: str  # the example it runs, relative to the repository
    d3rlpy: str | None  # d3rlpy's algorithm class; None: d3rlpy has none
    why_not: str = ""  # the row's words where d3rlpy has none

    @property
    def threshold(self) -> float:
        return THRESHOLDS[self.env]


CASES = {
    c.name: c
    for c in (
        Case("bc", "bc", "CartPole-v1", "examples/bc_cartpole.yaml", "DiscreteBC"),
        Case("bcq", "bcq", "CartPole-v1", "examples/bcq_cartpole.yaml", "DiscreteBCQ"),
        Case("cql", "cql", "CartPole-v1", "examples/cql_cartpole.yaml", "DiscreteCQL"),
        Case("marwil", "marwil", "CartPole-v1", "examples/marwil_cartpole.yaml", None, "d3rlpy has no MARWIL"),
        Case("iql", "iql", "Pendulum-v1", "examples/iql_pendulum.yaml", "IQL"),
        Case("marwil_pendulum", "marwil", "Pendulum-v1", "examples/marwil_pendulum.yaml", None, "d3rlpy has no MARWIL"),
    )
}


def hidden_units(network: list) -> list[int]:
    """The widths of an aiorl network spec's linear layers (['linear:64', 'relu', ...] -> [64]);
    an empty spec is aiorl's default torso, two layers of 256."""
    units = [int(str(layer).split(":", 1)[1]) for layer in network if str(layer).startswith("linear:")]
    return units or [256, 256]


def d3rlpy_params(case: Case, cfg) -> tuple[dict, dict]:
    """d3rlpy's config for `case` with aiorl's config's values where d3rlpy has the same knob, and
    the hidden units of each of its encoders ("default": every encoder not named). An optimizer is
    a dict of AdamFactory's fields, a reward scale ``{"multiply": k}`` (the worker builds them)."""
    m, batch = cfg.model, int(cfg.agent.batch_size)

    def get(key: str, default=None):  # each algorithm's model section has its own keys
        return getattr(m, key, default)

    adam = {"eps": get("adam_eps", 1e-8), "clip_grad_norm": get("grad_clip_norm")}
    if case.d3rlpy in ("DiscreteBC", "BC"):
        params = {"batch_size": batch, "learning_rate": get("learning_rate", 1e-3), "optim_factory": adam}
        if case.d3rlpy == "DiscreteBC":
            params["beta"] = 0.0  # d3rlpy's penalty on the squared logits: aiorl's bc has none
        if case.d3rlpy == "BC":
            params["policy_type"] = "stochastic"  # aiorl's Box BC is a Gaussian fitted by likelihood
        return params, {"default": hidden_units(get("network", []))}
    if case.d3rlpy in ("DiscreteBCQ", "DiscreteCQL"):
        params = {
            "batch_size": batch,
            "learning_rate": get("learning_rate", 1e-3),
            "gamma": get("gamma", 0.99),
            "target_update_interval": int(get("sync_target_frequency", 1000)),
            "optim_factory": adam,
        }
        if case.d3rlpy == "DiscreteBCQ":
            params["action_flexibility"] = get("ratio_threshold", 0.3)
            # d3rlpy's beta is the same penalty on the behaviour head's squared logits (its default
            # 0.5 flattens the head until every action passes the threshold: DQN on the dataset)
            params["beta"] = get("behaviour_logit_penalty", 0.5)
        else:
            params["alpha"] = get("alpha", 1.0)
        return params, {"default": hidden_units(get("network", []))}
    if case.d3rlpy == "IQL":
        return iql_params(get, batch, adam)
    raise ValueError(f"no d3rlpy mapping for {case.d3rlpy}")


def iql_params(get, batch: int, adam: dict) -> tuple[dict, dict]:
    """IQL's: d3rlpy has one learning rate for its Q critics and V (the critic's)."""
    params = {
        "batch_size": batch,
        "actor_learning_rate": get("actor_learning_rate", 3e-4),
        "critic_learning_rate": get("critic_learning_rate", 3e-4),
        "actor_optim_factory": adam,
        "critic_optim_factory": adam,
        "gamma": get("gamma", 0.99),
        "tau": get("tau", 0.005),
        "expectile": get("expectile", 0.7),
        "weight_temp": get("beta", 3.0),
        "max_weight": get("max_weight", 100.0),
    }
    if get("reward_scale", 1.0) != 1.0:
        params["reward_scaler"] = {"multiply": get("reward_scale")}
    actor = get("actor_network", [])
    hidden = {
        "actor_encoder_factory": hidden_units(actor),
        "critic_encoder_factory": hidden_units(get("critic_network", []) or actor),
        "value_encoder_factory": hidden_units(get("value_network", []) or actor),
    }
    return params, {"default": hidden["actor_encoder_factory"], **hidden}


# ---------------------------------------------------------------------------------------------- datasets


@dataclass
class Data:
    """One env's dataset: where aiorl's run reads it (None: not on disk yet) and, once read, the
    rows themselves."""

    path: str | None
    dataset: object = None  # aiorl.offline.dataset.Dataset

    def rows(self):
        if self.dataset is None:
            from aiorl.offline.formats import load_dataset

            self.dataset = load_dataset(self.path)
        return self.dataset

    def on_disk(self, workdir: Path, name: str) -> str:
        """The path aiorl's run reads: a hand-made dataset is written in aiorl's own format first."""
        if self.path is None:
            from aiorl.offline.formats import write_dataset

            self.path = str(workdir / name)
            write_dataset(self.dataset, self.path)
        return self.path

    def npz(self, workdir: Path, name: str) -> Path:
        """The dataset as the .npz d3rlpy's worker loads (`offline_peer.datasets.export_npz`), made once."""
        from offline_peer.datasets import export_npz

        out = workdir / f"{name}.npz"
        if not out.exists():
            export_npz(self.rows(), out)
        return out


def datasets(cases: list[Case], args) -> dict[str, Data]:
    """The dataset each env's cases train on: --data ENV=PATH, else the first case's config's own
    offline.dataset; with --heuristic, hand-made ones (`offline_peer.datasets.heuristic_dataset`)."""
    given = dict(item.split("=", 1) for item in args.data)
    out = {}
    for case in cases:
        if case.env in out:
            continue
        if args.heuristic:
            from offline_peer.datasets import heuristic_dataset

            out[case.env] = Data(None, heuristic_dataset(case.env, args.heuristic))
        elif case.env in given:
            out[case.env] = Data(given[case.env])
        else:
            out[case.env] = Data(str(load_case_config(case, args, None).offline.dataset))
    return out


def load_case_config(case: Case, args, dataset: str | None):
    from aiorl.experiment.loading import load_config

    sets = list(args.set) + ([f"offline.dataset={dataset}"] if dataset else [])
    return load_config(config_path(case, args), sets)


def config_path(case: Case, args) -> Path:
    """The case's config: --config NAME=PATH, else its example."""
    given = dict(item.split("=", 1) for item in args.config)
    return Path(given[case.name]) if case.name in given else ROOT / case.config


def planned_steps(cfg, rows: int, args) -> int:
    """The gradient steps of a run: --steps, else the config's agent.scheduled_global_steps, else
    its offline.epochs over `rows` (learner steps x batch x learners = epochs x rows)."""
    if args.steps:
        return args.steps
    if cfg.agent.scheduled_global_steps:
        return int(cfg.agent.scheduled_global_steps)
    per_step = cfg.agent.batch_size * cfg.cluster.learners
    return math.ceil(cfg.offline.epochs * rows / per_step)


# ---------------------------------------------------------------------------------------------- aiorl's side


def aiorl_sets(args, dataset: str, run_dir: Path) -> list[str]:
    """The run's overrides: the dataset, a checkpoint on every evaluation point and all of them kept,
    and nothing that stops it early or competes for the cores (the bench evaluates afterwards)."""
    sets = [
        *args.set,
        f"offline.dataset={dataset}",
        f"run.dir={run_dir}",
        f"run.checkpoint_every={args.eval_every}",
        "run.keep_checkpoints=1000000",
        "run.eval_every=null",
        "run.eval_interval_s=null",
        "agent.target_return=null",
    ]
    if args.steps:
        sets += [f"agent.scheduled_global_steps={args.steps}", "offline.epochs=null"]
    return sets


def run_aiorl(case: Case, dataset: str, args) -> dict:
    """One `aiorl run` of the case's example to its own end, then its checkpoints scored in order."""
    run_dir = args.workdir / f"aiorl-{case.name}"
    sets = aiorl_sets(args, dataset, run_dir)
    with (args.workdir / f"aiorl-{case.name}.log").open("w") as output:
        launched = time.time()
        with common.Launch(config_path(case, args), run_dir, sets, output=output) as launch:
            code = launch.proc.wait(args.timeout)
        total_s = time.time() - launched
    if code != 0:
        return {"error": f"aiorl run exited {code} (log: {args.workdir / f'aiorl-{case.name}.log'})"}
    cfg = load_case_config(case, args, dataset)
    points = score_checkpoints(cfg, case, run_dir, launched, args)
    return summarize(points, case.threshold, total_s, steps=points[-1]["steps"] if points else 0)


def score_checkpoints(cfg, case: Case, run_dir: Path, launched: float, args) -> list[dict]:
    """Each checkpoint's greedy policy on the shared evaluation; its time is its file's mtime. The
    policy is the learner's own acting module (`Algorithm.acting_policy`), restored into a CPU
    learner as `aiorl eval --checkpoint` restores it."""
    import torch
    from offline_peer.episodes import greedy_returns

    from aiorl.evaluation.options import cpu_learner
    from aiorl.io import checkpoint

    learner, points = cpu_learner(cfg), []
    for path in checkpoint.list_checkpoints(run_dir / "checkpoints"):
        steps = int(checkpoint.CHECKPOINT_RE.match(path.name).group(1)) * cfg.cluster.learners
        learner.load_checkpoint(str(path))
        policy = learner.acting_policy()[0]

        def act(obs, policy=policy):
            with torch.no_grad():
                return policy(torch.as_tensor(obs)).numpy()

        score = greedy_returns(case.env, act, args.eval_episodes, args.eval_seed)
        seconds = path.stat().st_mtime - launched
        points.append(
            {"steps": steps, "seconds": round(seconds, 3), "eval_mean": score["mean"], "eval_std": score["std"]}
        )
        log(f"  {steps:>8} {seconds:>8.1f} s {score['mean']:>9.1f} +- {score['std']:.1f}")
    return sorted(points, key=lambda p: p["steps"])


def summarize(points: list[dict], threshold: float, total_s: float, steps: int) -> dict:
    """A side's row numbers from its evaluation points."""
    reached = next((p for p in points if p["eval_mean"] >= threshold), None)
    final = points[-1] if points else {}
    return {
        "steps": steps,
        "final_return": final.get("eval_mean"),
        "final_std": final.get("eval_std"),
        "best_return": max((p["eval_mean"] for p in points), default=None),
        "to_threshold_s": None if reached is None else reached["seconds"],
        "steps_to_threshold": None if reached is None else reached["steps"],
        "total_s": round(total_s, 3),
        "points": points,
    }


# ---------------------------------------------------------------------------------------------- d3rlpy's side


def d3rlpy_python(venv: Path) -> tuple[Path | None, str]:
    """The d3rlpy venv's interpreter, made first if missing; (None, why) when it cannot be."""
    python = venv / "bin" / "python"
    if python.exists():
        return python, ""
    log(f"making the d3rlpy venv {venv} (torch first, then d3rlpy {D3RLPY_VERSION})")
    steps = [
        [getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", TORCH_PIN],
        [str(python), "-m", "pip", "install", "--quiet", f"d3rlpy=={D3RLPY_VERSION}", TORCH_PIN],
    ]
    for command in steps:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"`{' '.join(command[-2:])}` failed: {tail[0]}"
    return python, ""


def run_d3rlpy(case: Case, python: Path, npz: Path, cfg, steps: int, args) -> dict:
    params, hidden = d3rlpy_params(case, cfg)
    job = {
        "data": str(npz),
        "algo": case.d3rlpy,
        "env": case.env,
        "params": params,
        "hidden": hidden,
        "steps": steps,
        "eval_every": args.eval_every,
        "eval_episodes": args.eval_episodes,
        "eval_seed": args.eval_seed,
        "threshold": case.threshold,
        "seed": args.seed,
        "threads": int(getattr(cfg.model, "torch_threads", 1)),
    }
    job_path, result_path = args.workdir / f"d3rlpy-{case.name}.json", args.workdir / f"d3rlpy-{case.name}-result.json"
    log_path = args.workdir / f"d3rlpy-{case.name}.log"
    with log_path.open("w") as output:
        job["launched"] = time.time()
        job_path.write_text(json.dumps(job, indent=1))
        command = [
            str(python),
            str(ROOT / "bench" / "offline_peer" / "d3rlpy_worker.py"),
            str(job_path),
            str(result_path),
        ]
        code = subprocess.run(
            command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, timeout=args.timeout
        ).returncode
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("  "):
            log(line)
    if code != 0:
        return {"error": f"d3rlpy worker exited {code} (log: {log_path})"}
    result = json.loads(result_path.read_text())
    row = summarize(result["points"], case.threshold, result["total_s"], result["steps"])
    return {**row, "version": result["version"], "params": params, "hidden": hidden, "eval_s": result["eval_s"]}


# ---------------------------------------------------------------------------------------------- tables


def fmt(value, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def result_table(rows: list[dict]) -> str:
    """One line per case and library: return, time and steps to the threshold, total time."""
    head = (
        f"{'case':<16} {'env':<12} {'library':<7} {'algorithm':<12} {'steps':>7} {'batch':>5} "
        f"{'final return':>16} {'to threshold':>18} {'total s':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        start = f"{r['case']:<16} {r['env']:<12} {r['library']:<7} {r['algorithm'] or '-':<12}"
        if r.get("note") or r.get("error"):
            lines.append(f"{start} {r.get('note') or r['error']}")
            continue
        ret = f"{fmt(r['final_return'])} +- {fmt(r['final_std'])}"
        reach = "not reached"
        if r["to_threshold_s"] is not None:
            reach = f"{r['to_threshold_s']:.1f} s ({r['steps_to_threshold']})"
        lines.append(f"{start} {r['steps']:>7} {r['batch_size']:>5} {ret:>16} {reach:>18} {fmt(r['total_s']):>8}")
    return "\n".join(lines)


def ratio(a, b) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def ratio_rows(rows: list[dict]) -> list[dict]:
    """Per case with both sides measured: aiorl's final return minus d3rlpy's, and aiorl's times
    over d3rlpy's (< 1: aiorl faster; '-' where a side never reached the threshold)."""
    by_case: dict[str, dict] = {}
    for r in rows:
        if not (r.get("note") or r.get("error")):
            by_case.setdefault(r["case"], {})[r["library"]] = r
    out = []
    for case, sides in by_case.items():
        if {"aiorl", "d3rlpy"} <= sides.keys():
            a, d = sides["aiorl"], sides["d3rlpy"]
            out.append(
                {
                    "case": case,
                    "return_diff": a["final_return"] - d["final_return"],
                    "to_threshold_ratio": ratio(a["to_threshold_s"], d["to_threshold_s"]),
                    "total_ratio": ratio(a["total_s"], d["total_s"]),
                    "reached": f"{'yes' if a['to_threshold_s'] is not None else 'no'}/"
                    f"{'yes' if d['to_threshold_s'] is not None else 'no'}",
                }
            )
    return out


def ratio_table(rows: list[dict]) -> str:
    head = f"{'case':<16} {'return aiorl - d3rlpy':>22} {'to threshold x':>15} {'total x':>8} {'reached a/d':>12}"
    lines = [head, "-" * len(head)]
    for r in ratio_rows(rows):
        lines.append(
            f"{r['case']:<16} {r['return_diff']:>+22.1f} {fmt(r['to_threshold_ratio'], '.2f'):>15} "
            f"{fmt(r['total_ratio'], '.2f'):>8} {r['reached']:>12}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES), help="which cases (default: all)")
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="ENV=PATH",
        help="the dataset of an env's cases (repeatable); default: the example's offline.dataset",
    )
    p.add_argument(
        "--heuristic",
        type=int,
        default=0,
        metavar="ROWS",
        help="train on hand-made datasets of ROWS steps instead (offline_peer/datasets.py)",
    )
    p.add_argument(
        "--steps", type=int, default=0, help="gradient steps of both sides (default: the example's own budget)"
    )
    p.add_argument("--eval-every", type=int, default=1000, help="gradient steps between evaluation points")
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument(
        "--eval-seed", type=int, default=1_000_000, help="episode k of every evaluation is reset with this + k"
    )
    p.add_argument("--seed", type=int, default=0, help="d3rlpy's seed (aiorl's: the config's run.seed, or --set)")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="CASE=PATH",
        help="another config for a case (repeatable); default: its example",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override of every aiorl config (repeatable)"
    )
    p.add_argument("--d3rlpy-venv", type=Path, default=DEFAULT_VENV, help="the venv d3rlpy runs in; made when missing")
    p.add_argument("--no-d3rlpy", action="store_true", help="aiorl's side only")
    p.add_argument(
        "--no-aiorl", action="store_true", help="d3rlpy's side only (its steps: --steps or the example's budget)"
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one side of one case may take")
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where runs, logs and the .npz go (default: a fresh temporary directory)",
    )
    p.add_argument("--json", default=None, help="write every number here ({rows, machine})")
    args = p.parse_args(argv)
    for item in args.data:
        if "=" not in item or item.split("=", 1)[0] not in THRESHOLDS:
            p.error(f"--data {item}: expected ENV=PATH with ENV one of {', '.join(THRESHOLDS)}")
    for item in args.config:
        if item.split("=", 1)[0] not in CASES or "=" not in item:
            p.error(f"--config {item}: expected CASE=PATH with CASE one of {', '.join(CASES)}")
    if args.eval_every < 1 or args.eval_episodes < 1:
        p.error("--eval-every and --eval-episodes: at least 1")
    return args


def base_row(case: Case, library: str, algorithm: str | None, dataset: str, cfg) -> dict:
    return {
        "case": case.name,
        "env": case.env,
        "library": library,
        "algorithm": algorithm,
        "dataset": dataset,
        "threshold": case.threshold,
        "batch_size": int(cfg.agent.batch_size) if cfg is not None else None,
    }


def run_case(case: Case, data: Data, python: Path | None, why_no_d3rlpy: str, args) -> list[dict]:
    """Both sides of one case: aiorl first (its learner steps are d3rlpy's), then d3rlpy."""
    stem = f"data-{case.env}"
    rows = len(data.rows())
    dataset = data.path if args.no_aiorl else data.on_disk(args.workdir, stem)
    cfg = load_case_config(case, args, dataset)
    out, steps = [], planned_steps(cfg, rows, args)
    label = dataset or data.rows().source
    if not args.no_aiorl:
        log(f"{case.name}: aiorl {case.algo} on {label} ({rows} rows)")
        result = run_aiorl(case, dataset, args)
        out.append({**base_row(case, "aiorl", case.algo, label, cfg), **result})
        steps = result.get("steps") or steps
    if args.no_d3rlpy:
        return out
    row = base_row(case, "d3rlpy", case.d3rlpy, label, cfg)
    if case.d3rlpy is None:
        out.append({**row, "note": case.why_not})
    elif python is None:
        out.append({**row, "note": f"d3rlpy skipped: {why_no_d3rlpy}"})
    else:
        log(f"{case.name}: d3rlpy {case.d3rlpy}, {steps} steps")
        out.append({**row, **run_d3rlpy(case, python, data.npz(args.workdir, stem), cfg, steps, args)})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="aiorl-bench-offline-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    cases = [CASES[name] for name in args.cases]
    python, why = (None, "--no-d3rlpy") if args.no_d3rlpy else d3rlpy_python(args.d3rlpy_venv)
    if python is None and not args.no_d3rlpy:
        log(f"d3rlpy's side is skipped: {why}")
    data = datasets(cases, args)
    rows: list[dict] = []
    for case in cases:
        rows += run_case(case, data[case.env], python, why, args)
    log("")
    log(result_table(rows))
    log("")
    log("aiorl over d3rlpy (< 1: aiorl takes less wall time)")
    log(ratio_table(rows))
    log(f"\nruns, logs and datasets: {args.workdir}")
    if args.json:
        common.write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
