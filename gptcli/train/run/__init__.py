"""The run machinery: what every training run does with its run directory and its updates, whatever it trains.

Pretraining and fine-tuning are two *jobs* on it (:class:`gptcli.train.run.loop.Job`: ``next_update``,
``after_update``, ``evaluate``, ``save``); what differs — data, loss, cadences, a checkpoint's extra state — is the
job's, as ``Trainer.step(loss_fn)`` takes the loss. What is the same lives here, once:

``directory.py``       opening a run (:func:`~gptcli.train.run.directory.open_run`: lock, output check, start,
                       resume, replace or nothing left to do), config.toml, metrics.jsonl, step checkpoints
                       (named, pruned, removed).
``resume.py``          which checkpoint a resume continues from, and the check that refuses a changed run.
``training_state.py``  what a step checkpoint adds for a resume (optimizer, RNGs, position).
``loop.py``            the update loop (the only one): sync points, the non-finite policy, stopping on a signal.
``memory.py``          one out-of-memory error for every run, naming the setting that makes a pass smaller.
"""
