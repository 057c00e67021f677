"""eval_on_each_dataset: which validation samples came from which eval_dataset.

The validation view is the val_size share of the training data followed by the
eval_dataset stores, one store per name, in the order given:

    val.stores = [train store 0 .. train store T-1, eval store 0 .. eval store E-1]
    sample k belongs to eval_dataset[d]  <=>  val.which[k] == T + d
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tunesmith.config.schema import DataConfig
from tunesmith.errors import DataError


def eval_groups(val: Sequence[Any], cfg: DataConfig) -> dict[str, list[int]]:
    """eval_dataset name -> positions of its samples in `val` ({} when the key is off)."""
    if not cfg.eval_on_each_dataset:
        return {}
    stores, which = getattr(val, "stores", None), getattr(val, "which", None)
    if stores is None or which is None:
        raise DataError("eval_on_each_dataset: the validation samples loaded from "
                        f"tokenized_path {cfg.tokenized_path} do not keep their datasets apart; "
                        "remove tokenized_path or eval_on_each_dataset")
    first = len(stores) - len(cfg.eval_dataset)
    return {name: np.flatnonzero(np.asarray(which) == first + d).tolist()
            for d, name in enumerate(cfg.eval_dataset)}
