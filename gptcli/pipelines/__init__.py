"""Several stages in a row: the quickstart (the whole paper at toy scale) and its text (``stdlib_text.py``), the
time-budget helpers it shares with ``experiments/``, and text generation from a checkpoint on disk."""
