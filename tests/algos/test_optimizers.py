"""aiorl's Adam and RMSprop (`aiorl.algos.lib.optimizers`) against torch.optim's, step for step: the
same parameters bit for bit, and state dicts that each side loads from the other."""

from __future__ import annotations

import io

import pytest
import torch

from aiorl.algos.lib.optimizers import Adam, RMSprop

SHAPES = [(4, 3), (3,), (2, 2)]


def parameters(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in SHAPES]


def twin(params) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def step_both(pairs, steps: int, seed: int = 1, idle: int | None = None, lr_from: tuple[int, float] | None = None):
    """Give each (optimizer, params) pair the same gradients and step them. `idle`: a parameter
    with no gradient for the first half; `lr_from` (step, lr): the step size changed there, as
    the learners' annealing does (param_groups[0]["lr"])."""
    g = torch.Generator().manual_seed(seed)
    for t in range(steps):
        grads = [torch.randn(shape, generator=g) for shape in SHAPES]
        if idle is not None and t < steps // 2:
            grads[idle] = None
        if lr_from is not None and t == lr_from[0]:
            for optimizer, _ in pairs:
                optimizer.param_groups[0]["lr"] = lr_from[1]
        for optimizer, params in pairs:
            for p, grad in zip(params, grads):
                p.grad = None if grad is None else grad.clone()
            optimizer.step()


def assert_same(params_a, params_b):
    for a, b in zip(params_a, params_b):
        assert torch.equal(a, b), (a - b).abs().max()


CASES = {
    "adam fused": (
        lambda p: Adam(p, lr=3e-3, eps=1e-5),
        lambda p: torch.optim.Adam(p, lr=3e-3, eps=1e-5, fused=True),
    ),
    "adam betas": (
        lambda p: Adam(p, lr=1e-2, eps=1e-8, betas=(0.5, 0.9)),
        lambda p: torch.optim.Adam(p, lr=1e-2, eps=1e-8, betas=(0.5, 0.9), fused=True),
    ),
    "rmsprop": (
        lambda p: RMSprop(p, lr=5e-3, alpha=0.99, eps=0.01),
        lambda p: torch.optim.RMSprop(p, lr=5e-3, alpha=0.99, eps=0.01),
    ),
    "rmsprop momentum": (
        lambda p: RMSprop(p, lr=5e-3, alpha=0.9, eps=1e-5, momentum=0.9),
        lambda p: torch.optim.RMSprop(p, lr=5e-3, alpha=0.9, eps=1e-5, momentum=0.9),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_each_step_equals_torch_optims_bit_for_bit(case):
    ours_of, theirs_of = CASES[case]
    a = parameters()
    b = twin(a)
    ours, theirs = ours_of(a), theirs_of(b)
    # A parameter without a gradient is left alone (no state, no step counted), and the step size
    # changes halfway, as the learners' annealing changes it.
    step_both([(ours, a), (theirs, b)], steps=12, idle=1, lr_from=(7, 1e-3))
    assert_same(a, b)
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert ours_state["param_groups"] == theirs_state["param_groups"]
    assert ours_state["state"].keys() == theirs_state["state"].keys()
    for i, entry in theirs_state["state"].items():
        assert ours_state["state"][i].keys() == entry.keys()
        for key, value in entry.items():
            assert torch.equal(ours_state["state"][i][key], value), (case, i, key)


def test_adam_without_the_fused_kernel_steps_as_torchs_multi_tensor_adam():
    a = parameters()
    b = twin(a)
    ours = Adam(a, lr=3e-3, eps=1e-5)
    ours.fused = False  # as on a device the fused kernel does not take
    theirs = torch.optim.Adam(b, lr=3e-3, eps=1e-5, foreach=True)
    step_both([(ours, a), (theirs, b)], steps=12, idle=2, lr_from=(5, 1e-3))
    assert_same(a, b)


def saved(state: dict) -> dict:
    """Through a checkpoint file's round trip, loaded as aiorl loads checkpoints (weights only)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("case", CASES)
def test_state_dicts_load_both_ways_between_aiorl_and_torch_optim(case):
    # Checkpoints written by torch.optim's optimizers (aiorl before this module) restore ours, and
    # ours restore torch.optim's: each pair then goes on stepping alike.
    ours_of, theirs_of = CASES[case]
    start = parameters()
    old = twin(start)
    torch_first = theirs_of(old)
    # Its step size annealed before the save: the loaded state's, not the constructor's, goes on.
    step_both([(torch_first, old)], steps=5, lr_from=(2, 7e-4))

    resumed, reference = twin(old), twin(old)
    ours = ours_of(resumed)
    ours.load_state_dict(saved(torch_first.state_dict()))
    step_both([(ours, resumed), (torch_first, old)], steps=5, seed=2)
    assert_same(resumed, old)

    back = twin(resumed)
    theirs = theirs_of(back)
    theirs.load_state_dict(saved(ours.state_dict()))
    step_both([(theirs, back), (ours, resumed)], steps=5, seed=3)
    assert_same(back, resumed)
    assert not torch.equal(reference[0], resumed[0])  # the steps did move the parameters


def test_parameters_of_several_dtypes_step_as_torchs_do_without_the_fused_kernel():
    # The fused kernel takes one dtype a call: aiorl's Adam takes torch's multi-tensor arithmetic.
    a = [torch.nn.Parameter(torch.randn(4, dtype=torch.float64)), torch.nn.Parameter(torch.randn(3))]
    b = twin(a)
    ours, theirs = Adam(a, lr=1e-2), torch.optim.Adam(b, lr=1e-2, foreach=True)
    assert not ours.fused
    for _ in range(5):
        for p, q in zip(a, b):
            p.grad = torch.ones_like(p)
            q.grad = torch.ones_like(q)
        ours.step()
        theirs.step()
    assert_same(a, b)


def test_a_state_for_other_parameters_is_refused_naming_the_mismatch():
    ours = Adam(parameters(), lr=1e-3)
    other = torch.optim.Adam(parameters()[:2], lr=1e-3)
    with pytest.raises(ValueError, match=r"param groups sized \[2\] for one group of 3"):
        ours.load_state_dict(other.state_dict())

    wrong = twin(parameters())
    wrong[0] = torch.nn.Parameter(torch.zeros(5))
    theirs = torch.optim.Adam(wrong, lr=1e-3)
    for p in wrong:
        p.grad = torch.ones_like(p)
    theirs.step()
    with pytest.raises(ValueError, match=r"'exp_avg' has shape \(5,\), its parameter \(4, 3\)"):
        ours.load_state_dict(theirs.state_dict())


def test_an_optimizer_over_no_parameters_is_refused():
    with pytest.raises(ValueError, match="no parameters"):
        RMSprop([], lr=1e-3)
