"""Typed, validated run configuration: the schema, the sections, reading files and overrides,
and the checks of the shared sections. It imports nothing of aiorl above it: a config is
loaded with its algorithm (the model section, the algorithm's defaults and checks, each
subsystem's check) one floor up, by `aiorl.experiment.load_config`.
"""

from aiorl.config.checks import (
    check_agent_and_run,
    check_cluster_and_env,
    check_deterministic,
    check_offline,
    check_offline_episodes,
    check_stops,
    check_synchronous,
)
from aiorl.config.files import apply_overrides, read_config_file
from aiorl.config.schema import ConfigError, build_dataclass, coerce, doc, field_docs, type_name
from aiorl.config.sections import (
    OFFLINE_FORMATS,
    AgentConfig,
    ClusterConfig,
    Config,
    EnvConfig,
    OfflineConfig,
    RunSection,
    connect_host,
)

__all__ = [
    "OFFLINE_FORMATS",
    "AgentConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "EnvConfig",
    "OfflineConfig",
    "RunSection",
    "apply_overrides",
    "build_dataclass",
    "check_agent_and_run",
    "check_cluster_and_env",
    "check_deterministic",
    "check_offline",
    "check_offline_episodes",
    "check_stops",
    "check_synchronous",
    "coerce",
    "connect_host",
    "doc",
    "field_docs",
    "read_config_file",
    "type_name",
]
