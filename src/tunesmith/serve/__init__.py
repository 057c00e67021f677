"""OpenAI-compatible HTTP server over an inference engine (`tunesmith api`)."""
