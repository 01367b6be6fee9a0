"""A checkpoint that a live run prunes while another command reads it: the user learns it was replaced and what to
do (try again, or keep more with ``--keep-last``), not that its weights are "unreadable"."""

from __future__ import annotations

import shutil

import pytest
from error_lines import assert_one_line_error

from tests.faults.conftest import copy_of, gpt1

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_checkpoint_pruned_while_it_is_read_is_said_to_be_gone(run, corpus, tmp_path, capsys, monkeypatch):
    import gptcli.checkpoint as ckpt

    mine = copy_of(run, tmp_path)
    newest = sorted((mine / "checkpoints").iterdir())[-1]
    real = ckpt.load_file

    def pruned_meanwhile(filename, *args, **kwargs):
        shutil.rmtree(newest)  # what the running job's --keep-last does between our reads
        return real(filename, *args, **kwargs)

    monkeypatch.setattr(ckpt, "load_file", pruned_meanwhile)
    res = gpt1(["eval", "--checkpoint", newest, "--data", corpus, "--device", "cpu", "--no-verify"], capsys)
    assert_one_line_error(res, str(newest), "removed while it was read", "--keep-last")
