"""Model resolution, provisioning (GGUF -> cached safetensors) and loading."""
