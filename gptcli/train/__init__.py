"""Training: pretraining (paper §3.1, §4.1) and fine-tuning (§3.2, §4.1) as two jobs on one run machinery.

``run/`` is what every run shares: its run directory, the resume rules and the update loop (``run/loop.py``, the
only loop). A job says what one update is: ``pretrain_job.py`` (windows of the corpus) and ``finetune_job.py``
(batches of a task's examples, the task loss). ``trainer.py`` turns micro-batches and a loss into one optimizer
update; ``optim.py`` holds the optimizer groups and schedules, ``distributed.py`` data parallelism and its launcher,
``runlog.py`` metrics.jsonl. ``pretrain.py`` and ``finetune.py`` are the entry functions: they open the run, build
the job and hand it to the loop.
"""
