"""Training: the loop core shared by pretraining (§3.1, §4.1) and fine-tuning (§3.2, §4.1).

``trainer.py`` is one update (precision, accumulation, clipping, the non-finite guard, clean stops); ``optim.py`` the
optimizer groups and schedules; ``distributed.py`` data parallelism and its launcher; ``runlog.py`` metrics.jsonl;
``pretrain.py`` and ``finetune.py`` the two drivers, each a sequence of named stages.
"""
