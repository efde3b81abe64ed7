"""Mutants of aiorl's optimizers (`aiorl.algos.lib.optimizers`): each breaks a step, the state a
checkpoint carries, or the rule that no learner imports torch._dynamo before it has trained."""

O = "tests/algos/test_optimizers.py::"
SAME = O + "test_each_step_equals_torch_optims_bit_for_bit"
BOTH_WAYS = O + "test_state_dicts_load_both_ways_between_aiorl_and_torch_optim"
FOREACH = O + "test_adam_without_the_fused_kernel_steps_as_torchs_multi_tensor_adam"
REFUSED = O + "test_a_state_for_other_parameters_is_refused_naming_the_mismatch"
IMPORTS = "tests/runtime/test_learner_imports.py::test_a_learner_trains_before_anything_imports_torch_dynamo"
SPAWNER = "tests/runtime/test_spawner.py::test_the_spawner_forks_the_roles_without_importing_torch_dynamo"
PATH = "aiorl/algos/lib/optimizers.py"

MUTANTS = [
    dict(
        name="the-step-count-not-counted",
        path=PATH,
        old='            torch._foreach_add_(state["step"], 1)\n',
        new="",
        tests=[SAME],
    ),
    dict(
        name="a-step-size-changed-in-param-groups-is-not-seen",
        path=PATH,
        old="        return self.param_groups[0]\n",
        new='        return self.__dict__.setdefault("frozen", dict(self.param_groups[0]))\n',
        tests=[SAME],
    ),
    dict(
        name="adam-steps-parameters-without-a-gradient",
        path=PATH,
        old="        params = [p for p in self.params if p.grad is not None]\n",
        new="        for p in self.params:\n            p.grad = torch.zeros_like(p) if p.grad is None else p.grad\n        params = self.params\n",
        tests=[SAME],
    ),
    dict(
        name="adam-foreach-without-bias-correction-of-the-second-moment",
        path=PATH,
        old="        torch._foreach_div_(denom, root_corrections)\n",
        new="",
        tests=[FOREACH],
    ),
    dict(
        name="the-fused-kernel-given-several-dtypes",
        path=PATH,
        old="        self.fused = same and all(",
        new="        self.fused = all(",
        tests=[O + "test_parameters_of_several_dtypes_step_as_torchs_do_without_the_fused_kernel"],
    ),
    dict(
        name="rmsprop-momentum-ignored",
        path=PATH,
        old='        if g["momentum"] > 0:\n',
        new="        if False:\n",
        tests=[SAME],
    ),
    dict(
        name="rmsprop-eps-inside-the-root",
        path=PATH,
        old='        avg = torch._foreach_sqrt(square_avgs)\n        torch._foreach_add_(avg, g["eps"])\n',
        new='        avg = torch._foreach_sqrt(torch._foreach_add(square_avgs, g["eps"]))\n',
        tests=[SAME],
    ),
    dict(
        name="a-loaded-state-is-not-kept",
        path=PATH,
        old="            self.state[p] = state\n\n    @torch.no_grad()",
        new="\n    @torch.no_grad()",
        tests=[BOTH_WAYS],
    ),
    dict(
        name="a-loaded-state-keeps-this-optimizers-step-size",
        path=PATH,
        old='        self.param_groups[0] = {**self.group, **hyper, "params": self.params}\n',
        new='        self.param_groups[0] = {**hyper, **self.group, "params": self.params}\n',
        tests=[BOTH_WAYS],
    ),
    dict(
        name="a-state-of-the-wrong-shape-is-taken",
        path=PATH,
        old="                    if value.shape != p.shape:\n",
        new="                    if False:\n",
        tests=[REFUSED],
    ),
    dict(
        name="impala-rmsprop-from-torch-optim",
        path="aiorl/algos/impala.py",
        old="            self.optimizer = RMSprop(\n",
        new="            self.optimizer = torch.optim.RMSprop(\n",
        tests=[IMPORTS + "[impala_cartpole-8000-model1]"],
    ),
    dict(
        name="dppo-adam-from-torch-optim",
        path="aiorl/algos/dppo.py",
        old="        self.optimizer = Adam(self.params, lr=m.learning_rate, eps=m.adam_eps)\n",
        new="        self.optimizer = torch.optim.Adam(self.params, lr=m.learning_rate, eps=m.adam_eps)\n",
        tests=[IMPORTS + "[dppo_cartpole-4096-model0]"],
    ),
    dict(
        name="the-spawner-imports-torch-dynamo-before-it-forks",
        path="aiorl/cli/spawner.py",
        old="def warm(algo: str, deterministic: bool = False) -> None:\n    get_algorithm(algo)\n",
        new="def warm(algo: str, deterministic: bool = False) -> None:\n    get_algorithm(algo)\n    import torch._dynamo\n",
        tests=[SPAWNER + "[dppo]"],
    ),
]
