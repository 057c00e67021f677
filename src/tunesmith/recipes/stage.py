"""What differs between training stages, handed to the one training recipe (sft.py):
the objective, an optional step on the prepared data, extra files saved with the model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class StageParts:
    objective: Any
    prepare: Callable[[Any], None] | None = None  # PreparedData -> None (may replace views)
    save_extra: Callable[[Path], None] | None = None  # written beside the adapter/model


# (cfg, model, model_path, device, pad_id) -> StageParts
StageBuilder = Callable[..., StageParts]
