"""tunesmith: fine-tune large language models fast, from one YAML file."""

__version__ = "0.1.0"
