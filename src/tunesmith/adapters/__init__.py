"""Trainable-parameter setups: LoRA (PEFT), freeze, full."""
