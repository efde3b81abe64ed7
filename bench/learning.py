"""Learning benchmark: how many env steps, learner steps and seconds a config
needs until its greedy policy reaches an evaluation threshold.

Two ways to run a config:

- ``run`` (the real thing): ``aiorl run CONFIG`` with checkpoints every
  ``--checkpoint-every`` learner steps; each new checkpoint's policy is
  evaluated greedily (``--eval-episodes`` episodes) while the run goes on.
  At the threshold the run is interrupted (SIGINT: the normal shutdown
  phases) and ``aiorl eval`` scores the exported final policy. Without
  ``--stop-at-threshold`` the run ends by its own stop criterion.
  Synchronous algorithms (dppo, es) checkpoint every iteration and keep
  every checkpoint; the policy evaluated is the first checkpoint at or
  after each multiple of ``--eval-every-env-steps`` env steps trained on
  (a fixed grid, as other libraries' evaluation callbacks), and a row's
  ``eval_done_s`` (since launch) includes that evaluation's own wall time.
  IMPALA goes on the same grid, checkpointing about every fifth of a grid
  step's learner steps. Each run also reports its actors' idle fraction
  (the time they waited, over their loop's wall time, measured by the
  actors themselves: ``summary.json``).
- ``compare`` (several configs, several seeds): ``run`` on each, then a
  table of the time to the threshold and the actors' idle fraction per
  config, the median over seeds beside each.
  ``--recurrent-ppo``: beside them, sb3-contrib's RecurrentPPO (RL Zoo's
  CartPoleNoVel-v1 settings, the published agent's VecNormalize) on the first
  config's env with its wrappers, same seeds, same grid, same evaluation
  episodes, in this process; its time to threshold leaves out its earlier
  evaluations (aiorl's run beside the run). Without sb3-contrib
  (``pip install 'aiorl[bench]'``) that comparison is skipped in one line.
- ``harness``: actors, one prioritized replay and one learner in a single
  process and loop (round-robin rollouts, ``--updates-per-step`` learner
  steps per env step). Deterministic for a seed; the tool for tuning
  hyper-parameters without the runtime.

Both print a table (one row per evaluation), a summary line and, with
``--json``, write every number. The reference measured in the same
invocation is the first evaluation (the untrained policy).

    python bench/learning.py run examples/apex_dqn_cartpole.yaml --threshold 475
    python bench/learning.py compare examples/impala_cartpole.yaml examples/dppo_cartpole.yaml --seeds 0 1 2 \
        --threshold 475 --eval-episodes 20 --stop-at-threshold
    python bench/learning.py harness examples/apex_ddpg_pendulum.yaml --threshold -200 --max-env-steps 40000

- ``table`` (does the example solve every time?): ``--seeds N`` fresh runs
  of one config (run.seed 0..N-1), each ended by its own stop criterion
  (with evaluation during training on, ``agent.target_return`` on the
  evaluation return), then ``aiorl eval RUN`` (the policy it picks: the best
  one the evaluations kept) with ``--final-episodes`` episodes. ``--load``
  runs a busy neighbour (one busy-loop process, pinned to one core where the
  OS allows) beside every run, started and ended by the bench. It prints one
  row per seed and the success rate (final evaluation >= ``--threshold``),
  the median and worst final evaluation, and the median and worst time to
  threshold (the run's first evaluation during training at or above it,
  seconds since the run's RUNNING phase began).
- ``eval-cost``: what evaluation during training costs training: the config
  as it is and with evaluation off, alternating ``--pairs`` times, the
  learner steps/s and env steps/s of each (over the RUNNING phase) and
  their ratio. Both runs end at the config's own step budget
  (``agent.target_return`` is cleared so that neither stops early).
  ``--load``: beside a busy neighbour. It also prints the evaluations' lag.
- ``eval-lag``: are evaluations on time? ``--runs N`` runs of each config,
  each ended by its own stop criterion (``--load``: beside a busy
  neighbour); each evaluation's lag (``eval/lag_s``: from when it was due
  until its result was in) over every run, p50, p90 and worst, the
  evaluations skipped (due and never scored), and whether the run stopped
  on its target return or ran out its budget.

    python bench/learning.py table examples/apex_dqn_cartpole.yaml --seeds 20 --load --threshold 475
    python bench/learning.py eval-cost examples/apex_dqn_cartpole.yaml --pairs 3
    python bench/learning.py eval-lag examples/*cartpole*.yaml --runs 2 --load

``run --versus KEY=VALUE`` (repeatable) runs the config a second time with
those overrides too, alternating ``--pairs`` times, and prints the ratio of
the variant's time to threshold to the reference's (medians over the pairs),
e.g. what the rate limiter does:

    python bench/learning.py run examples/apex_dqn_cartpole.yaml --threshold 475 --stop-at-threshold \
        --versus agent.samples_per_insert=8 --pairs 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import numpy as np
from common import ROOT

from aiorl.algos import get_settings
from aiorl.config import Config
from aiorl.envs import EnvRunner
from aiorl.evaluation.episodes import run_episodes_together
from aiorl.evaluation.policies import load_policy
from aiorl.experiment.loading import load_config
from aiorl.io.checkpoint import CheckpointError
from aiorl.runtime.algorithm import build_algorithm
from aiorl.runtime.learner import weights_digest

EVAL_SEED = 1_000_000  # evaluation episodes are not the training seeds


def log(line: str) -> None:
    print(line, flush=True)


# --------------------------------------------------------------------------
# Evaluation of a learner core / a checkpoint


def evaluate_core(algo, core, episodes: int, seed: int = EVAL_SEED) -> dict:
    """Export `core`'s policy (torch.export, as `aiorl eval` loads it) and run it greedily."""
    with tempfile.TemporaryDirectory() as tmp:
        path = core.export_policy(tmp)
        return run_episodes_together(load_policy(path), algo.cfg.env, episodes, seed)


class CheckpointEvaluator:
    """Builds a learner core once and evaluates checkpoint files with it."""

    def __init__(self, cfg: Config):
        import torch

        torch.set_num_threads(1)
        self.algo = build_algorithm(cfg)
        cfg.model.device = "cpu"
        self.core = self.algo.make_learner(0, 1, 0)

    def __call__(self, path: Path, episodes: int) -> tuple[dict, dict]:
        counters = self.load(path)
        return counters, evaluate_core(self.algo, self.core, episodes)

    def load(self, path: Path) -> dict:
        """Restore `path` into the core; its meta, with the on-policy cores' env steps trained on."""
        meta = self.core.load_checkpoint(str(path))
        return {**meta, "env_steps_trained": getattr(self.core, "env_steps_trained", 0)}

    def evaluate(self, episodes: int) -> dict:
        return evaluate_core(self.algo, self.core, episodes)


# --------------------------------------------------------------------------
# In-process harness


def harness_replay(cfg: Config, algo):
    """The harness's one replay: prioritized or uniform, as the config's agent says."""
    from aiorl.replay import PrioritizedReplayBuffer, ReplayBuffer

    a = cfg.agent
    if a.prioritized_replay:
        return PrioritizedReplayBuffer(
            a.buffer_size,
            algo.transition_spec(),
            alpha=a.prioritized_replay_alpha,
            eps=a.prioritized_replay_eps,
            seed=cfg.run.seed + 1000,
        )
    return ReplayBuffer(a.buffer_size, algo.transition_spec(), seed=cfg.run.seed + 1000)


def harness_learn(a, replay, learner, actors, learner_steps: int, target_steps: int, version: int) -> tuple[int, int]:
    """Learner steps until `target_steps`, publishing to the actors every publish_interval; the
    learner steps and weights version after."""
    while learner_steps < target_steps:
        frac = min(1.0, learner_steps / a.scheduled_global_steps) if a.scheduled_global_steps else 0.0
        beta = a.prioritized_replay_beta
        if a.prioritized_replay_beta_final is not None:
            beta += frac * (a.prioritized_replay_beta_final - beta)
        sample = replay.sample(a.batch_size, beta) if a.prioritized_replay else replay.sample(a.batch_size)
        result = learner.step(sample)
        learner_steps += 1
        if a.prioritized_replay and result.priorities is not None:
            replay.update_priorities(sample["indices"], result.priorities, sample.get("generations"))
        if learner_steps % a.publish_interval == 0:
            version += 1
            weights = learner.get_weights()
            for actor in actors:
                actor.set_weights(weights, version)
    return learner_steps, version


def harness(cfg: Config, args) -> dict:
    if get_settings(cfg.algo).is_synchronous(cfg):
        raise SystemExit(
            f"bench/learning.py harness: {cfg.algo} is synchronous; the harness drives replay algorithms, use `run`"
        )
    algo = build_algorithm(cfg)
    a, n_actors = cfg.agent, cfg.cluster.actors
    seeds = [cfg.run.seed + 10_000 * (i + 1) for i in range(n_actors)]
    actors = [algo.make_actor(i, n_actors, seeds[i]) for i in range(n_actors)]
    runners = [EnvRunner(cfg.env, cfg.env.num_envs, seeds[i]) for i in range(n_actors)]
    learner = algo.make_learner(0, 1, cfg.run.seed + 100)
    replay = harness_replay(cfg, algo)
    version = 0
    for actor in actors:
        actor.set_weights(learner.get_weights(), version)

    rows: list[dict] = []
    train_returns: list[float] = []
    env_steps = learner_steps = 0
    next_eval = 0
    t0 = time.perf_counter()
    reached = None
    log(f"{'env_steps':>10} {'learner_steps':>13} {'seconds':>8} {'train_ret':>10} {'eval_mean':>10} {'eval_std':>9}")
    while True:
        if env_steps >= next_eval:
            result = evaluate_core(algo, learner, args.eval_episodes)
            row = {
                "env_steps": env_steps,
                "learner_steps": learner_steps,
                "seconds": round(time.perf_counter() - t0, 2),
                "train_return_mean": float(np.mean(train_returns[-20:])) if train_returns else None,
                "eval_mean": result["mean"],
                "eval_std": result["std"],
            }
            rows.append(row)
            tr = row["train_return_mean"]
            log(
                f"{env_steps:>10} {learner_steps:>13} {row['seconds']:>8.1f} "
                f"{'-' if tr is None else format(tr, '.1f'):>10} {result['mean']:>10.1f} {result['std']:>9.1f}"
            )
            if args.threshold is not None and result["mean"] >= args.threshold and reached is None:
                reached = row
                if args.stop_at_threshold:
                    break
            next_eval += args.eval_every
        if env_steps >= args.max_env_steps or time.perf_counter() - t0 >= args.max_seconds:
            break
        for actor, runner in zip(actors, runners):
            rollout = runner.rollout(actor.act, a.sample_batch_size)
            train_returns.extend(runner.pop_episodes()[0])
            batch, priorities = actor.postprocess(rollout)
            if batch:
                if a.prioritized_replay:
                    replay.add(batch, priorities)
                else:
                    replay.add(batch)
            env_steps += a.sample_batch_size * cfg.env.num_envs
        if len(replay) < max(a.learning_starts, 1):
            continue
        target_steps = int(args.updates_per_step * env_steps)
        learner_steps, version = harness_learn(a, replay, learner, actors, learner_steps, target_steps, version)
    for runner in runners:
        runner.close()
    return {
        "mode": "harness",
        "config": args.config,
        "algo": cfg.algo,
        "env": cfg.env.id,
        "actors": n_actors,
        "updates_per_step": args.updates_per_step,
        "threshold": args.threshold,
        "reached": reached,
        "rows": rows,
        "seconds": round(time.perf_counter() - t0, 2),
        # Evaluations of a barely trained net often tie; its weights do not.
        "weights_digest": weights_digest(learner.get_weights()),
    }


# --------------------------------------------------------------------------
# Through `aiorl run`


def env_steps_at(run_dir: Path, learner_steps: int) -> int | None:
    """env_steps of the first metrics row whose learner_steps reached `learner_steps`."""
    for row in common.metrics_rows(run_dir):
        if row.get("learner_steps", 0) >= learner_steps:
            return row.get("env_steps")
    return None


def runtime_sets(cfg_path: str, overrides: list[str], args, run_dir: Path) -> tuple[list[str], int | None]:
    """The `--set`s of the run, and its evaluation grid in env steps (None: each newest checkpoint)."""
    sets = [*overrides, f"run.dir={run_dir}", f"run.checkpoint_every={args.checkpoint_every}"]
    base = load_config(cfg_path, overrides)
    settings = get_settings(base.algo)
    if settings.is_synchronous(base):
        return sets + ["run.checkpoint_every=1", "run.keep_checkpoints=1000000"], args.eval_every_env_steps
    if settings.fragment_queue(base) is not None:
        grid = args.eval_every_env_steps
        per_step = base.agent.batch_size * base.cluster.learners  # env steps trained on per learner step
        return sets + [f"run.checkpoint_every={max(1, grid // (5 * per_step))}", "run.keep_checkpoints=1000000"], grid
    return sets, None


class CheckpointWatch:
    """Evaluates the checkpoints a running `aiorl run` writes: on the env-step grid (the first
    checkpoint at or after each multiple), or else each newest one; keeps the rows and the one
    that met the threshold, and interrupts the run there with --stop-at-threshold."""

    def __init__(self, cfg: Config, args, launch: common.Launch, grid: int | None, t0: float):
        self.cfg, self.args, self.launch, self.grid, self.t0 = cfg, args, launch, grid, t0
        self.evaluator = CheckpointEvaluator(cfg)
        self.seen: set[str] = set()
        self.rows: list[dict] = []
        self.reached: dict | None = None
        self.next_grid = grid

    def fresh(self) -> list[Path]:
        checkpoints = sorted((self.launch.run_dir / "checkpoints").glob("checkpoint-*.pt"))
        return [p for p in checkpoints if p.name not in self.seen]

    def add(self, row: dict, seconds_key: str, running: bool) -> None:
        """Keep and show an evaluation's row; the first at the threshold is the one reached."""
        self.rows.append(row)
        log(
            f"{row['env_steps'] or '-':>10} {row['learner_steps']:>13} {row[seconds_key]:>8.1f} "
            f"{row['eval_mean']:>10.1f} {row['eval_std']:>9.1f}  {row['checkpoint']}"
        )
        if self.args.threshold is not None and row["eval_mean"] >= self.args.threshold and self.reached is None:
            self.reached = row
            if self.args.stop_at_threshold and running:
                self.launch.proc.send_signal(signal.SIGINT)

    def on_grid(self, fresh: list[Path], running: bool) -> bool | None:
        """Evaluate the first fresh checkpoint on the grid: True to stop watching, False to look
        again at once, None when there was none."""
        picked = None
        for path in fresh:
            self.seen.add(path.name)
            try:
                counters = self.evaluator.load(path)
            except (OSError, EOFError, RuntimeError, CheckpointError):
                continue  # pruned under us
            if int(counters.get("env_steps_trained", 0)) >= self.next_grid:
                picked = path
                break
        if picked is None:
            return None
        seconds = time.perf_counter() - self.t0
        result = self.evaluator.evaluate(self.args.eval_episodes)
        env_steps = int(counters["env_steps_trained"])
        self.next_grid = (env_steps // self.grid + 1) * self.grid
        row = {
            "checkpoint": picked.name,
            "learner_steps": int(counters.get("learner_steps", 0)),
            "env_steps": env_steps,
            "seconds": round(seconds, 2),
            "eval_done_s": round(time.perf_counter() - self.t0, 2),
            "eval_mean": result["mean"],
            "eval_std": result["std"],
        }
        self.add(row, "eval_done_s", running)
        if self.reached is not None and self.args.stop_at_threshold:
            # The rest of the grid is not wanted. Wait here for the clean end that SIGINT
            # began: a second SIGINT would kill every role.
            self.launch.proc.wait(timeout=self.cfg.cluster.phase_timeout_s * 4)
            return True
        return False

    def newest(self, fresh: list[Path], running: bool) -> None:
        """Evaluate the newest fresh checkpoint; older unseen ones are skipped (evaluation lags)."""
        path = fresh[-1]
        self.seen.update(p.name for p in fresh)
        seconds = time.perf_counter() - self.t0
        try:
            counters, result = self.evaluator(path, self.args.eval_episodes)
        except (OSError, EOFError, RuntimeError, CheckpointError):
            return  # pruned under us: take the next one
        # Checkpoints count learner 0's steps; the run's counter sums every learner's.
        learner_steps = int(counters.get("learner_steps", 0)) * self.cfg.cluster.learners
        row = {
            "checkpoint": path.name,
            "learner_steps": learner_steps,
            "env_steps": env_steps_at(self.launch.run_dir, learner_steps),
            "seconds": round(seconds, 2),
            "eval_mean": result["mean"],
            "eval_std": result["std"],
        }
        self.add(row, "seconds", running)

    def watch(self) -> None:
        """Until the run ends (or has met the threshold on the grid, with --stop-at-threshold)."""
        while True:
            running = self.launch.running()
            fresh = self.fresh()
            if self.grid is not None:
                done = self.on_grid(fresh, running)
                if done:
                    return
                if done is False:
                    continue
                if not running:
                    return
                time.sleep(0.1)
                continue
            if fresh:
                self.newest(fresh, running)
                continue
            if not running:
                return
            if time.perf_counter() - self.t0 > self.args.budget_s:
                log(f"budget of {self.args.budget_s} s spent: interrupting the run")
                self.launch.proc.send_signal(signal.SIGINT)
                self.launch.proc.wait(timeout=self.cfg.cluster.phase_timeout_s * 4)
            time.sleep(1.0)


def final_eval(run_dir: Path, episodes: int, keys: tuple[str, ...]) -> dict | None:
    """`aiorl eval RUN` (the policy it picks) over `episodes` episodes: `keys` of its JSON, or None."""
    out = subprocess.run(
        [sys.executable, "-m", "aiorl", "eval", str(run_dir), "--episodes", str(episodes), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        log(f"aiorl eval failed: {out.stderr.strip()}")
        return None
    final = json.loads(out.stdout)
    return {k: final[k] for k in keys}


def through_runtime(cfg_path: str, overrides: list[str], args) -> dict:
    run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="aiorl-bench-")) / "run"
    sets, grid = runtime_sets(cfg_path, overrides, args, run_dir)
    cfg = load_config(cfg_path, sets)
    log(f"$ {' '.join(common.aiorl_run_command(cfg_path, sets))}")
    t0 = time.perf_counter()
    launched = time.time()
    # Beside the run directory, not in it: `aiorl run` takes only an empty or new directory.
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    grace_s = cfg.cluster.phase_timeout_s * 4
    with (
        open(run_dir.with_name(run_dir.name + "-aiorl-run.log"), "w") as out,
        common.Launch(cfg_path, run_dir, sets, output=out, grace_s=grace_s) as launch,
    ):
        watch = CheckpointWatch(cfg, args, launch, grid, t0)
        log(f"{'env_steps':>10} {'learner_steps':>13} {'seconds':>8} {'eval_mean':>10} {'eval_std':>9}  checkpoint")
        watch.watch()
    code = launch.proc.returncode
    seconds = time.perf_counter() - t0
    for row in watch.rows:  # metrics rows may have trailed the checkpoint while the run went on
        if row["env_steps"] is None:
            row["env_steps"] = env_steps_at(run_dir, row["learner_steps"])
    summary = launch.summary()
    idle = [
        r["stats"].get("idle_fraction")
        for name, r in summary.get("roles", {}).items()
        if name.startswith("actor") and r.get("stats")
    ]
    idle = [x for x in idle if x is not None]
    phases = summary.get("phases") or [{}]
    running_at = round(phases[0]["time"] - launched, 2) if phases[0].get("phase") == "RUNNING" else None
    final = None
    if (run_dir / "policy" / "policy.pt2").exists():
        final = final_eval(run_dir, args.final_episodes, ("episodes", "mean", "std", "min", "max"))
    return {
        "mode": "run",
        "config": cfg_path,
        "overrides": overrides,
        "run_dir": str(run_dir),
        "exit_code": code,
        "algo": cfg.algo,
        "env": cfg.env.id,
        "actors": cfg.cluster.actors,
        "learners": cfg.cluster.learners,
        "threshold": args.threshold,
        "reached": watch.reached,
        "rows": watch.rows,
        "seconds": round(seconds, 2),
        "running_at_s": running_at,
        "actor_idle_fraction": float(np.mean(idle)) if idle else None,
        "final_env_steps": summary.get("env_steps"),
        "final_learner_steps": summary.get("learner_steps"),
        "stop_reason": summary.get("stop_reason"),
        "final_eval": final,
    }


def time_to_threshold(result: dict) -> tuple[float | None, float | None]:
    """(seconds since launch, seconds since the RUNNING phase) of the evaluation that met the threshold."""
    reached = result.get("reached")
    if not reached:
        return None, None
    done = reached.get("eval_done_s", reached["seconds"])
    running = result.get("running_at_s")
    return done, (round(done - running, 2) if running is not None else None)


def compare(args) -> dict:
    """`run` on every config for every seed; a table per config and the medians."""
    runs = []
    for cfg_path in args.configs:
        for seed in args.seeds:
            log(f"\n=== {cfg_path}, seed {seed}")
            args.run_dir = None
            result = through_runtime(cfg_path, [*args.set, f"run.seed={seed}"], args)
            report(result)
            runs.append({"seed": seed, **result})
    configs = list(args.configs)
    if args.recurrent_ppo and importlib.util.find_spec("sb3_contrib") is None:
        log("skipped the RecurrentPPO comparison: sb3-contrib is not installed (pip install 'aiorl[bench]')")
    elif args.recurrent_ppo:
        for seed in args.seeds:
            log(f"\n=== sb3-contrib RecurrentPPO on {args.configs[0]}'s env, seed {seed}")
            result = recurrent_ppo(args.configs[0], [*args.set, f"run.seed={seed}"], seed, args)
            report(result)
            runs.append({"seed": seed, **result})
        configs.append("sb3-contrib RecurrentPPO")
    log(
        f"\n{'config':<34} {'seed':>4} {'env steps':>10} {'s (launch)':>10} {'s (running)':>11} "
        f"{'final eval':>10} {'actor idle':>10}"
    )
    summary = []
    for cfg_path in configs:
        mine = [r for r in runs if r["config"] == cfg_path]
        for r in mine:
            done, since = time_to_threshold(r)
            steps = r["reached"]["env_steps"] if r["reached"] else None
            final = r["final_eval"]["mean"] if r.get("final_eval") else None
            idle = r.get("actor_idle_fraction")
            log(
                f"{cfg_path:<34} {r['seed']:>4} {steps if steps is not None else '-':>10} "
                f"{done if done is not None else '-':>10} {since if since is not None else '-':>11} "
                f"{'-' if final is None else format(final, '.1f'):>10} "
                f"{'-' if idle is None else format(idle, '.3f'):>10}"
            )
        reached = [time_to_threshold(r) for r in mine if r["reached"]]
        idle = [r["actor_idle_fraction"] for r in mine if r.get("actor_idle_fraction") is not None]
        row = {
            "config": cfg_path,
            "algo": mine[0]["algo"],
            "seeds": len(mine),
            "reached": len(reached),
            "median_s_launch": float(np.median([d for d, _ in reached])) if reached else None,
            "median_s_running": float(np.median([s for _, s in reached if s is not None])) if reached else None,
            "median_env_steps": float(np.median([r["reached"]["env_steps"] for r in mine if r["reached"]]))
            if reached
            else None,
            "median_actor_idle_fraction": float(np.median(idle)) if idle else None,
        }
        summary.append(row)
    for row in summary:
        log(
            f"{row['config']}: threshold {args.threshold} reached in {row['reached']}/{row['seeds']} seeds; median "
            f"{row['median_env_steps']} env steps, {row['median_s_running']} s after RUNNING "
            f"({row['median_s_launch']} s from launch); median actor idle fraction {row['median_actor_idle_fraction']}"
        )
    return {"mode": "compare", "threshold": args.threshold, "runs": runs, "summary": summary}


# --------------------------------------------------------------------------
# The reference for recurrent examples: sb3-contrib's RecurrentPPO on the same env


def recurrent_ppo(cfg_path: str, overrides: list[str], seed: int, args) -> dict:
    """Train sb3-contrib's RecurrentPPO on `cfg_path`'s env (its wrappers too, so CartPole loses its
    velocities as in aiorl) with RL Zoo's CartPoleNoVel-v1 hyper-parameters, evaluating the policy
    trained on each `--eval-every-env-steps` multiple, deterministically, carrying the LSTM state."""
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    from aiorl.envs import make_env

    torch.set_num_threads(1)  # as each aiorl role (model.torch_threads)
    cfg = load_config(cfg_path, overrides)
    grid, budget = args.eval_every_env_steps, cfg.agent.scheduled_timesteps or 100_000
    t0 = time.perf_counter()
    envs = VecNormalize(make_vec_env(lambda: make_env(cfg.env), n_envs=8, seed=seed), gamma=0.98)
    evals = VecNormalize(
        make_vec_env(lambda: make_env(cfg.env, evaluation=True), n_envs=args.eval_episodes, seed=EVAL_SEED),
        training=False,
        norm_reward=False,
    )

    def linear(start: float):
        return lambda progress_remaining: progress_remaining * start

    model = RecurrentPPO(
        "MlpLstmPolicy",
        envs,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
    )
    rows: list[dict] = []
    state = {"reached": None, "eval_s": 0.0, "next": grid}
    log(f"{'env_steps':>10} {'seconds':>8} {'eval_mean':>10} {'eval_std':>9}  (sb3-contrib RecurrentPPO, seed {seed})")

    class GridEvaluation(BaseCallback):
        # At a rollout's start the policy has trained on exactly num_timesteps env steps.
        def _on_rollout_start(self) -> None:
            if self.num_timesteps < state["next"]:
                return
            e0 = time.perf_counter()
            evals.obs_rms = envs.obs_rms
            mean, std = evaluate_policy(model, evals, n_eval_episodes=args.eval_episodes, deterministic=True)
            done = time.perf_counter()
            row = {
                "env_steps": int(self.num_timesteps),
                "learner_steps": None,
                "seconds": round(e0 - t0 - state["eval_s"], 2),
                "eval_done_s": round(done - t0 - state["eval_s"], 2),
                "eval_mean": float(mean),
                "eval_std": float(std),
            }
            state["eval_s"] += done - e0
            state["next"] = (self.num_timesteps // grid + 1) * grid
            rows.append(row)
            log(f"{row['env_steps']:>10} {row['eval_done_s']:>8.1f} {mean:>10.1f} {std:>9.1f}")
            if args.threshold is not None and mean >= args.threshold and state["reached"] is None:
                state["reached"] = row

        def _on_step(self) -> bool:
            if time.perf_counter() - t0 - state["eval_s"] > args.budget_s:
                return False  # as `run` interrupts a run past --budget-s
            return not (args.stop_at_threshold and state["reached"] is not None)

    running = time.perf_counter() - t0
    model.learn(total_timesteps=budget, callback=GridEvaluation())
    return {
        "mode": "recurrent_ppo",
        "config": "sb3-contrib RecurrentPPO",
        "algo": "RecurrentPPO",
        "env": cfg.env.id,
        "threshold": args.threshold,
        "reached": state["reached"],
        "rows": rows,
        "seconds": round(time.perf_counter() - t0 - state["eval_s"], 2),
        "running_at_s": round(running, 2),
        "actor_idle_fraction": None,
        "final_env_steps": int(model.num_timesteps),
        "final_eval": None,
    }


# --------------------------------------------------------------------------


def report(result: dict) -> None:
    reached = result["reached"]
    if result["threshold"] is not None:
        if reached:
            done = f", evaluation done at {reached['eval_done_s']} s" if "eval_done_s" in reached else ""
            since = (
                f" ({reached['eval_done_s'] - result['running_at_s']:.2f} s after the run's RUNNING phase began "
                f"at {result['running_at_s']} s)"
                if "eval_done_s" in reached and result.get("running_at_s")
                else ""
            )
            log(
                f"threshold {result['threshold']} reached after {reached['env_steps']} env steps, "
                f"{reached['learner_steps']} learner steps, {reached['seconds']} s{done}{since}"
            )
        else:
            log(f"threshold {result['threshold']} NOT reached in {result['seconds']} s")
    if result.get("actor_idle_fraction") is not None:
        log(
            f"actor idle fraction (waiting over wall time, as the actors measured it): "
            f"{result['actor_idle_fraction']:.3f}"
        )
    if result.get("final_eval"):
        f = result["final_eval"]
        log(
            f"final policy (aiorl eval, {f['episodes']} episodes): mean {f['mean']:.1f} std {f['std']:.1f} "
            f"min {f['min']:.1f} max {f['max']:.1f}; run: {result['final_env_steps']} env steps, "
            f"{result['final_learner_steps']} learner steps, {result['seconds']} s, exit code {result['exit_code']}"
            f" ({result['stop_reason']})"
        )


class BusyNeighbour:
    """One busy-loop process beside the runs (`--load`): another CPU-heavy job on the machine."""

    def __init__(self, core: int = 0):
        self.core = core
        self.proc: subprocess.Popen | None = None

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            import os

            os.sched_setaffinity(self.proc.pid, {self.core})
        except (AttributeError, OSError):
            pass  # no affinity here: the OS places it
        log(f"busy neighbour: pid {self.proc.pid} (one busy loop, core {self.core})")
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def _children_cpu_s() -> float:
    """CPU seconds of every descendant waited for so far: `aiorl run` waits for its roles, learner 0
    for its evaluation process, so a run's difference is the CPU of all its processes."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(cfg_path: str, sets: list[str], final_episodes: int, timeout_s: float) -> dict:
    """`aiorl run` to its own end, then `aiorl eval` (the policy it picks) and the run's evaluations."""
    run_dir = Path(tempfile.mkdtemp(prefix="aiorl-bench-")) / "run"
    t0 = time.perf_counter()
    cpu0 = _children_cpu_s()
    with (
        open(run_dir.with_name("aiorl-run.log"), "w") as out,
        common.Launch(cfg_path, run_dir, sets, output=out) as launch,
    ):
        try:
            code = launch.proc.wait(timeout=timeout_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
            code = launch.end()  # SIGINT: the normal shutdown phases
            if isinstance(exc, KeyboardInterrupt):
                raise
    seconds = time.perf_counter() - t0
    cpu_s = _children_cpu_s() - cpu0
    summary = launch.summary()
    phases = summary.get("phases") or []
    running = [p for p in phases if p.get("phase") == "RUNNING"]
    stopping = [p for p in phases if p.get("phase") == "STOPPING"]
    running_s = (stopping[0]["time"] - running[0]["time"]) if running and stopping else None
    return {
        "run_dir": str(run_dir),
        "exit_code": code,
        "seconds": round(seconds, 2),
        "summary": summary,
        "rows": common.metrics_rows(run_dir),
        "running_s": running_s,
        "cpu_s": round(cpu_s, 2),
        "final_eval": final_eval(run_dir, final_episodes, ("which", "episodes", "mean", "std", "min", "max")),
    }


def first_eval_at(rows: list[dict], threshold: float) -> dict | None:
    """The first metrics row whose evaluation during training reached `threshold`."""
    for row in rows:
        if isinstance(row.get("eval/return_mean"), (int, float)) and row["eval/return_mean"] >= threshold:
            return row
    return None


def running_time_s(rows: list[dict]) -> float | None:
    """time_s of the first RUNNING row: the run's clock when training began."""
    for row in rows:
        if row.get("phase") == "RUNNING":
            return row["time_s"]
    return None


def table(args) -> dict:
    """`--seeds N` fresh runs of one config (with `--load`, beside a busy neighbour) and their final evaluations."""
    if args.threshold is None:
        raise SystemExit("table needs --threshold (the return the final evaluation must reach)")
    load = BusyNeighbour() if args.load else None

    def interrupted(*_):  # SIGTERM as Ctrl-C: the run in flight ends cleanly, the busy neighbour is killed
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    runs = []
    log(
        f"{'seed':>4} {'exit':>4} {'final eval':>10} {'min ep.':>8} {'policy':>6} {'to thr. (s)':>11} "
        f"{'learner steps':>13} {'env steps':>10} {'run (s)':>8}  stop"
    )
    try:
        if load is not None:
            load.__enter__()
        for seed in range(args.seed_base, args.seed_base + args.seeds):
            try:
                r = run_once(args.config, [*args.set, f"run.seed={seed}"], args.final_episodes, args.budget_s)
            except KeyboardInterrupt:
                log(f"interrupted during seed {seed}: the table below has the {len(runs)} runs that finished")
                break
            hit = first_eval_at(r["rows"], args.threshold)
            start = running_time_s(r["rows"])
            r["to_threshold_s"] = round(hit["time_s"] - start, 2) if hit and start is not None else None
            r["seed"] = seed
            f = r["final_eval"]
            s = r["summary"]
            log(
                f"{seed:>4} {r['exit_code']:>4} {'-' if f is None else format(f['mean'], '.1f'):>10} "
                f"{'-' if f is None else format(f['min'], '.1f'):>8} {'-' if f is None else f['which']:>6} "
                f"{'-' if r['to_threshold_s'] is None else r['to_threshold_s']:>11} "
                f"{s.get('learner_steps', '-'):>13} {s.get('env_steps', '-'):>10} {r['seconds']:>8.1f}  "
                f"{s.get('stop_detail')}"
            )
            runs.append({k: v for k, v in r.items() if k != "rows"})
    finally:
        if load is not None:
            load.__exit__()
    if not runs:
        raise SystemExit("no run finished")
    finals = [r["final_eval"]["mean"] if r["final_eval"] else float("-inf") for r in runs]
    solved = sum(f >= args.threshold for f in finals)
    times = [r["to_threshold_s"] for r in runs if r["to_threshold_s"] is not None]
    summary = {
        "config": args.config,
        "load": args.load,
        "seeds": len(runs),
        "threshold": args.threshold,
        "solved": solved,
        "median_final": float(np.median(finals)),
        "worst_final": float(min(finals)),
        "reached_in_training": len(times),
        "median_to_threshold_s": float(np.median(times)) if times else None,
        "worst_to_threshold_s": float(max(times)) if times else None,
        "median_run_s": float(np.median([r["seconds"] for r in runs])),
    }
    log(
        f"{args.config}{' with a busy neighbour' if args.load else ''}: {solved}/{len(runs)} runs reach "
        f"{args.threshold} in aiorl eval ({args.final_episodes} episodes); final evaluation median "
        f"{summary['median_final']:.1f}, worst {summary['worst_final']:.1f}; time to threshold in training "
        f"(first evaluation at or above it, since RUNNING) median {summary['median_to_threshold_s']} s, worst "
        f"{summary['worst_to_threshold_s']} s ({len(times)}/{len(runs)} reached it); median run "
        f"{summary['median_run_s']:.1f} s"
    )
    return {"mode": "table", "summary": summary, "runs": runs}


def evaluation_lags(rows: list[dict], summary: dict) -> dict:
    """A run's evaluations during training: each one's lag (eval/lag_s, from the metrics rows), how
    many were scored and skipped (summary.json)."""
    evaluation = summary.get("evaluation") or {}
    return {
        "lags": [r["eval/lag_s"] for r in rows if isinstance(r.get("eval/lag_s"), (int, float))],
        "evaluations": evaluation.get("count"),
        "skipped": evaluation.get("skipped"),
    }


def lag_stats(lags: list[float]) -> dict:
    if not lags:
        return {"n": 0, "p50": None, "p90": None, "max": None}
    return {
        "n": len(lags),
        "p50": round(float(np.percentile(lags, 50)), 3),
        "p90": round(float(np.percentile(lags, 90)), 3),
        "max": round(float(max(lags)), 3),
    }


def _loaded(args):
    """The busy neighbour of `--load` (a context), or none."""
    import contextlib

    return BusyNeighbour() if args.load else contextlib.nullcontext()


def eval_lag(args) -> dict:
    """`--runs` runs of each config to their own stop; their evaluations' lags, skips and stops."""
    results = []
    with _loaded(args):
        for config in args.configs:
            runs = []
            for k in range(args.runs):
                r = run_once(config, [*args.set, f"run.seed={args.seed_base + k}"], 1, args.budget_s)
                s = r["summary"]
                lags = evaluation_lags(r["rows"], s)
                run = {
                    **lags,
                    "seed": args.seed_base + k,
                    "exit_code": r["exit_code"],
                    "stop": s.get("stop_detail"),
                    "on_target": "target_return" in (s.get("stop_detail") or ""),
                    "running_s": r["running_s"],
                    "first_lag_s": lags["lags"][0] if lags["lags"] else None,
                }
                runs.append(run)
                log(
                    f"{config} seed {run['seed']}: {run['evaluations']} evaluations, skipped {run['skipped']}, "
                    f"lag {lag_stats(lags['lags'])}, first {run['first_lag_s']} s; {run['running_s']} s RUNNING; "
                    f"stop: {run['stop']}"
                )
            stats = lag_stats([lag for run in runs for lag in run["lags"]])
            results.append(
                {
                    "config": config,
                    "load": args.load,
                    "runs": runs,
                    "lag_s": stats,
                    "skipped": sum(run["skipped"] or 0 for run in runs),
                    "evaluations": sum(run["evaluations"] or 0 for run in runs),
                }
            )
    log(
        f"{'config':<36} {'load':>4} {'evals':>5} {'skipped':>7} {'lag p50':>8} {'p90':>6} {'max':>6}  "
        "(s; from due to result in)"
    )
    for r in results:
        st = r["lag_s"]
        log(
            f"{Path(r['config']).name:<36} {'yes' if r['load'] else 'no':>4} {r['evaluations']:>5} {r['skipped']:>7} "
            f"{st['p50']!s:>8} {st['p90']!s:>6} {st['max']!s:>6}"
        )
    return {"mode": "eval-lag", "load": args.load, "results": results}


def eval_cost(args) -> dict:
    """Learner and env steps/s of the config with its evaluation and without, alternating."""
    with _loaded(args):
        return _eval_cost(args)


def _eval_cost(args) -> dict:
    off = ["run.eval_every=null", "run.eval_interval_s=null"]
    both = [*args.set, "agent.target_return=null"]
    rates = {"with eval": [], "without": []}
    lags = []
    for pair in range(args.pairs):
        for name, sets in (("with eval", both), ("without", [*both, *off])):
            r = run_once(args.config, sets, 1, args.budget_s)
            if name == "with eval":
                lags += evaluation_lags(r["rows"], r["summary"])["lags"]
            s, t = r["summary"], r["running_s"]
            last = (s.get("evaluation") or {}).get("last") or {}
            row = {
                "learner_steps_per_s": s["learner_steps"] / t if t else None,
                "env_steps_per_s": s["env_steps"] / t if t else None,
                "running_s": t,
                "evaluations": ((s.get("evaluation") or {}).get("count")),
                "cpu_s": r["cpu_s"],
                "eval_cpu_s": last.get("worker_cpu_s"),
            }
            rates[name].append(row)
            share = f", evaluation process {row['eval_cpu_s']:.1f} s" if row["eval_cpu_s"] is not None else ""
            log(
                f"pair {pair + 1}/{args.pairs} {name:>9}: {row['learner_steps_per_s']:.1f} learner steps/s, "
                f"{row['env_steps_per_s']:.1f} env steps/s over {t:.1f} s RUNNING, evaluations {row['evaluations']}, "
                f"CPU of all processes {row['cpu_s']:.1f} s{share}"
            )
    result = {}
    for key in ("learner_steps_per_s", "env_steps_per_s"):
        on = float(np.median([r[key] for r in rates["with eval"]]))
        ref = float(np.median([r[key] for r in rates["without"]]))
        # Pairs ran back to back: the ratio within each pair cancels the machine's slow drifts.
        pairs = [a[key] / b[key] for a, b in zip(rates["with eval"], rates["without"])]
        result[key] = {
            "with_eval": round(on, 2),
            "without": round(ref, 2),
            "ratio": round(on / ref, 3),
            "pair_ratios": [round(x, 3) for x in pairs],
            "median_pair_ratio": round(float(np.median(pairs)), 3),
        }
    log(
        f"{'':<22} {'with eval':>10} {'without':>10} {'ratio':>6} {'pairs':>6}   (medians of {args.pairs} "
        "alternated pairs; pairs: the median of the ratios within each pair)"
    )
    for key, v in result.items():
        log(
            f"{key:<22} {v['with_eval']:>10.1f} {v['without']:>10.1f} {v['ratio']:>6.3f} {v['median_pair_ratio']:>6.3f}"
        )
    shares = [r["eval_cpu_s"] / r["cpu_s"] for r in rates["with eval"] if r["eval_cpu_s"] is not None and r["cpu_s"]]
    if shares:
        result["eval_cpu_share"] = {"median": round(float(np.median(shares)), 4), "runs": [round(x, 4) for x in shares]}
        log(
            f"the evaluation process's share of the run's CPU: median {np.median(shares):.1%} "
            f"(runs {', '.join(f'{x:.1%}' for x in shares)})"
        )
    result["lag_s"] = lag_stats(lags)
    log(f"the evaluations' lag (s, from due to result in) over the runs with evaluation: {result['lag_s']}")
    return {"mode": "eval-cost", "config": args.config, "load": args.load, "medians": result, "runs": rates}


def versus(args) -> int:
    """``run --versus``: reference and variant runs, alternating; median seconds (and env steps) to the threshold."""
    if args.threshold is None or args.run_dir:
        raise SystemExit("--versus needs --threshold (and no --run-dir: each run gets its own)")
    runs = {"reference": [], "variant": []}
    for pair in range(args.pairs):
        for name, sets in (("reference", args.set), ("variant", [*args.set, *args.versus])):
            log(f"--- pair {pair + 1}/{args.pairs}: {name} {' '.join(sets)}")
            result = through_runtime(args.config, sets, args)
            report(result)
            runs[name].append(result)

    def median(name, key):
        """Median over the runs that reached the threshold (a run that did not counts as never)."""
        values = [r["reached"][key] for r in runs[name] if r["reached"] and r["reached"][key] is not None]
        return float(np.median(values)) if values else None

    reached = {name: sum(bool(r["reached"]) for r in rs) for name, rs in runs.items()}
    lines = {}
    for key in ("seconds", "env_steps", "learner_steps"):
        ref, var = median("reference", key), median("variant", key)
        lines[key] = {"reference": ref, "variant": var, "ratio": None if not (ref and var) else round(var / ref, 3)}
    log(
        f"time to threshold {args.threshold}, medians of the runs that reached it (reference {reached['reference']}"
        f"/{args.pairs}, variant {reached['variant']}/{args.pairs}): "
        + "; ".join(f"{k} {v['reference']} -> {v['variant']} ({v['ratio']}x)" for k, v in lines.items())
    )
    if args.json:
        common.write_json(args.json, {"versus": args.versus, "medians": lines, "reached": reached, "runs": runs})
    return 0 if all(r["reached"] for rs in runs.values() for r in rs) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode in ("run", "harness", "compare"):
        p = sub.add_parser(mode)
        if mode == "compare":
            p.add_argument("configs", nargs="+")
            p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
            p.add_argument(
                "--recurrent-ppo",
                action="store_true",
                help="also sb3-contrib's RecurrentPPO on the first config's env (RL Zoo's CartPoleNoVel settings)",
            )
        else:
            p.add_argument("config")
        p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
        p.add_argument("--threshold", type=float, default=None, help="evaluation mean return to reach")
        p.add_argument("--eval-episodes", type=int, default=10, help="episodes per evaluation")
        p.add_argument("--stop-at-threshold", action="store_true", help="stop as soon as the threshold is met")
        p.add_argument("--json", help="write the results here")
    h = sub.choices["harness"]
    h.add_argument("--max-env-steps", type=int, default=100_000)
    h.add_argument("--max-seconds", type=float, default=1800.0)
    h.add_argument("--eval-every", type=int, default=5000, help="env steps between evaluations")
    h.add_argument("--updates-per-step", type=float, default=0.25, help="learner steps per env step")
    for mode in ("run", "compare"):
        r = sub.choices[mode]
        r.add_argument("--checkpoint-every", type=int, default=1000, help="learner steps between checkpoints")
        r.add_argument(
            "--eval-every-env-steps",
            type=int,
            default=5000,
            help="evaluation grid of synchronous algorithms and IMPALA, in env steps trained on",
        )
        r.add_argument("--budget-s", type=float, default=1800.0, help="interrupt the run after this many seconds")
        r.add_argument("--final-episodes", type=int, default=20, help="episodes of the final `aiorl eval`")
        r.add_argument("--run-dir", help="run directory (default: a fresh temporary one)")
    for mode in ("table", "eval-cost"):
        t = sub.add_parser(mode)
        t.add_argument("config")
        t.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
        t.add_argument("--budget-s", type=float, default=1800.0, help="interrupt a run after this many seconds")
        t.add_argument("--json", help="write the results here")
    t = sub.choices["table"]
    t.add_argument("--seeds", type=int, default=20, help="fresh runs, run.seed SEED_BASE .. SEED_BASE + N - 1")
    t.add_argument("--seed-base", type=int, default=0)
    t.add_argument("--load", action="store_true", help="a busy-loop process on one core beside every run")
    t.add_argument("--threshold", type=float, default=None, help="final aiorl eval mean return to reach")
    t.add_argument("--final-episodes", type=int, default=20, help="episodes of the final `aiorl eval`")
    sub.choices["eval-cost"].add_argument("--pairs", type=int, default=3, help="alternating (with, without) pairs")
    sub.choices["eval-cost"].add_argument("--load", action="store_true", help="a busy-loop process beside the runs")
    lag = sub.add_parser("eval-lag")
    lag.add_argument("configs", nargs="+")
    lag.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    lag.add_argument("--runs", type=int, default=1, help="runs of each config (run.seed SEED_BASE, SEED_BASE + 1, ...)")
    lag.add_argument("--seed-base", type=int, default=0)
    lag.add_argument("--load", action="store_true", help="a busy-loop process on one core beside every run")
    lag.add_argument("--budget-s", type=float, default=1800.0, help="interrupt a run after this many seconds")
    lag.add_argument("--json", help="write the results here")
    r = sub.choices["run"]
    r.add_argument(
        "--versus",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="also run with these overrides and compare times to threshold; repeatable",
    )
    r.add_argument("--pairs", type=int, default=1, help="with --versus: alternating (reference, variant) pairs")
    args = parser.parse_args(argv)
    if args.mode == "eval-lag":
        result = eval_lag(args)
        if args.json:
            common.write_json(args.json, result)
        return 0
    if args.mode in ("table", "eval-cost"):
        result = table(args) if args.mode == "table" else eval_cost(args)
        if args.json:
            common.write_json(args.json, result)
        return 0 if args.mode == "eval-cost" or result["summary"]["solved"] == result["summary"]["seeds"] else 1
    if args.mode == "compare":
        result = compare(args)
        if args.json:
            common.write_json(args.json, result)
        return 0 if all(row["reached"] == row["seeds"] for row in result["summary"]) else 1
    if args.mode == "harness":
        result = harness(load_config(args.config, args.set), args)
    elif args.versus:
        return versus(args)
    else:
        result = through_runtime(args.config, args.set, args)
    report(result)
    if args.json:
        common.write_json(args.json, result)
    ok = result["threshold"] is None or result["reached"] is not None
    if result.get("final_eval") and result["threshold"] is not None:
        ok = ok and result["final_eval"]["mean"] >= result["threshold"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
