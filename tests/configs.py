"""Named tiny configs for tests: the few shapes of run the tests launch or load, each a constant, and
builders that take overrides. Every builder returns a fresh dict (a test may change it). A test writes
a config inline only where its values are the point of the test.

    configured(APEX_CARTPOLE_TINY, agent={"scheduled_global_steps": 100}, run={"keep_checkpoints": 1})
    dppo_cartpole(2, 1, 1, scheduled_timesteps=640)        # actors, memories, learners, agent keys
    es_tiny(3, 2, 1, population=5, env="Pendulum-v1")
    cluster(2, 2, 2, scheduled_timesteps=20_000)            # ASYNC with role counts
"""

from __future__ import annotations

import json

# Timeouts short enough for a test to see a loss in seconds (write_config fills them in).
FAST_CLUSTER = {
    "heartbeat_interval_s": 0.2,
    "heartbeat_timeout_s": 5.0,
    "coordinator_timeout_s": 3.0,
    "start_timeout_s": 60.0,
    "phase_timeout_s": 20.0,
}

# For tests of what a loss does when nothing comes back (restarts in place and of the whole run
# are on by default; tests/cluster/test_survival.py is about those).
NO_RESTARTS = {"max_restarts": 0, "max_run_restarts": 0}


def configured(base: dict, **sections: dict) -> dict:
    """A fresh copy of `base` with each named section's keys updated (a section it lacks is added,
    unless there is nothing to put in it)."""
    out = json.loads(json.dumps(base))
    for section, values in sections.items():
        if values or section in out:
            out.setdefault(section, {}).update(values)
    return out


def roles(actors: int, memories: int, learners: int) -> dict:
    """A cluster section with these role counts."""
    return {"actors": actors, "memories": memories, "learners": learners}


# The runtime's own test algorithm (random actions, a running-mean learner) on CartPole.
RANDOM_CARTPOLE = {
    "algo": "random_agent",
    "env": {"id": "CartPole-v1", "num_envs": 2},
    "agent": {"sample_batch_size": 16, "batch_size": 32, "buffer_size": 4000, "learning_starts": 200},
}

# The same, one env per actor and a small replay: a config to load rather than to run.
RANDOM_CARTPOLE_SMALL = {
    "algo": "random_agent",
    "env": {"id": "CartPole-v1"},
    "agent": {"batch_size": 16, "buffer_size": 1000, "learning_starts": 100},
}

# A cluster of the random agent that publishes every 5 steps, on 3-step returns: what cluster() builds.
ASYNC = configured(RANDOM_CARTPOLE, agent={"publish_interval": 5}, model={"n_step": 3, "gamma": 0.99})


def cluster(actors: int, memories: int, learners: int, **agent) -> dict:
    """A random_agent config (ASYNC) with these role counts and `agent` overrides (a fresh dict)."""
    config = json.loads(json.dumps(ASYNC))
    config["cluster"] = roles(actors, memories, learners)
    config["agent"].update(agent)
    return config


def random_cartpole(actors: int, memories: int, learners: int, **agent) -> dict:
    """RANDOM_CARTPOLE with these role counts and `agent` overrides."""
    return configured(RANDOM_CARTPOLE, cluster=roles(actors, memories, learners), agent=agent)


# Ape-X DQN on CartPole, small enough to learn a little in seconds.
APEX_CARTPOLE_TINY = {
    "algo": "apex_dqn",
    "env": {"id": "CartPole-v1"},
    "agent": {
        "sample_batch_size": 16,
        "batch_size": 32,
        "buffer_size": 20_000,
        "learning_starts": 300,
        "publish_interval": 10,
    },
    "model": {"network": ["linear:32", "relu"], "n_step": 3, "learning_rate": 0.0005, "tau": 0.01},
}

# DPPO on CartPole: 16-step rollouts of two envs per actor, a 16-unit network, one epoch.
DPPO_CARTPOLE_TINY = {
    "algo": "dppo",
    "env": {"id": "CartPole-v1", "num_envs": 2},
    "agent": {"sample_batch_size": 16, "batch_size": 32},
    "model": {"network": ["linear:16", "tanh"], "epochs": 1},
}


def dppo_cartpole(actors: int = 1, memories: int = 1, learners: int = 1, *, epochs: int = 1, **agent) -> dict:
    """DPPO_CARTPOLE_TINY with these role counts, epochs and `agent` overrides."""
    return configured(
        DPPO_CARTPOLE_TINY, cluster=roles(actors, memories, learners), agent=agent, model={"epochs": epochs}
    )


# Evolution strategies on CartPole: an 8-unit network, a noise table of 100k floats.
ES_TINY = {
    "algo": "es",
    "env": {"id": "CartPole-v1"},
    "model": {"network": ["linear:8", "tanh"], "noise_table_size": 100_000},
}


def es_tiny(actors: int, memories: int, learners: int, *, population: int, env: str = "CartPole-v1", **agent) -> dict:
    """ES_TINY on `env` with these role counts, population and `agent` overrides."""
    return configured(
        ES_TINY,
        env={"id": env},
        cluster=roles(actors, memories, learners),
        agent=agent,
        model={"population": population},
    )
