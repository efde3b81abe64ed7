"""Distributed PPO (Schulman et al. 2017) on the coordinator's barrier.

Reads top to bottom: the loss, the acting policy (sampling and GAE), the
learner, the builder; its config (the model section and its checks) is
`aiorl.algos.dppo_config`, which loads without torch.

One iteration k: every live actor steps its ``env.num_envs`` environments
``agent.sample_batch_size`` steps with weights version k, computes GAE(lambda)
with its own copy of the critic and sends the rows; the memories aggregate
one rollout per live actor; the learners train on the aggregate (each on an
even share, gradients averaged through ``torch.distributed``); learner 0
publishes version k+1, which actors wait for. Policy lag is 0 by
construction (the runtime logs it per iteration from the versions the
actors report).

Advantages, for step t of one env stream (the compiled `aiorl.replay.gae`):

    delta_t = r_t + gamma * V(s_{t+1}) * [not terminated_t] - V(s_t)
    A_t     = delta_t + gamma * lambda * A_{t+1} * [episode goes on after t]

A truncated step (time limit) bootstraps from V(final observation); a
terminated one does not. ``value_target = A + V(s_t)``.

Loss on a minibatch (advantages normalized per minibatch when
``normalize_advantages``):

    ratio   = exp(log pi(a|s) - log pi_old(a|s))
    L_clip  = mean(max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)))
    L_value = 0.5 * mean((V(s) - value_target)^2), or with ``value_clip`` c the
              max of that and the error of V_old + clip(V - V_old, -c, c)
    loss    = L_clip + value_coef * L_value - entropy_coef * entropy

``epochs`` passes of shuffled minibatches of about ``agent.batch_size``
rows, each step clipped to a global gradient norm.

Recurrent policies (``model.recurrent``): each actor keeps a state per env, zeroed at every
episode start, and sends its rows env by env (each env's ``sample_batch_size`` steps in a
row) with the state each step was acted from (``state``) and ``restart``: the step starts
an episode or the rollout. The learner cuts its rows into sequences of ``sample_batch_size``,
shuffles whole sequences into minibatches, and unrolls each from its first row's state,
taking the stored state again at every restart (zeros at an episode start, the actor's at
another env's rollout): truncated backpropagation through the rollout. Gaussian policies (Box
actions) step the env with the sample clipped to the bounds and learn from
the log-probability of the unclipped sample.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from aiorl.algos.dppo_config import DPPOConfig, DPPOSettings
from aiorl.algos.lib.actor_critic import (
    ActorCritic,
    EnvStates,
    GaussianHead,
    SDEHead,
    acting_module,
    batch_moments,
    check_action_space,
    obs_norm_size,
)
from aiorl.algos.lib.checks import check_recurrent
from aiorl.algos.lib.common import (
    ActorCriticLearner,
    as_tensor,
    load_numpy_state,
    setup_torch,
    shapes_only,
    weights_spec_of_module,
)
from aiorl.algos.lib.layers import parse_network
from aiorl.algos.lib.networks import check_observation_space, is_image
from aiorl.algos.lib.numpy_forward import compile_numpy, probe_observations
from aiorl.algos.lib.optimizers import Adam
from aiorl.replay import gae
from aiorl.runtime.algorithm import ActorPolicy, Algorithm, LearnerResult

DEFAULT_NETWORK = ["linear:64", "tanh", "linear:64", "tanh"]


# --------------------------------------------------------------------------
# Logic: the loss


def ppo_loss(net: ActorCritic, m: DPPOConfig, obs, action, old_logp, old_value, advantage, value_target, outputs=None):
    """(loss, metrics tensors) of one minibatch; see the module docstring. `outputs`: the
    network's (parameters, values) of the rows, already computed (a recurrent unroll)."""
    params, value = net(obs) if outputs is None else outputs
    logp = net.head.log_prob(params, action)
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    if m.normalize_advantages and len(advantage) > 1:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    policy_loss = torch.max(-advantage * ratio, -advantage * ratio.clamp(1.0 - m.clip_ratio, 1.0 + m.clip_ratio)).mean()
    value_error = (value - value_target).pow(2)
    if m.value_clip is not None:
        clipped = old_value + (value - old_value).clamp(-m.value_clip, m.value_clip)
        value_error = torch.max(value_error, (clipped - value_target).pow(2))
    value_loss = 0.5 * value_error.mean()
    entropy = net.head.entropy(params).mean()
    loss = policy_loss + m.value_coef * value_loss - m.entropy_coef * entropy
    with torch.no_grad():
        metrics = {
            "losses/policy_loss": policy_loss.detach(),
            "losses/value_loss": value_loss.detach(),
            "losses/entropy": entropy.detach(),
            "losses/approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "losses/clip_fraction": ((ratio - 1.0).abs() > m.clip_ratio).float().mean(),
        }
    return loss, metrics


# --------------------------------------------------------------------------
# Acting


class PPOActor(ActorPolicy):
    """Samples actions, remembers (action, log-prob, value) of every step, and
    turns a rollout into rows with advantages and value targets."""

    def __init__(self, algo: DPPO, seed: int):
        m = algo.cfg.model
        setup_torch(m.torch_threads, seed, algo.cfg.run.deterministic)
        self.m = m
        self.net = algo.network().eval()
        # Acting on CPU: a small MLP runs in numpy (torch's per-call cost dominates at a few rows).
        self.fast = compile_numpy(self.net, probe_observations(algo.env_spec.observation_space, seed=seed))
        self.gaussian = isinstance(self.net.head, GaussianHead)
        self.action_shape = algo.env_spec.action_space.shape
        self.rng = np.random.default_rng(seed)
        self.steps: list[tuple[np.ndarray, ...]] = []  # (action, log-prob, value[, state before, after])
        self.recurrent = self.net.recurrent is not None
        self.states = EnvStates(self.net)

    def __repr__(self) -> str:
        return f"<PPOActor weights_version={self.weights_version} steps_held={len(self.steps)}>"

    def begin_episodes(self, started: np.ndarray) -> None:
        self.states.reset(started)

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self.recurrent:
            params, value, features, before = self.states.step(obs)
        elif self.fast is not None:
            params, value, features = self.fast.act(obs)
        else:
            with torch.inference_mode():
                params, value, features = (t.numpy() for t in self.net.act(torch.as_tensor(obs)))
        action, logp = self.net.head.sample(params, self.rng, features)
        if self.recurrent:
            # The state after the step too (before an episode end zeroes it): V(final obs) reads it.
            self.steps.append((action, logp, value, before, self.states.state.copy()))
        else:
            self.steps.append((action, logp, value))
        if self.gaussian:
            return self.net.head.clip_to_bounds(action).reshape((len(obs),) + self.action_shape)
        return action

    @torch.no_grad()
    def postprocess(self, rollout):
        reward = rollout["reward"]
        T, E = reward.shape
        if len(self.steps) != T:
            raise RuntimeError(f"PPOActor: {len(self.steps)} acted steps for a rollout of {T}")
        action = np.stack([s[0] for s in self.steps])
        logp = np.stack([s[1] for s in self.steps])
        value = np.stack([s[2] for s in self.steps])
        terminated, truncated, next_obs = rollout["terminated"], rollout["truncated"], rollout["next_obs"]
        # V of the observation after the rollout, and of every final observation a time limit cut.
        cut = np.argwhere(truncated & ~terminated)
        needed = np.concatenate([next_obs[T - 1], next_obs[cut[:, 0], cut[:, 1]]])
        if self.recurrent:
            before, after = np.stack([s[3] for s in self.steps]), np.stack([s[4] for s in self.steps])
            states = np.concatenate([after[T - 1], after[cut[:, 0], cut[:, 1]]])
            v_next = self.net.value_step(torch.as_tensor(needed), torch.as_tensor(states)).numpy()
        else:
            v_next = self.net.value(torch.as_tensor(needed)).numpy()
        self.steps = []
        truncated_values = np.zeros((T, E), np.float32)
        truncated_values[cut[:, 0], cut[:, 1]] = v_next[E:]
        scaled = reward * np.float32(self.m.reward_scale) if self.m.reward_scale != 1.0 else reward
        advantage, value_target = gae(
            scaled, value, v_next[:E], terminated, truncated, self.m.gamma, self.m.gae_lambda, truncated_values
        )
        n = T * E
        rows = {
            "obs": rollout["obs"],
            "action": action,
            "logp": logp,
            "value": value,
            "advantage": advantage,
            "value_target": value_target,
        }
        if self.recurrent:
            restart = np.ones((T, E), np.bool_)  # the rollout's first step, and every episode start
            restart[1:] = terminated[:-1] | truncated[:-1]
            rows.update(state=before, restart=restart)
            # Env by env: each env's T steps are consecutive rows, a sequence the learner unrolls.
            return {
                k: np.ascontiguousarray(np.swapaxes(v, 0, 1)).reshape((n,) + v.shape[2:]) for k, v in rows.items()
            }, None
        return {k: v.reshape((n,) + v.shape[2:]) for k, v in rows.items()}, None

    def set_weights(self, weights, version):
        load_numpy_state(self.net, weights, "net")
        if self.fast is not None:
            self.fast.refresh()
        self.weights_version = version
        if isinstance(self.net.head, SDEHead):
            self.net.head.reset_noise()  # a new rollout: new exploration matrices, of the new scale


# --------------------------------------------------------------------------
# Learning


class PPOLearner(ActorCriticLearner):
    """Epochs of minibatch SGD per iteration; several learners average every
    minibatch gradient (each trains on its share of the iteration's rows)."""

    def __init__(self, algo: DPPO, learner_index: int, num_learners: int, seed: int, rendezvous: str | None):
        super().__init__(algo, learner_index, num_learners, seed)
        m = self.m
        self.net = algo.network().to(self.device)
        self.params = [p for p in self.net.parameters() if p.requires_grad]
        self.optimizer = Adam(self.params, lr=m.learning_rate, eps=m.adam_eps)
        self.join(self.params, [self.net], learner_index, num_learners, rendezvous)
        self.rng = np.random.default_rng(seed)
        self.minibatch = algo.cfg.agent.batch_size
        self.sequence = algo.cfg.agent.sample_batch_size  # recurrent: rows unrolled together
        self.schedule = algo.cfg.agent.scheduled_timesteps if m.lr_annealing else None

    def step(self, batch):
        if self.dp.stopped:
            return LearnerResult(stop=True)
        m, dev = self.m, self.device
        rows = len(batch["advantage"])
        # One small all-reduce: every learner's rows (so all take the same number of
        # minibatch steps) and the observation moments (so all normalizers agree).
        moments = batch_moments(batch["obs"])[1:] if self.net.normalizer.enabled else ()
        totals = self.dp.all_sum(np.concatenate([[rows], *moments]))
        total_rows = int(totals[0])
        num_minibatches = max(1, total_rows // (self.minibatch * self.dp.world))
        self.anneal_lr()
        obs = as_tensor(batch["obs"], dev)
        action = as_tensor(batch["action"], dev)
        old_logp, old_value = as_tensor(batch["logp"], dev), as_tensor(batch["value"], dev)
        advantage, value_target = as_tensor(batch["advantage"], dev), as_tensor(batch["value_target"], dev)
        sums: dict[str, float] = {}
        steps = 0
        recurrent = self.net.recurrent is not None
        if recurrent:
            # Sequences of `sequence` consecutive rows ([k, L], -1: padding after the last row).
            L = self.sequence
            seqs = np.arange(-(-rows // L) * L).reshape(-1, L)
            seqs[seqs >= rows] = -1
            state = as_tensor(batch["state"], dev)
            restart = as_tensor(batch["restart"], dev)
        units = len(seqs) if recurrent else rows
        for _ in range(m.epochs):
            for mb in np.array_split(self.rng.permutation(units), num_minibatches):
                outputs = None
                if recurrent:
                    rows_mb = seqs[mb]
                    valid = rows_mb >= 0
                    mb = rows_mb[valid]  # the minibatch's rows, in the unroll's order
                    outputs = self.unroll(obs, state, restart, rows_mb, valid)
                idx = torch.as_tensor(mb, device=dev)
                loss, metrics = ppo_loss(
                    self.net,
                    m,
                    obs[idx],
                    action[idx],
                    old_logp[idx],
                    old_value[idx],
                    advantage[idx],
                    value_target[idx],
                    outputs,
                )
                norms = self.apply([("loss", loss, self.params, self.optimizer)])
                if norms is None:
                    return LearnerResult(stop=True)  # a peer's data ended: nothing more applied
                steps += 1
                metrics["losses/grad_norm"] = torch.tensor(norms["loss"])
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
        if self.net.normalizer.enabled:
            d = (len(totals) - 1) // 2
            self.net.normalizer.update(total_rows, totals[1 : 1 + d], totals[1 + d :])
        self.iterations += 1
        self.env_steps_trained += total_rows
        target = value_target.cpu().numpy()
        explained = 1.0 - np.var(target - batch["value"]) / np.var(target) if np.var(target) > 0 else 0.0
        out = {k: float(v) / steps for k, v in sums.items()}
        out.update(
            {
                "values/explained_variance": float(explained),
                "policy/rows": float(total_rows),
                "policy/learning_rate": self.optimizer.param_groups[0]["lr"],
            }
        )
        if isinstance(self.net.head, GaussianHead):
            out["policy/log_std_mean"] = float(self.net.head.log_std.detach().mean())
        return LearnerResult(out)

    def unroll(self, obs, state, restart, rows_mb: np.ndarray, valid: np.ndarray):
        """(parameters, values) of the valid rows of sequences `rows_mb` [k, L], unrolled from each
        sequence's first row's state, the stored state taken again at every restart."""
        idx = torch.as_tensor(np.where(valid, rows_mb, 0), device=self.device)
        stored = state[idx]  # [k, L, state_size]
        params, values, _ = self.net.unroll(obs[idx], stored[:, 0], restart[idx], stored)
        keep = torch.as_tensor(valid.reshape(-1), device=self.device)
        return params[keep], values[keep]

    def state_dict(self):
        return {**super().state_dict(), "minibatch_rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.rng.bit_generator.state = state["minibatch_rng"]


# --------------------------------------------------------------------------
# Builder


class DPPO(DPPOSettings, Algorithm):
    def __init__(self, cfg, env_spec):
        super().__init__(cfg, env_spec)
        m = cfg.model
        check_observation_space(env_spec.observation_space, "env.id")
        check_action_space(env_spec.action_space, self.name)
        self.obs_norm = obs_norm_size(env_spec.observation_space, "model.obs_norm") if m.obs_norm else 0
        default = ["nature_cnn"] if is_image(env_spec.observation_space) else DEFAULT_NETWORK
        self.layers = parse_network(m.network or default, "model.network")
        self.state_size = shapes_only(self.network).state_size  # shape errors surface now

    def network(self) -> ActorCritic:
        m = self.cfg.model
        return ActorCritic(
            self.env_spec.observation_space,
            self.env_spec.action_space,
            self.layers,
            shared=m.shared_torso,
            obs_norm=self.obs_norm,
            obs_norm_clip=m.obs_norm_clip,
            log_std_init=m.log_std_init,
            sde_sample_freq=m.sde_sample_freq if m.sde else None,
            recurrent=check_recurrent(m.recurrent),
        )

    def acting_module(self) -> torch.nn.Module:
        return acting_module(self.network())

    def weights_spec(self):
        return weights_spec_of_module(shapes_only(self.network), "net")

    def transition_spec(self):
        obs_space, action_space = self.env_spec.observation_space, self.env_spec.action_space
        if isinstance(action_space, gym.spaces.Discrete):
            action = ((), "<i8")
        else:
            action = ((int(np.prod(action_space.shape)),), "<f4")
        return {
            "obs": (tuple(obs_space.shape), np.dtype(obs_space.dtype).str),
            "action": action,
            "logp": ((), "<f4"),
            "value": ((), "<f4"),
            "advantage": ((), "<f4"),
            "value_target": ((), "<f4"),
            **self.state_spec(),
        }

    def state_spec(self):
        """Recurrent: the state each row was acted from, and whether it restarts the unroll."""
        if self.cfg.model.recurrent is None:
            return {}
        return {"state": ((self.state_size,), "<f4"), "restart": ((), "|b1")}

    def make_actor(self, actor_index, num_actors, seed):
        return PPOActor(self, seed)

    def make_learner(self, learner_index, num_learners, seed, rendezvous=None):
        return PPOLearner(self, learner_index, num_learners, seed, rendezvous)


ALGORITHM = DPPO
