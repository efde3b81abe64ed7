"""aiorl's optimizers (`aiorl.algos.lib.optimizers`) beside torch.optim's, on the examples' networks:
the time of one ``step()`` and, in a fresh process each, what building one and taking a first step
cost (torch.optim imports torch._dynamo there), each as a ratio to torch.optim's measured in the
same run.

    python bench/optimizers.py [--steps 20000] [--repeats 5] [--json out.json]

Rows: Adam (torch.optim.Adam(fused=True), the kernel aiorl's Adam calls) and RMSprop (torch's,
not centered) over the CartPole MLPs (64x64 tanh) and a 512-wide one, one thread, gradients
already in place: the optimizer's own step and nothing else. Medians of --repeats. The first
step's row runs ``python -c`` per measurement (import torch first, then time the optimizer's
construction and first step). Figures of a shared machine are indicative only.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import common
import torch
from torch import nn

from aiorl.algos.lib.optimizers import Adam, RMSprop

NETWORKS = {"cartpole 64x64": (4, 64, 2), "512x512": (64, 512, 8)}
OPTIMIZERS = {
    "adam": (lambda p: Adam(p, lr=1e-5, eps=1e-5), lambda p: torch.optim.Adam(p, lr=1e-5, eps=1e-5, fused=True)),
    "rmsprop": (
        lambda p: RMSprop(p, lr=1e-5, alpha=0.99, eps=0.01),
        lambda p: torch.optim.RMSprop(p, lr=1e-5, alpha=0.99, eps=0.01),
    ),
}
FIRST_STEP = """
import time, torch
p = [torch.nn.Parameter(torch.zeros(64, 64))]
p[0].grad = torch.ones(64, 64)
t = time.perf_counter()
{make}
opt.step()
print(time.perf_counter() - t)
"""
FIRST_MAKERS = {
    "adam": (
        "from aiorl.algos.lib.optimizers import Adam; opt = Adam(p, lr=1e-3)",
        "opt = torch.optim.Adam(p, lr=1e-3, fused=True)",
    ),
    "rmsprop": (
        "from aiorl.algos.lib.optimizers import RMSprop; opt = RMSprop(p, lr=1e-3)",
        "opt = torch.optim.RMSprop(p, lr=1e-3)",
    ),
}


def mlp(inputs: int, width: int, outputs: int) -> list[nn.Parameter]:
    layers = [nn.Linear(inputs, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, outputs)]
    net = nn.Sequential(*layers)
    params = list(net.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def step_us(optimizer, steps: int) -> float:
    for _ in range(steps // 100):
        optimizer.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - t0) / steps * 1e6


def first_step_s(make: str) -> float:
    command = [sys.executable, "-c", FIRST_STEP.format(make=make)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def row(name: str, unit: str, ours: list[float], theirs: list[float]) -> dict:
    aiorl, torch_optim = statistics.median(ours), statistics.median(theirs)
    return {"row": name, "unit": unit, "aiorl": aiorl, "torch": torch_optim, "ratio": aiorl / torch_optim}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name, (ours_of, theirs_of) in OPTIMIZERS.items():
        for network, shape in NETWORKS.items():
            ours, theirs = [], []
            for _ in range(args.repeats):  # alternated, so that drift hits both alike
                ours.append(step_us(ours_of(mlp(*shape)), args.steps))
                theirs.append(step_us(theirs_of(mlp(*shape)), args.steps))
            rows.append(row(f"{name} step, {network}", "us", ours, theirs))
        ours_make, theirs_make = FIRST_MAKERS[name]
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(first_step_s(ours_make))
            theirs.append(first_step_s(theirs_make))
        rows.append(row(f"{name} built + first step", "s", ours, theirs))
    print(f"optimizers: medians of {args.repeats}; ratio = aiorl / torch.optim (below 1: aiorl's is faster)")
    print(f"{'row':<32} {'aiorl':>12} {'torch.optim':>12} {'ratio':>7}")
    for r in rows:
        fmt = "{:>9.1f} us" if r["unit"] == "us" else "{:>10.3f} s"
        print(f"{r['row']:<32} {fmt.format(r['aiorl'])} {fmt.format(r['torch'])} {r['ratio']:>7.2f}")
    if args.json:
        common.write_json(args.json, {"repeats": args.repeats, "steps": args.steps, "rows": rows}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
