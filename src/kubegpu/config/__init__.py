"""Versioned configuration model, file loading and flag > env > file > default precedence."""

from kubegpu.config.load import ConfigError, load_config, render_config
from kubegpu.config.model import AgentConfig

__all__ = ["AgentConfig", "ConfigError", "load_config", "render_config"]
