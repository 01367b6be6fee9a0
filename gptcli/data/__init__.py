"""Data on its way to the model: raw text → corpus, corpus → training windows, task examples → batches.

``prepare.py`` runs the paper's text pipeline into Arrow shards (§4.1); ``shards.py`` is the one reader and writer
of the corpus format; ``windows.py`` samples pretraining windows resumably; ``transforms.py`` holds the paper's
task-specific input transformations (§3.3, Figure 1); ``batching.py`` pads and batches their output.
"""
