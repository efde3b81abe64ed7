"""Adam and RMSprop for the learners, without torch.optim.

Why not torch.optim: building an optimizer there imports torch._dynamo (0.6-0.9 s of CPU on a
small machine), and so does every ``step()`` (`torch.optim.optimizer._use_grad_for_differentiable`).
A learner forked from a warm spawner would pay it on the way to its first step, or the spawner
before it forks any role, on the way to RUNNING. These two run the same arithmetic on the same
kernels torch.optim runs on the learners' devices, and nothing else:

- `Adam` calls ``torch._fused_adam_``, the kernel of ``torch.optim.Adam(fused=True)`` (the one
  aiorl used: a third of the time per step of the loop on small CPU models), after the same
  ``step += 1`` on the same float32 step tensors; where that kernel does not take the
  parameters (an unusual device, a non-float dtype) the `foreach` ops of torch's multi-tensor
  Adam.
- `RMSprop` runs torch's RMSprop (not centered, no weight decay) with ``torch._foreach_*`` ops.

Both read and write torch.optim's ``state_dict`` format (the same param_groups keys and per
parameter state), so checkpoints written before this module load, and theirs load into torch.optim.
What they leave out (weight decay, AMSGrad, maximize, centered RMSprop, several param groups) no
aiorl learner uses; `tests/algos/test_optimizers.py` holds them to torch.optim's results bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")  # torch.optim.Adam(fused=True) takes these


class _Optimizer:
    """One param group over `params`; the state per parameter in torch.optim's layout."""

    def __init__(self, params, group: dict):
        self.params: list[nn.Parameter] = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__} got no parameters to optimize")
        self.param_groups = [{**group, "params": self.params}]
        self.state: dict[nn.Parameter, dict[str, torch.Tensor]] = {}
        self._lists = None  # `_with_grads`'s lists of state

    @property
    def group(self) -> dict:
        return self.param_groups[0]

    def _states(self) -> list[dict[str, torch.Tensor]]:
        """Each parameter's state, made (zeros, step 0) at its first step as torch.optim does."""
        states = []
        for p in self.params:
            state = self.state.get(p)
            if state is None:
                state = {"step": torch.zeros((), dtype=torch.float32, device=self._step_device(p))}
                for key in self.state_keys():
                    state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
                self.state[p] = state
            states.append(state)
        return states

    def state_keys(self) -> tuple[str, ...]:
        raise NotImplementedError

    def _step_device(self, p: torch.Tensor) -> torch.device:
        return torch.device("cpu")

    def state_dict(self) -> dict:
        group = {k: v for k, v in self.group.items() if k != "params"}
        group["params"] = list(range(len(self.params)))
        state = {i: dict(self.state[p]) for i, p in enumerate(self.params) if p in self.state}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            sizes = [len(g["params"]) for g in groups]
            raise ValueError(
                f"{type(self).__name__}: a state of param groups sized {sizes} for one group of {len(self.params)}"
            )
        saved = groups[0]
        hyper = {k: v for k, v in saved.items() if k != "params"}
        self.param_groups[0] = {**self.group, **hyper, "params": self.params}
        self.state, self._lists = {}, None
        for i, p in zip(saved["params"], self.params):
            entry = state_dict["state"].get(i)
            if entry is None:
                continue
            state = {}
            for key, value in entry.items():
                if key == "step":
                    state[key] = torch.as_tensor(value, dtype=torch.float32).to(self._step_device(p)).clone()
                else:
                    if value.shape != p.shape:
                        raise ValueError(
                            f"{type(self).__name__} state {key!r} has shape {tuple(value.shape)}, "
                            f"its parameter {tuple(p.shape)}"
                        )
                    state[key] = value.to(device=p.device, dtype=p.dtype).clone()
            self.state[p] = state

    @torch.no_grad()
    def step(self) -> None:
        """One step of every parameter that has a gradient; its step count first, as torch.optim's."""
        params, grads, state = self._with_grads()
        if params:
            torch._foreach_add_(state["step"], 1)
            self._update(params, grads, state, self.group)

    def _update(self, params: list, grads: list, state: dict[str, list[torch.Tensor]], g: dict) -> None:
        raise NotImplementedError

    def _with_grads(self) -> tuple[list, list, dict[str, list[torch.Tensor]]]:
        """The parameters that have a gradient, their gradients, and their state by key, each a
        list in the same order (the lists of state are kept while the same parameters step)."""
        params = [p for p in self.params if p.grad is not None]
        key = tuple(map(id, params))
        if self._lists is None or self._lists[0] != key:
            by_param = dict(zip(self.params, self._states()))
            states = [by_param[p] for p in params]
            self._lists = (key, {name: [s[name] for s in states] for name in ("step", *self.state_keys())})
        return params, [p.grad for p in params], self._lists[1]


class Adam(_Optimizer):
    """Adam (Kingma & Ba) with bias correction; torch.optim.Adam(fused=True)'s step."""

    def __init__(self, params, lr: float, eps: float = 1e-8, betas: tuple[float, float] = (0.9, 0.999)):
        params = list(params)
        # One call of the kernel takes one device and one dtype (torch.optim groups them first).
        same = len({(p.device, p.dtype) for p in params}) == 1
        self.fused = same and all(p.device.type in FUSED_DEVICES and torch.is_floating_point(p) for p in params)
        group = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": 0,
            "amsgrad": False,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": self.fused,
            "decoupled_weight_decay": False,
        }
        super().__init__(params, group)

    def state_keys(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _step_device(self, p: torch.Tensor) -> torch.device:
        return p.device if self.fused else torch.device("cpu")  # where torch.optim keeps it

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.group["fused"] = self.fused  # this process's choice, whatever the writer's was

    def _update(self, params: list, grads: list, state: dict[str, list[torch.Tensor]], g: dict) -> None:
        beta1, beta2 = g["betas"]
        steps, exp_avgs, exp_avg_sqs = state["step"], state["exp_avg"], state["exp_avg_sq"]
        if self.fused:
            torch._fused_adam_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                amsgrad=False,
                lr=g["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=0.0,
                eps=g["eps"],
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )
            return
        # torch's multi-tensor Adam (not capturable): the moments, then the bias-corrected step.
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        counts = [float(s) for s in steps]
        step_sizes = [-(g["lr"] / (1 - beta1**n)) for n in counts]
        root_corrections = [(1 - beta2**n) ** 0.5 for n in counts]
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, root_corrections)
        torch._foreach_add_(denom, g["eps"])
        torch._foreach_addcdiv_(params, exp_avgs, denom, step_sizes)


class RMSprop(_Optimizer):
    """RMSprop (Tieleman & Hinton), not centered: square_avg <- alpha * square_avg + (1 - alpha) * g^2,
    then p -= lr * g / (sqrt(square_avg) + eps), through a momentum buffer when momentum > 0."""

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 1e-8, momentum: float = 0.0):
        group = {
            "lr": lr,
            "momentum": momentum,
            "alpha": alpha,
            "eps": eps,
            "centered": False,
            "weight_decay": 0,
            "capturable": False,
            "foreach": None,
            "maximize": False,
            "differentiable": False,
        }
        super().__init__(params, group)

    def state_keys(self) -> tuple[str, ...]:
        return ("square_avg", "momentum_buffer") if self.group["momentum"] > 0 else ("square_avg",)

    def _update(self, params: list, grads: list, state: dict[str, list[torch.Tensor]], g: dict) -> None:
        square_avgs = state["square_avg"]
        torch._foreach_mul_(square_avgs, g["alpha"])
        torch._foreach_addcmul_(square_avgs, grads, grads, value=1 - g["alpha"])
        avg = torch._foreach_sqrt(square_avgs)
        torch._foreach_add_(avg, g["eps"])
        if g["momentum"] > 0:
            buffers = state["momentum_buffer"]
            torch._foreach_mul_(buffers, g["momentum"])
            torch._foreach_addcdiv_(buffers, grads, avg)
            torch._foreach_add_(params, buffers, alpha=-g["lr"])
        else:
            torch._foreach_addcdiv_(params, grads, avg, value=-g["lr"])
