"""Lyre's configuration: ``config/model_config.yaml`` as typed, frozen sections.

- :mod:`lyre.config.schema`: the sections, each key's type, default and allowed range, declared;
- :mod:`lyre.config.load`: reading the file, dotted overrides (``--set``), and the refusal that
  names the key, the value and the rule;
- :mod:`lyre.config.checks`: the rules that relate keys of several sections.
"""

from lyre.config.load import (
    DEFAULT_CONFIG_PATH,
    ConfigError,
    add_config_arguments,
    apply_overrides,
    config_from_args,
    config_to_dict,
    load_config,
)
from lyre.config.schema import (
    AuditConfig,
    BuildConfig,
    CodecConfig,
    EngineConfig,
    KVCacheConfig,
    LyreConfig,
    ModelConfig,
    RivaConfig,
    SamplingConfig,
    SchedulerConfig,
    ServerConfig,
    TuningProfile,
    VoicesConfig,
    WatermarkConfig,
)

__all__ = [
    "DEFAULT_CONFIG_PATH", "AuditConfig", "BuildConfig", "CodecConfig", "ConfigError", "EngineConfig", "KVCacheConfig", "LyreConfig",
    "ModelConfig", "RivaConfig", "SamplingConfig", "SchedulerConfig", "ServerConfig", "TuningProfile",
    "VoicesConfig", "WatermarkConfig", "add_config_arguments", "apply_overrides", "config_from_args",
    "config_to_dict", "load_config",
]
