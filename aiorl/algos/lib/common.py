"""Plumbing shared by the Ape-X algorithms: tensors from wire arrays, devices,
data-parallel gradient averaging, target updates, checkpoints and export (their config
checks: `aiorl.algos.lib.checks`)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from aiorl.algos.lib.optimizers import Adam, RMSprop
from aiorl.config import ConfigError
from aiorl.io.export import save_policy
from aiorl.replay import NStep
from aiorl.runtime.algorithm import ActorPolicy, LearnerCore, PeerNotFinite
from aiorl.runtime.rendezvous import init_process_group

# --------------------------------------------------------------------------
# Tensors and devices


def setup_torch(threads: int, seed: int, deterministic: bool = False) -> None:
    """Role processes share 2 cores: keep torch to `threads` intra-op threads. `deterministic`
    (``run.deterministic``): only algorithms that give the same result every time."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def resolve_device(name: str, learner_index: int = 0) -> torch.device:
    """``auto``: a GPU when present. Plain ``cuda`` spreads learners over the GPUs."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"model.device: {name!r} asked for, but torch sees no CUDA device")
        if name == "cuda":
            name = f"cuda:{learner_index % torch.cuda.device_count()}"
    return torch.device(name)


def as_tensor(array: np.ndarray, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor from a wire array; arrays received from sockets may be read-only views."""
    array = np.asarray(array)
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, order="C")
    tensor = torch.from_numpy(array)
    return tensor.to(device=device, dtype=dtype, non_blocking=False)


def state_to_numpy(module: nn.Module, prefix: str) -> dict[str, np.ndarray]:
    """Named raw arrays (what weights travel as), copied off the device."""
    return {f"{prefix}.{k}": v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def weights_spec_of(weights: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{name: (shape, dtype)}`` of a weights dict: what `Algorithm.weights_spec` returns."""
    return {k: (tuple(v.shape), v.dtype.str) for k, v in weights.items()}


def shapes_only(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` on torch's meta device: the module's shapes, dtypes and shape errors, with no
    weight allocated or initialized. Every process that builds the algorithm needs those (the
    coordinator's weights spec, the config's checks); an orthogonal init runs a QR per layer,
    and a memory host paid 0.4 s of its start for networks it never ran."""
    with torch.device("meta"):
        return build()


def weights_spec_of_module(module: nn.Module, prefix: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """`weights_spec_of` the module's `state_to_numpy`, read off its tensors' shapes and dtypes
    (a module from `shapes_only` has no values to copy)."""
    return {
        f"{prefix}.{k}": (tuple(v.shape), np.dtype(str(v.dtype).removeprefix("torch.")).str)
        for k, v in module.state_dict().items()
    }


def nstep_batch_rows(cfg, n_step: int) -> int:
    """Most rows one n-step batch holds: a rollout's windows plus the n - 1 per env held back before it."""
    return (cfg.agent.sample_batch_size + n_step - 1) * cfg.env.num_envs


def load_numpy_state(module: nn.Module, weights: dict[str, np.ndarray], prefix: str) -> None:
    """Copy `prefix.*` arrays into `module` (every key must be there, shapes must match)."""
    start = prefix + "."
    state = {k[len(start) :]: torch.from_numpy(np.array(v)) for k, v in weights.items() if k.startswith(start)}
    module.load_state_dict(state, strict=True)


def hard_update(target: nn.Module, online: nn.Module) -> None:
    target.load_state_dict(online.state_dict())


@torch.no_grad()
def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- tau * online + (1 - tau) * target (Polyak averaging)."""
    # One fused call over all parameters: a learner does this every step, and per-tensor calls
    # cost more than the arithmetic on small models.
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)
    for t, o in zip(target.buffers(), online.buffers()):
        t.copy_(o)


def td_loss(td: torch.Tensor, weights: torch.Tensor, kind: str, delta: float) -> torch.Tensor:
    """Importance-weighted mean of Huber (delta) or squared TD errors: ``mean_i w_i * l(td_i)``."""
    if kind == "huber":
        per_row = nn.functional.huber_loss(td, torch.zeros_like(td), reduction="none", delta=delta)
    else:
        per_row = 0.5 * td.pow(2)
    return (weights * per_row).mean()


def raise_not_finite(loss: torch.Tensor, name: str) -> None:
    if torch.isnan(loss):
        raise FloatingPointError(f"{name} is NaN")
    raise FloatingPointError(f"{name} is infinite ({float(loss.detach())})")


# --------------------------------------------------------------------------
# Acting side


class NStepPolicy(ActorPolicy):
    """An actor policy whose replay rows are n-step transitions with initial priorities.

    Subclasses give `act`, `set_weights` and `priorities(batch)`, the
    Ape-X initial priority |TD| of each row computed with the actor's own
    copy of the network.
    """

    def __init__(self, n_step: int, gamma: float):
        self.nstep = NStep(n_step, gamma)

    def priorities(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def _with_priorities(self, batch):
        if not batch or len(batch["reward"]) == 0:
            return {}, None
        return batch, self.priorities(self.decode_observations(batch))

    def postprocess(self, rollout):
        batch = self.nstep.add(
            rollout["obs"],
            rollout["action"],
            rollout["reward"],
            rollout["next_obs"],
            rollout["terminated"],
            rollout["truncated"],
        )
        return self._with_priorities(batch)

    def flush(self):
        return self._with_priorities(self.nstep.flush())


# --------------------------------------------------------------------------
# Data-parallel learners


class DataParallel:
    """Gradient averaging over `world` learners with one collective per step.

    Every step all-reduces one flat float32 buffer: every parameter's
    gradient, then a "have a batch" flag and a "loss is finite" flag. A
    learner whose data ended calls `finish`, which joins that same
    all-reduce with zeros and flag 0: every peer then sees fewer batches than
    learners, applies nothing and stops (``LearnerResult.stop``), so no
    learner is left waiting in a collective. A non-finite loss on any learner
    makes every learner raise at the same step, for the same reason.
    """

    def __init__(
        self,
        params: list[nn.Parameter],
        rank: int,
        world: int,
        rendezvous: str | None,
        device: torch.device,
        timeout_s: float,
        broadcast: list[nn.Module],
    ):
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.world = rank, world
        self.stopped = False
        self.device = device
        self.backend = None
        if world <= 1:
            return
        if not rendezvous:
            raise RuntimeError(f"{world} data-parallel learners need a rendezvous address")
        use_nccl = device.type == "cuda" and torch.cuda.device_count() >= world and dist.is_nccl_available()
        self.backend = "nccl" if use_nccl else "gloo"
        init_process_group(self.backend, rendezvous, rank, world, timeout_s)
        # Every learner starts from learner 0's weights.
        for module in broadcast:
            for tensor in [*module.parameters(), *module.buffers()]:
                self._collective(tensor, dist.broadcast, src=0)

    def _collective(self, tensor: torch.Tensor, collective, **kwargs) -> None:
        """Run `collective` in place on `tensor` (through host memory for gloo on a GPU)."""
        if self.backend == "gloo" and tensor.device.type != "cpu":
            host = tensor.detach().cpu()
            collective(host, **kwargs)
            with torch.no_grad():
                tensor.copy_(host)
        else:
            collective(tensor.data if isinstance(tensor, nn.Parameter) else tensor, **kwargs)

    def average(self, have_batch: bool, loss_finite: bool) -> str:
        """All-reduce gradients and flags; ``"ok"`` (gradients now averaged),
        ``"stop"`` (a peer's data ended: apply nothing) or ``"peer_not_finite"``."""
        if self.world <= 1:
            return "ok"
        parts = []
        for p in self.params:
            if have_batch and p.grad is not None:
                parts.append(p.grad.reshape(-1))
            else:
                parts.append(torch.zeros(p.numel(), device=self.device))
        flags = torch.tensor([float(have_batch), float(loss_finite)], device=self.device)
        buffer = torch.cat([*parts, flags])
        self._collective(buffer, dist.all_reduce, op=dist.ReduceOp.SUM)
        have, finite = int(round(float(buffer[-2]))), int(round(float(buffer[-1])))
        if have < self.world:
            self.stopped = True
            return "stop"
        if finite < self.world:
            return "peer_not_finite"
        offset = 0
        for p in self.params:
            n = p.numel()
            grad = buffer[offset : offset + n].view_as(p) / self.world
            if p.grad is None:
                p.grad = grad.clone()
            else:
                p.grad.copy_(grad)
            offset += n
        return "ok"

    def all_sum(self, values: np.ndarray) -> np.ndarray:
        """Element-wise sum over learners of a small float64 vector (the vector itself for one learner).

        Every learner must call it at the same point of its step, as it does `average`.
        """
        values = np.asarray(values, np.float64)
        if self.world <= 1:
            return values
        tensor = torch.from_numpy(values.copy()).to(self.device)
        self._collective(tensor, dist.all_reduce, op=dist.ReduceOp.SUM)
        return tensor.cpu().numpy()

    def finish(self) -> None:
        """This learner's data ended: release peers waiting in the step all-reduce (idempotent)."""
        if self.world > 1 and not self.stopped:
            self.average(have_batch=False, loss_finite=True)
            self.stopped = True

    def close(self) -> None:
        if self.backend is not None and dist.is_initialized():
            dist.destroy_process_group()
            self.backend = None


def check_step(losses: dict[str, torch.Tensor], status: str) -> bool:
    """After `DataParallel.average`: raise on a non-finite loss (here or on a peer);
    True when the step must not be applied because a peer's data ended."""
    for name, loss in losses.items():
        if not torch.isfinite(loss):
            raise_not_finite(loss, name)
    if status == "stop":
        return True
    if status == "peer_not_finite":
        raise PeerNotFinite(f"{' / '.join(losses)} is NaN or infinite on a data-parallel peer learner")
    return False


def clip_grad(params, max_norm: float | None) -> float:
    """Clip by global norm (when set); return the norm before clipping.

    What ``nn.utils.clip_grad_norm_`` does (scale by ``min(1, max_norm / (norm + 1e-6))``) in
    five fused calls over every gradient: its per-call bookkeeping (grouping by device and
    dtype, checks) cost more than the arithmetic on small models, at every learner step."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if max_norm is not None:
        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp_(max=1.0))
    return float(norm)


# --------------------------------------------------------------------------
# Learning side


class ApexLearner(LearnerCore):
    """What both Ape-X learners share: device, data-parallel join, batch
    tensors, the guarded optimizer step, checkpoints.

    Subclasses build their networks and optimizers, then call `join`; they
    name what a checkpoint holds in `checkpoint_items` (checkpoint key ->
    attribute: modules and optimizers).
    """

    checkpoint_items: dict[str, str] = {}

    def __init__(self, algo, learner_index: int, num_learners: int, seed: int):
        self.algo = algo
        self.m = algo.cfg.model
        setup_torch(self.m.torch_threads, seed, algo.cfg.run.deterministic)
        self.device = resolve_device(self.m.device, learner_index)
        self.learner_steps = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} steps={self.learner_steps} device={self.device} world={self.dp.world}>"

    def join(
        self,
        params: list[nn.Parameter],
        modules: list[nn.Module],
        learner_index: int,
        num_learners: int,
        rendezvous: str | None,
    ) -> None:
        """Join the data-parallel group (a no-op for one learner); start from learner 0's weights."""
        c = self.algo.cfg.cluster
        self.dp = DataParallel(
            params,
            learner_index,
            num_learners,
            rendezvous,
            self.device,
            max(c.start_timeout_s, c.phase_timeout_s),
            modules,
        )

    def tensors(self, batch, action_dtype: torch.dtype):
        """obs, next_obs, action, reward, discount and IS weights (1 without prioritized replay)."""
        dev = self.device
        reward = as_tensor(batch["reward"], dev, torch.float32)
        weights = as_tensor(batch["weights"], dev, torch.float32) if "weights" in batch else torch.ones_like(reward)
        return (
            as_tensor(batch["obs"], dev),
            as_tensor(batch["next_obs"], dev),
            as_tensor(batch["action"], dev, action_dtype),
            reward,
            as_tensor(batch["discount"], dev, torch.float32),
            weights,
        )

    def apply(
        self, groups: list[tuple[str, torch.Tensor, list[nn.Parameter], Adam | RMSprop]]
    ) -> dict[str, float] | None:
        """One optimizer step per (name, loss, params, optimizer) group, all
        gradients taken from the current parameters, averaged over learners
        in one all-reduce, then clipped by global norm. Raises on a non-finite
        loss; None when a peer's data ended (nothing applied); else the
        gradient norms by name."""
        finite = all(bool(torch.isfinite(loss)) for _, loss, _, _ in groups)
        for _, _, params, _ in groups:
            for p in params:
                p.grad = None
        if finite:
            for _, loss, params, _ in groups:
                for p, g in zip(params, torch.autograd.grad(loss, params)):
                    p.grad = g
        status = self.dp.average(have_batch=True, loss_finite=finite)
        if check_step({name: loss for name, loss, _, _ in groups}, status):
            return None
        norms = {}
        for name, _, params, optimizer in groups:
            norms[name] = clip_grad(params, self.m.grad_clip_norm)
            optimizer.step()
        self.learner_steps += 1
        return norms

    def finish(self):
        self.dp.finish()

    def close(self):
        self.dp.close()

    def state_dict(self) -> dict:
        state = {
            "algo": self.algo.name,
            "learner_steps": self.learner_steps,
            "torch_rng": torch.get_rng_state(),
            **{key: getattr(self, attr).state_dict() for key, attr in self.checkpoint_items.items()},
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("algo") != self.algo.name:
            raise ValueError(f"a {state.get('algo')!r} checkpoint cannot restore a {self.algo.name!r} learner")
        for key, attr in self.checkpoint_items.items():
            getattr(self, attr).load_state_dict(state[key])
        self.learner_steps = int(state["learner_steps"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and "cuda_rng" in state:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)


class ActorCriticLearner(ApexLearner):
    """What the on-policy learners (DPPO, IMPALA) add: one `ActorCritic` in ``self.net``
    trained by ``self.optimizer`` (subclasses build both), its weights, the step size
    annealed over the env steps trained on, checkpoints that count them, the greedy
    exported policy."""

    # What a subclass builds in its constructor (declared here: this template reads them).
    net: nn.Module  # an aiorl.algos.lib.actor_critic.ActorCritic
    optimizer: Adam
    checkpoint_items = {"net": "net", "optimizer": "optimizer"}
    iterations = 0  # steps taken (one per `step` call)
    env_steps_trained = 0  # rows trained on by every learner, summed
    schedule: int | None = None  # env steps over which the step size anneals to 0 (None: constant)

    def anneal_lr(self) -> None:
        if self.schedule:
            frac = max(0.0, 1.0 - self.env_steps_trained / self.schedule)
            for group in self.optimizer.param_groups:
                group["lr"] = self.m.learning_rate * frac

    def get_weights(self):
        # The state dict's tensors, listed once: walking the module tree for them cost as
        # much as copying them, and learner 0 publishes after every step.
        if getattr(self, "_weights_views", None) is None:
            self._weights_views = [(f"net.{k}", v) for k, v in self.net.state_dict().items()]
        return {name: v.detach().cpu().numpy().copy() for name, v in self._weights_views}

    def state_dict(self):
        return {**super().state_dict(), "iterations": self.iterations, "env_steps_trained": self.env_steps_trained}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.iterations = int(state["iterations"])
        self.env_steps_trained = int(state["env_steps_trained"])

    def acting_policy(self):
        from aiorl.algos.lib.actor_critic import acting_module, policy_meta

        net = copy.deepcopy(self.net).cpu()
        policy = acting_module(net)
        recurrent = None
        if net.recurrent is not None:
            kind, hidden = net.recurrent
            recurrent = {"type": kind, "hidden": hidden, "state_size": policy.state_size}
        return policy, policy_meta(
            self.algo.name,
            self.algo.env_spec,
            self.iterations,
            recurrent=recurrent,
            env_steps_trained=self.env_steps_trained,
            rebuild=self.algo.policy_record(),
        )


# --------------------------------------------------------------------------
# Checkpoints and exported policies


# Every algorithm exports through aiorl.io.export.save_policy; the old name stays for
# code written against it (it no longer writes TorchScript).
export_script = save_policy
