"""Metrics against scikit-learn / scipy (test-only references) on random data and degenerate cases."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gptcli.eval import metrics

skm = pytest.importorskip("sklearn.metrics")
stats = pytest.importorskip("scipy.stats")


def _cases(seed: int = 0):
    rng = np.random.default_rng(seed)
    for n in (1, 2, 7, 100, 1001):
        for p1 in (0.1, 0.5, 0.9):
            y = (rng.random(n) < p1).astype(int)
            noise = rng.random(n) < rng.random()
            yield y, np.where(noise, 1 - y, y)


def test_classification_metrics_match_sklearn():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns on the degenerate draws; values are what we compare
        for y, p in _cases():
            assert metrics.accuracy(p, y) == pytest.approx(skm.accuracy_score(y, p), abs=1e-12)
            assert metrics.f1(p, y) == pytest.approx(skm.f1_score(y, p, zero_division=0), abs=1e-12)
            assert metrics.mcc(p, y) == pytest.approx(skm.matthews_corrcoef(y, p), abs=1e-12)


def test_multiclass_mcc_and_accuracy_match_sklearn():
    rng = np.random.default_rng(1)
    for _ in range(20):
        y = rng.integers(0, 3, 200)
        p = np.where(rng.random(200) < 0.6, y, rng.integers(0, 3, 200))
        assert metrics.mcc(p, y) == pytest.approx(skm.matthews_corrcoef(y, p), abs=1e-12)
        assert metrics.accuracy(p, y) == pytest.approx(skm.accuracy_score(y, p))


def test_degenerate_classification():
    ones = np.ones(10, dtype=int)
    assert metrics.mcc(ones, ones) == 0.0  # one class only: zero denominator -> 0 (sklearn's convention)
    assert metrics.mcc(ones, np.r_[ones[:5], 0 * ones[:5]]) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert skm.matthews_corrcoef(ones, ones) == 0.0
    zeros = 0 * ones
    assert metrics.f1(zeros, zeros) == 0.0  # no positives anywhere
    assert metrics.f1(ones, ones) == 1.0
    assert metrics.f1([1, 0, 1, 0], [0, 1, 0, 1]) == 0.0
    assert metrics.mcc([1, 0, 1, 0], [0, 1, 0, 1]) == -1.0
    assert metrics.f1([2, 2, 0], [2, 0, 0], positive=2) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="equal length"):
        metrics.accuracy([1, 0], [1])
    with pytest.raises(ValueError, match="no examples"):
        metrics.accuracy([], [])


def test_correlations_match_scipy():
    rng = np.random.default_rng(2)
    for n in (3, 10, 1500):
        x = rng.uniform(0, 5, n)
        y = x + rng.normal(0, rng.uniform(0.1, 3), n)
        assert metrics.pearson(y, x) == pytest.approx(stats.pearsonr(y, x)[0], abs=1e-12)
        assert metrics.spearman(y, x) == pytest.approx(stats.spearmanr(y, x)[0], abs=1e-12)
        # Heavy ties (STS-B gold scores are multiples of 0.2; predictions rounded), averaged ranks.
        xt, yt = np.round(x * 5) / 5, np.round(y)
        assert metrics.spearman(yt, xt) == pytest.approx(stats.spearmanr(yt, xt)[0], abs=1e-12)
        np.testing.assert_allclose(metrics.rank_average(yt), stats.rankdata(yt, method="average"))
    assert metrics.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert metrics.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)


def test_constant_input_correlation_is_zero_where_scipy_gives_nan():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    c = np.full(4, 2.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(stats.pearsonr(c, x)[0])
    assert metrics.pearson(c, x) == 0.0
    assert metrics.pearson(x, c) == 0.0
    assert metrics.spearman(c, x) == 0.0


def test_compute_by_name():
    out = metrics.compute(("pearson", "spearman"), [0.1, 0.4, 0.35, 0.8], [0, 0.5, 0.4, 1.0])
    assert set(out) == {"pearson", "spearman"} and out["spearman"] == pytest.approx(1.0)
    assert set(metrics.METRICS) == {"accuracy", "f1", "mcc", "pearson", "spearman"}
    with pytest.raises(KeyError, match="unknown metric 'bleu'"):
        metrics.compute(("bleu",), [1], [1])


def test_score_predictions_headline_first_and_per_level():
    """A task's metrics ×100, headline first; RACE-style examples with two levels add per-level accuracy."""
    from types import SimpleNamespace as NS

    mrpc = NS(metric="f1", extra_metrics=("accuracy",))
    ex = [NS(label=y, extra={}) for y in (1, 0, 1, 1)]
    scores = metrics.score_predictions(mrpc, [1, 0, 0, 1], ex)
    assert list(scores) == ["f1", "accuracy"]
    assert scores["accuracy"] == pytest.approx(75.0) and scores["f1"] == pytest.approx(100 * 0.8)
    race = NS(metric="accuracy", extra_metrics=())
    ex = [NS(label=0, extra={"level": lv}) for lv in ("middle", "middle", "high", "high", "high")]
    scores = metrics.score_predictions(race, [0, 1, 0, 0, 1], ex)
    assert scores == pytest.approx({"accuracy": 60.0, "accuracy_high": 100 * 2 / 3, "accuracy_middle": 50.0})
    one_level = [NS(label=0, extra={"level": "high"})] * 2
    assert set(metrics.score_predictions(race, [0, 1], one_level)) == {"accuracy"}
