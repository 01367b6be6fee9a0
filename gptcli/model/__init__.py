"""The network and what sits on it (paper §3.1, §3.2): nothing here knows about devices, data or files.

``gpt.py`` is GPT-1 itself (12 post-LN blocks, learned positions, tied output layer); ``lstm.py`` the LSTM baseline
of Table 5 with the same interface; ``build.py`` the one factory (architecture by config, presets, decoding
states); ``heads.py`` the task heads on the extract token; ``classifier.py`` a model and its head as one module with
batched prediction; ``losses.py`` the one language-modelling loss; ``generate.py`` sampling with a KV cache.
Distribution, precision and checkpoints are applied from outside (``train/``, ``checkpoint.py``).

The model is plain PyTorch (``attention.py``: SDPA; ``dropout.py``: ``F.dropout``; ``losses.py``:
``F.cross_entropy``) and imports nothing from ``kernels/``, the fast CPU paths that a run applies to a built model
(``kernels.apply``, under ``--kernels auto`` on CPU).
"""
