"""`gpt1 inspect DIR`: options derived from InspectConfig, and what it prints."""

from __future__ import annotations

import pytest
from error_lines import gpt1

from gptcli.cli import main
from gptcli.data.prepare import PrepareConfig, prepare


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    for i, text in enumerate(("The first document.\nTwo lines.\n", "A second, shorter one.\n")):
        (d / f"d{i}.txt").write_text(text)
    return prepare(
        PrepareConfig(
            inputs=[str(d / "d0.txt"), str(d / "d1.txt")], out=d / "corpus", vocab_size=40, val_fraction=0.5, workers=1
        )
    ).out


def test_help_shows_defaults_and_the_old_flags(capsys):
    code, out, err = gpt1(["inspect", "--help"], capsys, env={"COLUMNS": "200"})
    assert code == 0, out + err
    assert "[default: 64]" in out and "--sample-tokens" in out and "--no-verify" in out
    assert "DIRECTORY" in out.upper()


def test_inspect_prints_summary_sample_and_verification(corpus, capsys):
    with pytest.raises(SystemExit) as e:
        main(["inspect", str(corpus)])
    text = capsys.readouterr().out
    assert e.value.code == 0
    assert "bytes/token" in text and "learned here" in text and "all 2 shard checksums match" in text
    assert "tokens of the first val document" in text
    with pytest.raises(SystemExit) as e:
        main(["inspect", str(corpus), "--sample-tokens", "0", "--no-verify"])
    text = capsys.readouterr().out
    assert e.value.code == 0 and "first val document" not in text and "checksums" not in text


def test_missing_directory_argument_is_a_usage_error(capsys):
    assert gpt1(["inspect"], capsys).code == 2
