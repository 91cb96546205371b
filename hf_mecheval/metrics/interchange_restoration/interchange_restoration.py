"""Interchange-intervention restoration as an `evaluate` metric.

    import evaluate
    from hf_mecheval.metrics import interchange_restoration_path
    metric = evaluate.load(interchange_restoration_path())     # this folder, installed with hf-mecheval
    metric.compute(p_clean=[...], p_corrupt=[...], p_patched=[...], threshold=0.01)

The computation is ``hf_mecheval.metrics.summarize_restoration`` (see the metric card).
"""
import datasets
import evaluate

from hf_mecheval.metrics import summarize_restoration

_DESCRIPTION = """Restoration score of an interchange intervention (activation patching): how much
of the clean behaviour a single patch of a clean activation into a corrupted run restores.
restoration = (mean(p_patched) - mean(p_corrupt)) / (mean(p_clean) - mean(p_corrupt)), reported only when
the denominator exceeds `threshold`; plus per-example normalised scores and bootstrap intervals."""

_KWARGS_DESCRIPTION = """
Args:
    p_clean (list of float): probability of the clean answer in the clean run, per example.
    p_corrupt (list of float): the same in the corrupted run.
    p_patched (list of float): the same in the corrupted run with one activation patched.
    threshold (float, default 0.01): minimum denominator (0.01 for AR, 0.1 for ATR in the reference).
    n_resamples (int, default 1000): bootstrap resamples.
    seed (int, default 0): bootstrap seed.
Returns:
    restoration (float or None), restoration_ci ([low, high] or None), normalized_mean (float or None),
    normalized_ci ([low, high] or None), normalized_examples (int), p_patched_mean (float).
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
            features=datasets.Features({
                "p_clean": datasets.Value("float64"),
                "p_corrupt": datasets.Value("float64"),
                "p_patched": datasets.Value("float64"),
            }),
        )

    def _compute(self, p_clean, p_corrupt, p_patched, threshold=0.01, n_resamples=1000, seed=0):
        out = summarize_restoration(p_clean, p_corrupt, p_patched, threshold, n_resamples, seed)
        for key in ("restoration_ci", "normalized_ci"):
            if out[key] is not None:
                out[key] = list(out[key])
        return out
