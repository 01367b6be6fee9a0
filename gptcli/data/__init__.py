"""Data on its way to the model: raw text → corpus, corpus → training windows, task examples → batches.

``prepare.py`` runs the paper's text pipeline into Arrow shards (§4.1), stage by stage: ``inputs.py`` decides which
files it reads, ``documents.py`` turns one file into documents, ``workers.py`` runs the text pipeline and the BPE
encoding in worker processes. ``shards.py`` is the one reader and writer of the corpus format; ``windows.py``
samples pretraining windows resumably; ``transforms.py`` holds the paper's task-specific input transformations
(§3.3, Figure 1); ``batching.py`` pads and batches their output; ``cache.py`` keeps encoded task examples for the
next run.
"""
