"""The web UI (`tunesmith webui`): gradio pages that write YAML and run the CLI as jobs."""
