"""The restoration metric through `evaluate.load` of the module installed with the package (no Hub)."""
from pathlib import Path

import evaluate
import pytest

from hf_mecheval.metrics import interchange_restoration_path, summarize_restoration

MODULE = Path(interchange_restoration_path())


def test_the_module_is_package_data_and_the_clone_path_reaches_it():
    assert MODULE.parent.name == "metrics" and (MODULE / "interchange_restoration.py").is_file()
    clone = Path(__file__).resolve().parents[2] / "evaluation" / "interchange_restoration"
    assert clone.resolve() == MODULE.resolve()


def test_evaluate_load_by_path_matches_the_library():
    metric = evaluate.load(str(MODULE))
    clean, corrupt, patched = [0.9, 0.7, 0.8, 0.6], [0.1, 0.3, 0.2, 0.1], [0.5, 0.5, 0.8, 0.1]
    got = metric.compute(p_clean=clean, p_corrupt=corrupt, p_patched=patched, n_resamples=200)
    want = summarize_restoration(clean, corrupt, patched, n_resamples=200)
    # by hand: (mean patched - mean corrupt) / (mean clean - mean corrupt) = (0.475 - 0.175) / (0.75 - 0.175)
    assert got["restoration"] == pytest.approx(0.3 / 0.575)
    assert got["restoration"] == pytest.approx(want["restoration"])
    assert got["restoration_ci"] == pytest.approx(list(want["restoration_ci"]))
    assert got["normalized_mean"] == pytest.approx(want["normalized_mean"])
    # batches added incrementally give the same result
    metric.add_batch(p_clean=clean[:2], p_corrupt=corrupt[:2], p_patched=patched[:2])
    metric.add_batch(p_clean=clean[2:], p_corrupt=corrupt[2:], p_patched=patched[2:])
    assert metric.compute(n_resamples=200)["restoration"] == pytest.approx(want["restoration"])
    # the keyword arguments reach the computation: a threshold above the denominator (0.575) leaves
    # no score; another seed, other intervals
    assert metric.compute(p_clean=clean, p_corrupt=corrupt, p_patched=patched, threshold=0.6,
                          n_resamples=200)["restoration"] is None
    other = metric.compute(p_clean=clean, p_corrupt=corrupt, p_patched=patched, n_resamples=200, seed=1)
    assert other["restoration_ci"] == pytest.approx(list(summarize_restoration(clean, corrupt, patched, n_resamples=200,
                                                                               seed=1)["restoration_ci"]))
    assert other["restoration_ci"] != pytest.approx(got["restoration_ci"])


def test_metric_card_states_the_formula():
    card = (MODULE / "README.md").read_text()
    assert "mean(p_patched) - mean(p_corrupt)" in card and "Limitations" in card
