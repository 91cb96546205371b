"""Restoration scores of interchange interventions.

For one (site, layer, position) cell and N examples with probabilities of the clean answer
``p_clean`` (clean run), ``p_corrupt`` (corrupted run) and ``p_patched`` (corrupted run with the
clean activation patched in at that one cell):

* the paper's score, a ratio of means::

      restoration = (mean(p_patched) - mean(p_corrupt)) / (mean(p_clean) - mean(p_corrupt))

  1 = the single patch restores the clean behaviour, 0 = no effect. Reported only when the
  denominator exceeds ``threshold`` (reference: 0.01 for AR, 0.1 for ATR); otherwise None.
* per-example normalised scores ``(p_patched_i - p_corrupt_i) / (p_clean_i - p_corrupt_i)`` over
  the examples whose own denominator exceeds ``threshold``, and their mean;
* percentile bootstrap intervals (resampling examples) for both.
"""
from __future__ import annotations

import numpy as np


def _arrays(*xs):
    out = [np.asarray(x, dtype=np.float64) for x in xs]
    if len({x.shape for x in out}) != 1 or out[0].ndim != 1:
        raise ValueError("p_clean, p_corrupt and p_patched must be 1-D arrays of the same length")
    return out


def _ratio_of_means(c: np.ndarray, k: np.ndarray, p: np.ndarray, threshold: float) -> np.ndarray:
    """Restoration along the last axis; NaN where the denominator is not above threshold."""
    denominator = c.mean(-1) - k.mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > threshold, (p.mean(-1) - k.mean(-1)) / denominator, np.nan)


def restoration(p_clean, p_corrupt, p_patched, threshold: float = 0.01) -> float | None:
    """The ratio-of-means score, or None when mean(p_clean) - mean(p_corrupt) <= threshold."""
    value = _ratio_of_means(*_arrays(p_clean, p_corrupt, p_patched), threshold)
    return None if np.isnan(value) else float(value)


def per_example_restoration(p_clean, p_corrupt, p_patched, threshold: float = 0.01) -> np.ndarray:
    """Normalised restoration of each example whose own denominator exceeds ``threshold``
    (the others are left out: their ratio is undefined or unstable)."""
    c, k, p = _arrays(p_clean, p_corrupt, p_patched)
    keep = (c - k) > threshold
    return (p[keep] - k[keep]) / (c[keep] - k[keep])


def bootstrap_interval(statistic, arrays, n_resamples: int = 1000, confidence: float = 0.95,
                       seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of a statistic (examples resampled with replacement, all
    arrays together).

    ``statistic`` is vectorised: it gets each array resampled as (n_resamples, n) and returns
    (n_resamples,) values along the last axis; NaN marks a resample where it is undefined (such
    resamples are skipped; None if more than half are)."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    n = len(arrays[0])
    if n == 0 or n_resamples <= 0:
        return None
    idx = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
    values = np.asarray(statistic(*(a[idx] for a in arrays)), dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) < n_resamples // 2:
        return None
    alpha = (1 - confidence) / 2
    return float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha))


def _mean_or_none(x: np.ndarray) -> float | None:
    return float(x.mean()) if len(x) else None


def summarize_restoration(p_clean, p_corrupt, p_patched, threshold: float = 0.01, n_resamples: int = 1000,
                          seed: int = 0) -> dict:
    """Everything reported for one cell."""
    c, k, p = _arrays(p_clean, p_corrupt, p_patched)
    score = restoration(c, k, p, threshold)
    per = per_example_restoration(c, k, p, threshold)
    return {
        "restoration": score,
        "restoration_ci": bootstrap_interval(lambda a, b, d: _ratio_of_means(a, b, d, threshold), (c, k, p),
                                             n_resamples, seed=seed) if score is not None else None,
        "normalized_mean": _mean_or_none(per),
        "normalized_ci": bootstrap_interval(lambda x: x.mean(-1), (per,), n_resamples, seed=seed) if len(per) else None,
        "normalized_examples": int(len(per)),
        "p_patched_mean": float(p.mean()),
    }


def near_far(distance) -> tuple[float, np.ndarray]:
    """Split examples by how far each query is from its pair (``query_pos - key_pos``, one per
    example): (the boundary, the median distance; (N,) bool, True for a "near" example, at most
    the boundary away). The "far" ones lie beyond it (none where every distance is the median)."""
    distance = np.asarray(distance)
    if distance.ndim != 1 or not len(distance):
        raise ValueError("query distances must be a non-empty 1-D array, one per example")
    boundary = float(np.median(distance))
    return boundary, distance <= boundary


def accuracy(predictions, answers) -> float:
    predictions, answers = np.asarray(predictions), np.asarray(answers)
    return float((predictions == answers).mean()) if len(answers) else float("nan")
