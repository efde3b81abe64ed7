"""Built-in algorithm for testing the runtime on its own.

Actors take uniformly random actions; the learner keeps a running mean of the
observations it is fed (a cheap, deterministic update) and publishes it as its
"weights". Priorities are ``|r| + 0.5``. In asynchronous mode transitions go
through the compiled n-step adjustment; with ``model.synchronous: true`` each
actor sends one raw rollout per iteration and waits for the next weights, like
distributed PPO does.
"""

from __future__ import annotations

import time

import numpy as np

from aiorl.algos.random_agent_config import RandomAgentSettings
from aiorl.replay import NStep
from aiorl.runtime.algorithm import ActorPolicy, Algorithm, LearnerCore, LearnerResult


class RandomPolicy(ActorPolicy):
    def __init__(self, algo: RandomAgent, seed: int):
        self.algo = algo
        self.rng = np.random.default_rng(seed)
        self.weights: dict[str, np.ndarray] = {}
        model = algo.cfg.model
        self.nstep = None if algo.is_synchronous(algo.cfg) else NStep(model.n_step, model.gamma)

    def act(self, obs: np.ndarray) -> np.ndarray:
        space = self.algo.env_spec.action_space
        if hasattr(space, "n"):
            return self.rng.integers(0, space.n, size=len(obs), dtype=np.int64)
        low, high = space.low, space.high
        return self.rng.uniform(low, high, size=(len(obs),) + space.shape).astype(space.dtype)

    def postprocess(self, rollout):
        if self.nstep is None:
            flat = {k: v.reshape((-1,) + v.shape[2:]) for k, v in rollout.items()}
            return flat, None
        batch = self.nstep.add(
            rollout["obs"],
            rollout["action"],
            rollout["reward"],
            rollout["next_obs"],
            rollout["terminated"],
            rollout["truncated"],
        )
        return batch, None

    def flush(self):
        if self.nstep is None:
            return {}, None
        return self.nstep.flush(), None

    def set_weights(self, weights, version):
        self.weights = weights
        self.weights_version = version


class MeanLearner(LearnerCore):
    def __init__(self, algo: RandomAgent):
        obs_shape = algo.env_spec.observation_space.shape
        self.mean_obs = np.zeros(int(np.prod(obs_shape)), np.float64)
        self.steps = 0
        self.lr = algo.cfg.model.learning_rate
        self.sleep_s = algo.cfg.model.learner_step_sleep_s

    def step(self, batch):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        obs = batch["obs"].reshape(len(batch["obs"]), -1).astype(np.float64)
        delta = obs.mean(axis=0) - self.mean_obs
        self.mean_obs += self.lr * delta
        self.steps += 1
        priorities = np.abs(batch["reward"]).astype(np.float64) + 0.5
        return LearnerResult({"loss": float(np.abs(delta).mean()), "rows": float(len(obs))}, priorities)

    def get_weights(self):
        return {"mean_obs": self.mean_obs.copy(), "steps": np.array([self.steps], np.int64)}

    def state_dict(self):
        import torch

        return {"algo": "random_agent", "mean_obs": torch.from_numpy(self.mean_obs.copy()), "steps": self.steps}

    def load_state_dict(self, state):
        if state.get("algo") != "random_agent":
            raise ValueError(f"a {state.get('algo')!r} checkpoint cannot restore a random_agent learner")
        mean_obs = state["mean_obs"].numpy()
        if mean_obs.shape != self.mean_obs.shape:
            raise ValueError(f"checkpoint mean_obs has shape {mean_obs.shape}, this env needs {self.mean_obs.shape}")
        self.mean_obs[:] = mean_obs
        self.steps = int(state["steps"])


class RandomAgent(RandomAgentSettings, Algorithm):
    def transition_spec(self):
        obs_space, act_space = self.env_spec.observation_space, self.env_spec.action_space
        obs = (tuple(obs_space.shape), np.dtype(obs_space.dtype).str)
        action = (tuple(act_space.shape), "<i8" if hasattr(act_space, "n") else np.dtype(act_space.dtype).str)
        if self.is_synchronous(self.cfg):
            return {
                "obs": obs,
                "action": action,
                "reward": ((), "<f4"),
                "next_obs": obs,
                "terminated": ((), "|b1"),
                "truncated": ((), "|b1"),
            }
        return {
            "obs": obs,
            "action": action,
            "reward": ((), "<f4"),
            "next_obs": obs,
            "done": ((), "|b1"),
            "discount": ((), "<f4"),
        }

    def max_batch_rows(self):
        rows = self.cfg.agent.sample_batch_size * self.cfg.env.num_envs
        if self.is_synchronous(self.cfg):
            return rows
        return rows + (self.cfg.model.n_step - 1) * self.cfg.env.num_envs  # open n-step windows

    def weights_spec(self):
        obs_shape = self.env_spec.observation_space.shape
        return {"mean_obs": ((int(np.prod(obs_shape)),), "<f8"), "steps": ((1,), "<i8")}

    def make_actor(self, actor_index, num_actors, seed):
        return RandomPolicy(self, seed)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return MeanLearner(self)


ALGORITHM = RandomAgent
