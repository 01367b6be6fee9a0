"""Planning a ``--gpus N`` / ``--procs N`` pretraining launch: what the launching process checks once, and the
config its workers run.

The launching process trains nothing: it starts the workers (:func:`gptcli.train.distributed.launch_command`), each
of which re-runs ``gpt1 pretrain`` on the resolved config. What can be refused is refused here, once, before any
worker starts: impossible settings, a world size the batch does not divide, an output that is not a pretraining run,
damaged shards, a validation split the corpus lacks. ``gpt1 pretrain`` (commands/pretrain.py) renders the plan and
the outcome.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gptcli.checkpoint import newest_intact
from gptcli.data.shards import open_corpus
from gptcli.files.outputs import check_output
from gptcli.train.distributed import LaunchSpec
from gptcli.train.pretrain import PretrainConfig, check_launch, check_settings, open_training_corpus, validation_split
from gptcli.train.run.directory import has_checkpoints


def plan_pretrain_launch(config: PretrainConfig, spec: LaunchSpec) -> PretrainConfig:
    """Check ``config`` for a launch of ``spec``'s processes and return the config the workers get.

    The shards are verified here rather than in every worker (they would all read the whole corpus), so the workers
    skip it (``verify_data = False``) — unless the run resumes and its newest checkpoint is damaged: unverifying
    workers would resume from it, so then they verify again (shards included), each skips it with the warning and
    all continue from the same intact one."""
    check_settings(config)
    check_launch(config, spec.nproc_per_node * spec.nnodes)
    check_output(Path(config.out), "pretrain-run", overwrite=True, inputs=[Path(config.data)], replacing=False)
    damaged = False
    corpus = open_training_corpus(config) if config.verify_data else open_corpus(config.data)
    validation_split(config, corpus)  # a --val-split the corpus lacks: refused once, here, not by every worker
    if config.verify_data and config.resume and has_checkpoints(config.out):
        damaged = bool(newest_intact(config.out)[1])
    return dataclasses.replace(config, verify_data=damaged)


__all__ = ["plan_pretrain_launch"]
