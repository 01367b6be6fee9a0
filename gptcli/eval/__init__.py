"""Scoring: perplexity, the paper's task metrics, and its zero-shot heuristics (§5, Figure 2).

``metrics.py`` (numpy only), ``baselines.py`` (the majority and chance levels every score is read against) and
``tasks.py`` (results.json, predictions, GLUE files) for fine-tuned models;
``perplexity.py`` for language models on a corpus; ``scoring.py`` the batched log-probability engine behind
``zeroshot.py``; ``curve.py`` the zero-shot scores over pretraining checkpoints.
"""
