"""Planning a ``--gpus N`` / ``--procs N`` pretraining launch: what the launching process checks once before its
workers run the user's config.

The launching process trains nothing: it starts the workers (:func:`gptcli.train.distributed.launch_command`), each
of which re-runs ``gpt1 pretrain`` on the resolved config. What can be refused is refused here, once, before any
worker starts: impossible settings, a world size the batch does not divide, an output that is not a pretraining run,
damaged shards, a validation split the corpus lacks. ``gpt1 pretrain`` (commands/pretrain.py) renders the plan and
the outcome.
"""

from __future__ import annotations

from pathlib import Path

from gptcli.data.shards import open_corpus
from gptcli.outputs import check_output
from gptcli.train.distributed import LaunchSpec
from gptcli.train.pretrain import PretrainConfig, check_launch, check_settings, open_training_corpus, validation_split


def plan_pretrain_launch(config: PretrainConfig, spec: LaunchSpec) -> bool:
    """Check ``config`` for a launch of ``spec``'s processes; True when the shards were verified here.

    The shards are verified here rather than in every worker (they would all read the whole corpus): the launch
    tells its workers so (:func:`gptcli.train.distributed.launch_command`), outside their config. Each worker still
    checks the checkpoint it resumes from as ``verify_data`` says: a damaged newest one is skipped with the warning
    by all alike, and all continue from the same intact one."""
    check_settings(config)
    check_launch(config, spec.nproc_per_node * spec.nnodes)
    check_output(Path(config.out), "pretrain-run", overwrite=True, inputs=[Path(config.data)], replacing=False)
    corpus = open_training_corpus(config) if config.verify_data else open_corpus(config.data)
    validation_split(config, corpus)  # a --val-split the corpus lacks: refused once, here, not by every worker
    return config.verify_data


__all__ = ["plan_pretrain_launch"]
