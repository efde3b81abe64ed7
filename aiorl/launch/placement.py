"""Where a Ray launch puts each role: resources per role kind, and how kinds are spread.

Pure config logic (no Ray import), so that `aiorl run` refuses a bad
``cluster.resources`` before anything starts, and so that the plan is tested
without a cluster:

- each role is one Ray actor (`aiorl.launch.ray_launcher.RoleHost`) holding that
  role kind's resources for as long as the role process runs: Ray's own
  accounting then keeps a node from taking more roles than it has room for,
  and ``num_gpus`` makes Ray set ``CUDA_VISIBLE_DEVICES``, which the role
  process inherits;
- memory hosts are one placement group with the SPREAD strategy (one node
  each while there are nodes enough; SPREAD, not STRICT_SPREAD, so that a
  one-node cluster still runs), learners one with PACK (data-parallel
  learners on as few hosts as their resources allow), actors are scheduled
  one by one with the SPREAD scheduling strategy.
"""

from __future__ import annotations

from aiorl.config import ConfigError

LAUNCHERS = ("local", "ray")
KINDS = ("memory", "learner", "actor")
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources")
DEFAULT = {"num_cpus": 1}
GROUP_STRATEGY = {"memory": "SPREAD", "learner": "PACK"}  # actors: no group, SPREAD scheduling
MISSING_RAY = "cluster.launcher is 'ray' but Ray is not installed: pip install 'aiorl[ray]'"


def check_launcher(c) -> None:
    """Refuse a ``cluster.launcher`` or ``cluster.resources`` that could never be placed."""
    if c.launcher not in LAUNCHERS:
        raise ConfigError(f"cluster.launcher: expected 'local' or 'ray', got {c.launcher!r}")
    for kind, spec in c.resources.items():
        path = f"cluster.resources.{kind}"
        if kind not in KINDS:
            raise ConfigError(f"{path}: unknown role kind {kind!r}; expected memory, learner or actor")
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}: expected a mapping such as {{num_cpus: 1}}, got {spec!r}")
        for key, value in spec.items():
            if key not in RESOURCE_KEYS:
                raise ConfigError(f"{path}.{key}: unknown key; expected one of {', '.join(RESOURCE_KEYS)}")
            if key == "resources":
                if not isinstance(value, dict):
                    raise ConfigError(
                        f"{path}.resources: expected a mapping of custom resource -> amount, got {value!r}"
                    )
                for name, amount in value.items():
                    _check_amount(f"{path}.resources.{name}", amount)
            else:
                _check_amount(f"{path}.{key}", value)
        if kind in GROUP_STRATEGY and not role_resources(c, kind):
            raise ConfigError(
                f"{path}: a {kind} needs some resource to be placed in its placement group "
                f"(e.g. num_cpus: 1), got {spec!r}"
            )


def _check_amount(path: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{path}: expected a number >= 0, got {value!r}")


def role_resources(c, kind: str) -> dict:
    """The Ray resources of one role of `kind`, as a placement-group bundle (``CPU``, ``GPU``, custom)."""
    spec = c.resources.get(kind, DEFAULT)
    bundle = {"CPU": float(spec.get("num_cpus", 0)), "GPU": float(spec.get("num_gpus", 0))}
    if spec.get("memory"):
        bundle["memory"] = float(spec["memory"])
    bundle.update({name: float(amount) for name, amount in (spec.get("resources") or {}).items()})
    return {key: value for key, value in bundle.items() if value > 0}


def actor_options(c, kind: str) -> dict:
    """The same resources as options of a Ray actor (``num_cpus`` is always given: Ray's default for an
    actor's lifetime is 0 CPUs, which would let a node take any number of roles)."""
    spec = c.resources.get(kind, DEFAULT)
    options = {"num_cpus": float(spec.get("num_cpus", 0)), "num_gpus": float(spec.get("num_gpus", 0))}
    if spec.get("memory"):
        options["memory"] = float(spec["memory"])
    if spec.get("resources"):
        options["resources"] = {name: float(amount) for name, amount in spec["resources"].items()}
    return options
