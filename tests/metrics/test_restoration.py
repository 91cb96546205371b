import numpy as np
import pytest

from hf_mecheval.metrics import bootstrap_interval, per_example_restoration, restoration, summarize_restoration
from hf_mecheval.metrics.mechanism import classify, classify_by_layer, relabel


def test_ratio_of_means_by_hand():
    clean, corrupt, patched = [0.9, 0.7], [0.1, 0.3], [0.5, 0.5]
    # (0.5 - 0.2) / (0.8 - 0.2) = 0.5
    assert restoration(clean, corrupt, patched) == pytest.approx(0.5)
    assert restoration(clean, corrupt, clean) == pytest.approx(1.0)
    assert restoration(clean, corrupt, corrupt) == pytest.approx(0.0)
    assert restoration([0.5, 0.5], [0.495, 0.5], [0.5, 0.5], threshold=0.01) is None   # denominator 0.0025


def test_per_example_scores_skip_small_denominators():
    scores = per_example_restoration([0.9, 0.5, 0.6], [0.1, 0.5, 0.2], [0.5, 0.9, 0.6], threshold=0.01)
    assert scores.tolist() == pytest.approx([0.5, 1.0])      # the middle example has no denominator


def test_a_corruption_that_raises_the_answer_has_no_score():
    # the denominator is signed: corrupting the key *raising* p(answer) is no effect to restore,
    # never a score with its sign flipped (abs() there would give (0.5 - 0.9) / (0.1 - 0.9) = 0.5)
    assert restoration([0.1, 0.1], [0.9, 0.9], [0.5, 0.5]) is None
    # per example: only the second has clean above corrupt, (0.5 - 0.1) / (0.9 - 0.1)
    assert per_example_restoration([0.1, 0.9], [0.9, 0.1], [0.5, 0.5]).tolist() == pytest.approx([0.5])
    # the threshold is strict: a denominator equal to it has no score, one just above does
    assert restoration([0.75], [0.5], [0.5], threshold=0.25) is None
    assert restoration([0.75], [0.5], [0.5], threshold=0.24) == 0.0


def test_bootstrap_interval_contains_the_estimate_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small = rng.normal(1.0, 1.0, 50)
    big = rng.normal(1.0, 1.0, 5000)
    lo_s, hi_s = bootstrap_interval(lambda x: x.mean(-1), (small,), 500)
    lo_b, hi_b = bootstrap_interval(lambda x: x.mean(-1), (big,), 500)
    assert lo_s < small.mean() < hi_s and lo_b < big.mean() < hi_b
    assert (hi_b - lo_b) < (hi_s - lo_s) / 5
    # ~ +-1.96 sd / sqrt(n) for a mean
    assert (hi_b - lo_b) == pytest.approx(2 * 1.96 / np.sqrt(5000), rel=0.2)


def test_bootstrap_intervals_equal_scipys_percentile_bootstrap():
    """scipy.stats.bootstrap (percentile, paired, the same generator) as a second implementation:
    the same intervals. Ours stays for resamples where the ratio is undefined (a denominator at or
    below the threshold): it drops them, where scipy's interval becomes NaN."""
    stats = pytest.importorskip("scipy.stats")
    from hf_mecheval.metrics.restoration import _ratio_of_means

    rng = np.random.default_rng(1)
    clean, corrupt, patched = 0.8 + 0.2 * rng.random(60), 0.1 * rng.random(60), rng.random(60)
    cases = [(lambda x, axis=-1: x.mean(axis), (patched,)),
             (lambda c, k, p, axis=-1: _ratio_of_means(c, k, p, 0.01), (clean, corrupt, patched))]
    for statistic, arrays in cases:
        theirs = stats.bootstrap(arrays, statistic, paired=True, vectorized=True, n_resamples=1000, batch=1000,
                                 method="percentile", rng=np.random.default_rng(0)).confidence_interval
        assert bootstrap_interval(statistic, arrays, 1000, seed=0) == pytest.approx(tuple(theirs), rel=1e-12)


def test_summary_fields():
    s = summarize_restoration([0.9] * 20, [0.1] * 20, [0.5] * 20, n_resamples=100)
    assert s["restoration"] == pytest.approx(0.5) and s["restoration_ci"] == pytest.approx((0.5, 0.5))
    assert s["normalized_mean"] == pytest.approx(0.5) and s["normalized_examples"] == 20


def cells(key, value, query, width=0.0):
    return {p: {"restoration": v, "restoration_ci": (v - width, v + width)}
            for p, v in (("key", key), ("value", value), ("query", query))}


@pytest.mark.parametrize("scores, width, label, confidence", [
    ((0.0, 1.0, 0.0), 0.05, "induction", "high"),
    ((0.05, 0.02, 0.97), 0.05, "direct_query", "high"),
    ((0.45, 0.05, 0.5), 0.05, "direct_key_query", "high"),
    ((0.95, 0.0, 0.02), 0.03, "direct_key_query", "high"),   # all at the key: still no induction
    ((0.1, 0.05, 0.5), 0.05, "mixed", "low"),                # too little anywhere
    ((0.0, 0.7, 0.2), 0.2, "induction", "medium"),
    ((0.3, 0.4, 0.3), 0.05, "mixed", "low"),
    ((1.0, 1.0, 0.0), 0.05, "mixed", "low"),            # @key restores too: not the induction signature
])
def test_mechanism_labels(scores, width, label, confidence):
    m = classify(cells(*scores, width), clean_accuracy=0.99)
    assert (m.label, m.confidence) == (label, confidence)
    assert m.evidence["@value"]["restoration"] == scores[1]


@pytest.mark.parametrize("scores, label", [
    # each threshold met exactly (intervals of width 0: "high" wherever the rule holds), then missed
    ((0.0, 0.6, 0.3), "induction"),           # @value >= 0.6 and @query, @key <= 0.3
    ((0.0, 0.59, 0.0), "mixed"),
    ((0.0, 0.9, 0.31), "mixed"),
    ((0.31, 0.9, 0.0), "mixed"),
    ((0.3, 0.3, 0.6), "direct_query"),        # @query >= 0.6 and @value, @key <= 0.3
    ((0.15, 0.0, 0.5), "direct_key_query"),   # @key + @query >= 0.6 with @key >= 0.15, @value <= 0.3
    ((0.149, 0.0, 0.5), "mixed"),
    ((0.3, 0.0, 0.3), "direct_key_query"),
    ((0.3, 0.0, 0.29), "mixed"),
    ((0.3, 0.31, 0.5), "mixed"),
])
def test_mechanism_thresholds_at_their_boundaries(scores, label):
    m = classify(cells(*scores), clean_accuracy=0.99)
    assert (m.label, m.confidence) == (label, "low" if label == "mixed" else "high")


def test_failed_models():
    assert classify(cells(0, 1, 0), clean_accuracy=0.1).label == "failed"
    none = {p: {"restoration": None} for p in ("key", "value", "query")}
    assert "denominator" in classify(none, clean_accuracy=0.9).reason


def test_without_intervals_confidence_is_at_most_medium():
    no_ci = {p: {"restoration": v, "restoration_ci": None} for p, v in (("key", 0.0), ("value", 1.0), ("query", 0.0))}
    m = classify(no_ci, clean_accuracy=0.99)
    assert (m.label, m.confidence) == ("induction", "medium") and "no bootstrap intervals" in m.reason


def test_rows_written_under_an_older_rule_are_relabelled_and_failed_rows_kept():
    # a Mamba row that the rule of the time called mixed: all of it at the key, none at the value
    old = {"@key": 0.95, "@key_ci": [0.93, 0.97], "@value": 0.0, "@value_ci": [0.0, 0.001],
           "@query": 0.02, "@query_ci": [0.005, 0.03], "mechanism": "mixed", "confidence": "low", "run": "m"}
    new = relabel(old)
    assert (new["mechanism"], new["confidence"], new["run"]) == ("direct_key_query", "high", "m")
    assert old["mechanism"] == "mixed"                                   # the row itself is left alone
    assert relabel({**old, "@key_ci": None})["confidence"] == "medium"   # no intervals: point estimates
    # failed rests on the grid's clean accuracy, which a row does not keep: never relabelled
    failed = {**old, "mechanism": "failed", "confidence": "high"}
    assert relabel(failed) == failed
    assert relabel({"run": "not evaluated"}) == {"run": "not evaluated"}


def test_induction_in_a_middle_layer_is_induction():
    # layer 0's input holds the tokens (the key restores alone); a 3-layer Transformer looks the key
    # up at layer 1 (the value restores there), after which the answer sits at the query
    tokens = cells(1.0, 0.0, 0.0, 0.02)
    transformer = {0: tokens, 1: cells(0.0, 1.0, 0.0, 0.02), 2: cells(0.0, 0.0, 1.0, 0.02)}
    m = classify_by_layer(transformer, clean_accuracy=1.0)
    assert (m.label, m.confidence, m.evidence["layer"]) == ("induction", "high", 1)
    assert "layer 1" in m.reason and "direct_query" in m.reason
    # what the last layer's input alone says
    assert classify(transformer[2], clean_accuracy=1.0).label == "direct_query"
    # a 3-layer Mamba retrieves at the query from layer 1 on: no induction anywhere, the last layer's label
    mamba = {0: tokens, 1: cells(0.0, 0.0, 1.0, 0.02), 2: cells(0.0, 0.0, 1.0, 0.02)}
    assert classify_by_layer(mamba, clean_accuracy=0.7) == classify(mamba[2], clean_accuracy=0.7)
    # one and two layers: the last layer's label, whatever the first layer's input shows
    for two in ({0: tokens, 1: cells(0.05, 0.02, 0.97, 0.05)}, {0: tokens, 1: cells(0.45, 0.05, 0.5, 0.05)},
                {0: cells(0.0, 1.0, 0.0), 1: cells(0.05, 0.02, 0.97, 0.05)}, {0: tokens}):
        assert classify_by_layer(two, clean_accuracy=0.99) == classify(two[max(two)], clean_accuracy=0.99)
    # a failed model stays failed, whatever its middle layers show
    assert classify_by_layer(transformer, clean_accuracy=0.1).label == "failed"


def test_a_row_relabelled_reads_induction_in_its_middle_layers():
    scores = {"layers.0.input@key": 1.0, "layers.0.input@value": 0.0, "layers.0.input@query": 0.0,
              "layers.1.input@key": 0.0, "layers.1.input@value": 1.0, "layers.1.input@query": 0.0,
              "layers.2.input@key": 0.0, "layers.2.input@value": 0.0, "layers.2.input@query": 1.0}
    last = {"@key": 0.0, "@key_ci": [0.0, 0.01], "@value": 0.0, "@value_ci": [0.0, 0.01],
            "@query": 1.0, "@query_ci": [0.99, 1.0], "layer_scores": scores}
    # labelled by the last layer alone (before the rule read earlier layers): relabelled from the
    # middle layer's point estimates
    relabelled = relabel({**last, "mechanism": "direct_query", "confidence": "high"})
    assert (relabelled["mechanism"], relabelled["confidence"], relabelled["mechanism_layer"]) == ("induction", "medium", 1)
    # labelled induction with the middle layer's intervals when it was written: kept as it is, the
    # layer named
    row = {**last, "mechanism": "induction", "confidence": "high"}
    assert relabel(row) == {**row, "mechanism_layer": 1}
    # induction read at the last layer's input names no layer
    two = {**last, "@value": 1.0, "@value_ci": [0.99, 1.0], "@query": 0.0, "@query_ci": [0.0, 0.01],
           "mechanism": "induction", "confidence": "high",
           "layer_scores": {k: v for k, v in scores.items() if not k.startswith("layers.2")}}
    assert "mechanism_layer" not in relabel(two)
    # without induction in the middle the last layer decides
    mamba = {**last, "layer_scores": {**scores, "layers.1.input@value": 0.0, "layers.1.input@query": 1.0},
             "mechanism": "induction", "confidence": "high"}
    assert relabel(mamba)["mechanism"] == "direct_query"
