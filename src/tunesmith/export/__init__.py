"""Export: merge adapters into the base, write a Hugging Face folder or a GGUF file."""
