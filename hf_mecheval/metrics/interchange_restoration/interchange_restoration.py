"""Interchange-intervention restoration as an `evaluate` metric.

    import evaluate
    from hf_mecheval.metrics import interchange_restoration_path
    metric = evaluate.load(interchange_restoration_path())     # this folder, installed with hf-mecheval
    metric.compute(p_clean=[...], p_corrupt=[...], p_patched=[...], threshold=0.01)

The computation is ``hf_mecheval.metrics.summarize_restoration`` (see the metric card). Its
configuration "mqar" takes ``query_distance`` too (each example one query of an MQAR document,
``query_pos - key_pos``) and adds the same for the near and the far queries apart
(``hf_mecheval.metrics.near_far``)::

    metric = evaluate.load(interchange_restoration_path(), "mqar")
    metric.compute(p_clean=[...], p_corrupt=[...], p_patched=[...], query_distance=[...])
"""
import datasets
import evaluate

from hf_mecheval.metrics import near_far, summarize_restoration

_DESCRIPTION = """Restoration score of an interchange intervention (activation patching): how much
of the clean behaviour a single patch of a clean activation into a corrupted run restores.
restoration = (mean(p_patched) - mean(p_corrupt)) / (mean(p_clean) - mean(p_corrupt)), reported only when
the denominator exceeds `threshold`; plus per-example normalised scores and bootstrap intervals."""

_KWARGS_DESCRIPTION = """
Args:
    p_clean (list of float): probability of the clean answer in the clean run, per example.
    p_corrupt (list of float): the same in the corrupted run.
    p_patched (list of float): the same in the corrupted run with one activation patched.
    query_distance (list of int; configuration "mqar" only): each example one query of an MQAR
        document, how far the query is from its pair (query_pos - key_pos). Adds `by_distance`.
    threshold (float, default 0.01): minimum denominator (0.01 for AR and MQAR, 0.1 for ATR).
    n_resamples (int, default 1000): bootstrap resamples.
    seed (int, default 0): bootstrap seed.
Returns:
    restoration (float or None), restoration_ci ([low, high] or None), normalized_mean (float or None),
    normalized_ci ([low, high] or None), normalized_examples (int), p_patched_mean (float); with
    query_distance also by_distance: {"boundary": the median distance, "near": the same keys over
    the examples at most the boundary away (and "examples"), "far": over the others (when any)}.
Examples:
    >>> metric = evaluate.load(interchange_restoration_path())
    >>> round(metric.compute(p_clean=[0.9, 0.7], p_corrupt=[0.1, 0.3], p_patched=[0.5, 0.5])["restoration"], 6)
    0.5
"""

_CITATION = """@article{arora2025mechanistic,
  title={Mechanistic evaluation of Transformers and state space models},
  author={Arora, Aryaman and Rathi, Neil and Selvam, Nikil Roashan and Csord{\\'a}s, R{\\'o}bert and Jurafsky, Dan and Potts, Christopher},
  journal={arXiv preprint arXiv:2505.15105},
  year={2025}
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class InterchangeRestoration(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({**PROBABILITIES, "query_distance": datasets.Value("int64")}
                                       if self.config_name == "mqar" else PROBABILITIES),
        )

    def _compute(self, p_clean, p_corrupt, p_patched, query_distance=None, threshold=0.01, n_resamples=1000,
                 seed=0):
        if query_distance is not None and self.config_name != "mqar":     # else it would be read without a word
            raise ValueError("query_distance is an input of the 'mqar' configuration: "
                             "evaluate.load(interchange_restoration_path(), 'mqar')")
        out = _summary(p_clean, p_corrupt, p_patched, threshold, n_resamples, seed)
        if query_distance is not None:
            boundary, near = near_far(query_distance)
            out["by_distance"] = {"boundary": boundary}
            for name, rows in (("near", near), ("far", ~near)):
                if rows.any():
                    pick = lambda values: [v for v, keep in zip(values, rows) if keep]   # noqa: E731
                    out["by_distance"][name] = {"examples": int(rows.sum()), **_summary(
                        pick(p_clean), pick(p_corrupt), pick(p_patched), threshold, n_resamples, seed)}
        return out


PROBABILITIES = {"p_clean": datasets.Value("float64"), "p_corrupt": datasets.Value("float64"),
                 "p_patched": datasets.Value("float64")}


def _summary(p_clean, p_corrupt, p_patched, threshold, n_resamples, seed) -> dict:
    """summarize_restoration with its intervals as lists (what JSON and the widget show)."""
    out = summarize_restoration(p_clean, p_corrupt, p_patched, threshold, n_resamples, seed)
    for key in ("restoration_ci", "normalized_ci"):
        if out[key] is not None:
            out[key] = list(out[key])
    return out
