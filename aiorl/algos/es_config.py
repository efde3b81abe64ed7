"""Evolution strategies' config side (`aiorl.algos.es` is the algorithm): its model section and
the checks of it. No torch: loading a config imports this module only."""

from __future__ import annotations

from dataclasses import dataclass

from aiorl.algos.lib.layers import NUMPY_ACTIVATIONS, parse_network
from aiorl.config import ConfigError, doc
from aiorl.runtime.algorithm import AlgorithmSettings

DEFAULT_NETWORK = ["linear:64", "tanh", "linear:64", "tanh"]
# es actors run their network in numpy (`aiorl.algos.es.NumpyPolicy`): a network with another
# layer than NUMPY_ACTIVATIONS and linear ones is refused when the config loads.


@dataclass
class ESConfig:
    network: list | None = doc(
        "Policy torso: linear:N and relu/tanh/elu/silu layers (actors run them in "
        "numpy); [] is a linear policy; null: two tanh layers of 64.",
        default=None,
    )
    population: int = doc(
        "Antithetic pairs of perturbations per iteration (work items; 2x as many "
        "episodes), whatever the number of actors.",
        default=32,
    )
    sigma: float = doc("Standard deviation of the parameter perturbations.", default=0.05)
    learning_rate: float = doc("Adam step size.", default=0.01)
    weight_decay: float = doc("L2 coefficient added to the descent direction.", default=0.005)
    adam_eps: float = doc("Adam epsilon.", default=1e-8)
    noise_table_size: int = doc(
        "float32 entries of the shared noise table (at least the parameter count).", default=1 << 23
    )
    noise_seed: int = doc("Seed of the noise table; every process generates the same table from it.", default=42)
    obs_norm: bool = doc(
        "Normalize vector observations by running mean/std, merged from the moments "
        "every actor sends with its results.",
        default=False,
    )
    obs_norm_clip: float = doc("Clip normalized observations to +-this.", default=5.0)
    obs_norm_std_floor: float = doc(
        "Smallest std a feature is normalized by (OpenAI's ES: 0.1): a near-constant feature is not "
        "scaled into the clip.",
        default=0.1,
    )
    episode_step_cap: int = doc(
        "Most steps of one episode of a work item, where the env has not ended it (an env without "
        "a time limit would hold its work item for ever).",
        default=10_000,
    )
    torch_threads: int = doc("torch intra-op threads of the learner.", default=1)


def layers_of(m: ESConfig) -> list:
    return DEFAULT_NETWORK if m.network is None else m.network


class ESSettings(AlgorithmSettings):
    name = "es"
    starter = {"agent.scheduled_global_steps": 60, "run.eval_every": 5, "run.eval_episodes": 10}
    model_config = ESConfig
    panel_metrics = (
        ("es return", "learner/es/return_mean"),
        ("update ratio", "learner/es/update_ratio"),
        ("policy lag", "learner/policy_lag"),
    )
    synchronous = True

    @classmethod
    def work_items(cls, cfg):
        return cfg.model.population

    @classmethod
    def validate(cls, cfg):
        m, c = cfg.model, cfg.cluster
        if m.population < c.memories:
            raise ConfigError(
                f"model.population ({m.population}) must be at least cluster.memories "
                f"({c.memories}): each memory gathers its share of the work items"
            )
        for key in ("sigma", "learning_rate", "adam_eps", "obs_norm_clip"):
            if not getattr(m, key) > 0:
                raise ConfigError(f"model.{key}: must be > 0, got {getattr(m, key)}")
        if m.weight_decay < 0:
            raise ConfigError(f"model.weight_decay: must be >= 0, got {m.weight_decay}")
        if m.obs_norm_std_floor < 0:
            raise ConfigError(f"model.obs_norm_std_floor: must be >= 0, got {m.obs_norm_std_floor}")
        if m.episode_step_cap < 1:
            raise ConfigError(f"model.episode_step_cap: must be at least 1, got {m.episode_step_cap}")
        if c.learners != 1:
            raise ConfigError(
                f"cluster.learners: es combines every result on one learner, got {c.learners} "
                "(its update is a weighted sum of noise, not worth splitting)"
            )
        if cfg.env.num_envs != 1:
            raise ConfigError(
                f"env.num_envs: es evaluates each perturbation on one env per actor, got "
                f"{cfg.env.num_envs} (use more actors or a larger model.population)"
            )
        if m.torch_threads < 1:
            raise ConfigError(f"model.torch_threads: must be at least 1, got {m.torch_threads}")
        for i, layer in enumerate(parse_network(layers_of(m), "model.network")):
            if layer.kind != "linear" and layer.kind not in NUMPY_ACTIVATIONS:
                raise ConfigError(
                    f"model.network[{i}]: es actors run the policy in numpy and support "
                    f"linear, {', '.join(NUMPY_ACTIVATIONS)}; got {str(layer)!r}"
                )


SETTINGS = ESSettings
