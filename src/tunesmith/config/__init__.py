"""Configuration: flat LLaMA-Factory-compatible keys mapped into typed, validated sections."""

from tunesmith.config.loader import load_config, parse_cli_args
from tunesmith.config.schema import Config

__all__ = ["Config", "load_config", "parse_cli_args"]
