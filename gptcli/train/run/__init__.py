"""The run machinery: what every training run does with its run directory and its update loop, whatever it trains.

Pretraining (:mod:`gptcli.train.pretrain`) and fine-tuning (:mod:`gptcli.train.finetune`) are two *jobs* on the same
machinery; the quickstart runs both. What differs between them — the data, the loss, when to evaluate, what a
checkpoint's extra state holds — is the job (:class:`gptcli.train.run.loop.Job`: ``next_update``, ``after_update``,
``evaluate``, ``save``), as ``Trainer.step(loss_fn)`` takes the loss. What is the same lives here, once:

``directory.py``
    A run directory's life: what a run does with ``--out`` (start, resume, replace, or nothing left to do), its
    marker, the recorded ``config.toml``, ``metrics.jsonl`` cut back to what the resumed checkpoint had seen, the
    hidden sibling a replacing run is built in, and the step checkpoints (written with their training state, pruned
    to ``keep_last``, read back on resume).
``resume.py``
    The resume rules: which checkpoint a resume continues from (the newest intact one), and the one check that
    refuses a resume that would change what the run is, naming every change (run-defining settings, the model's
    shape, the inputs by content), and notes the adjustable ones.
``loop.py``
    The update loop (the only one) with its sync points (the only places a figure is read back from the device), the
    run-state object every job carries (:class:`RunState`), the non-finite policy (one error naming the newest
    checkpoint saved before the divergence), and the checkpoint on SIGINT/SIGTERM.
"""
