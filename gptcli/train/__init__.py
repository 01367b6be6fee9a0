"""Training: pretraining (paper §3.1, §4.1) and fine-tuning (§3.2, §4.1) as two jobs on one update loop.

``run/`` is what every run shares: its run directory, the resume rules, the training state of a step checkpoint,
the out-of-memory error and the update loop (``run/loop.py``). A job says what one update is and what is due after
it: ``pretrain_job.py`` (windows of the corpus) and ``finetune_job.py`` (a task's examples: micro-batches, their
layout, L3 = L2 + λ·L1). ``trainer.py`` turns micro-batches and a loss into one optimizer step (``optim.py``,
``grad_norm.py``). Each kind of run has its settings and their checks (``*_config.py``) and its entry function
(``pretrain.py``, ``finetune.py``: open the run, build the job, hand it to the loop); fine-tuning also has its
inputs (``finetune_setup.py``) and dev scores (``finetune_dev.py``). ``distributed.py`` runs data parallelism and
its launcher (``launch_files.py``, ``heartbeat.py``), ``runlog.py`` writes metrics.jsonl, ``recipes.py`` holds each
preset's training settings. Why jobs: the loop's safety rules (sync points, non-finite stop, signals) exist once.
"""
