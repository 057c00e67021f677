"""Index plans over tokenised datasets: num_samples, mix strategies, validation split.

All are pure functions of sizes and a seed, returning index arrays (no data is copied).
`interleave_under` stops when the first dataset runs out; `interleave_over` goes on,
restarting exhausted datasets, until every dataset has been used once in full (the
`first_exhausted` / `all_exhausted` behaviour of `datasets.interleave_datasets`).
"""

from __future__ import annotations

import numpy as np

from tunesmith.errors import ConfigError, DataError

MIX_STRATEGIES = ("concat", "interleave_under", "interleave_over")


def resample(n: int, target: int, seed: int) -> np.ndarray:
    """LLaMA-Factory's num_samples: a random subset of `target` rows, or every row plus
    random repeats when target > n."""
    rng = np.random.default_rng(seed)
    if target <= n:
        return np.sort(rng.permutation(n)[:target])
    return np.concatenate([np.arange(n), rng.choice(n, target - n, replace=True)])


def mix_plan(sizes: list[int], strategy: str, probs: list[float] | list[str], seed: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """(which dataset, index within it) of every mixed sample, in mixed order."""
    try:
        probs = [float(p) for p in probs]
    except ValueError:
        raise ConfigError(f"interleave_probs: {probs} must be numbers") from None
    if strategy not in MIX_STRATEGIES:
        raise ConfigError(f"mix_strategy: {strategy!r} is not one of {', '.join(MIX_STRATEGIES)}")
    if strategy == "concat" or len(sizes) == 1:
        which = np.concatenate([np.full(n, d, np.int64) for d, n in enumerate(sizes)])
        index = np.concatenate([np.arange(n, dtype=np.int64) for n in sizes])
        return which, index
    if probs and (len(probs) != len(sizes) or abs(sum(probs) - 1.0) > 1e-6
                  or min(probs) < 0):
        raise ConfigError(f"interleave_probs: {probs} must hold {len(sizes)} non-negative "
                          "numbers summing to 1, one per dataset")
    if min(sizes) == 0:
        raise DataError("interleaving needs every dataset to have samples; one is empty")
    return _interleave(sizes, probs, strategy == "interleave_over", seed)


def _interleave(sizes: list[int], probs: list[float], over: bool, seed: int
                ) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    k = len(sizes)
    pos = [0] * k
    done = [False] * k
    which, index = [], []
    limit = 100 * sum(sizes)  # guards against probabilities near zero looping for ever
    step = 0
    while step < limit:
        d = int(rng.choice(k, p=probs)) if probs else step % k
        step += 1
        if pos[d] == sizes[d]:
            done[d] = True
            if not over or all(done):
                break
            pos[d] = 0
        which.append(d)
        index.append(pos[d])
        pos[d] += 1
        if pos[d] == sizes[d]:
            done[d] = True
            if over and all(done):
                break
    return np.array(which, np.int64), np.array(index, np.int64)


def validation_split(n: int, val_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train positions, validation positions); val_size is a fraction < 1 or a count."""
    if not val_size:
        return np.arange(n), np.zeros(0, np.int64)
    n_val = int(val_size) if val_size >= 1 else max(1, round(n * val_size))
    if n_val >= n:
        raise DataError(f"val_size {val_size} leaves no training samples out of {n}; lower "
                        "val_size")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])
