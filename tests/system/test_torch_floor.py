"""gptcli/system/torch_floor.py: an installed torch older than gpt1's floor is named before a command runs."""

from __future__ import annotations

from importlib import metadata

import pytest

from gptcli import cli
from gptcli.errors import GPT1Error
from gptcli.system import torch_floor


def test_releases_compare_by_their_numbers_whatever_the_build() -> None:
    assert torch_floor.release("2.6.0+cu124") == (2, 6, 0)
    assert torch_floor.release("2.10") == (2, 10, 0)
    assert torch_floor.release("2.6.0a0+ecf3bae40a") == (2, 6, 0)  # NVIDIA's containers: their release's branch
    assert torch_floor.release("2.10.0") > torch_floor.release("2.9.1")  # numbers, not strings
    with pytest.raises(ValueError):
        torch_floor.release("nightly")


def test_the_floor_is_read_from_the_requirements() -> None:
    assert torch_floor.torch_floor(["typer>=0.12", "torch>=2.6", "rich>=13.0"]) == "2.6"
    assert torch_floor.torch_floor(["torch >= 2.6.1 ; python_version >= '3.10'"]) == "2.6.1"
    assert torch_floor.torch_floor(["torch<3,>=2.7"]) == "2.7"  # metadata may list a range in another order
    assert torch_floor.torch_floor(["torchvision>=0.20", "typer", "torch"]) is None
    assert torch_floor.torch_floor(None) is None


def test_the_installed_package_states_the_floor_the_suite_verified() -> None:
    """pyproject's floor as installed: the one this module enforces (2.4.1 failed every training command)."""
    try:
        floor = torch_floor.torch_floor(metadata.requires("gpt1"))
    except metadata.PackageNotFoundError:
        pytest.skip("gpt1 is not installed (a bare source checkout has no metadata)")
    assert floor is not None and torch_floor.release(floor) >= (2, 6, 0)
    assert torch_floor.release(metadata.version("torch")) >= torch_floor.release(floor)


def test_an_older_torch_is_refused_and_a_newer_one_passes() -> None:
    with pytest.raises(GPT1Error) as e:
        torch_floor.check_torch(installed="2.4.1+cu121", floor="2.6")
    assert str(e.value).startswith("PyTorch 2.4.1+cu121 is installed; gpt1 needs torch>=2.6 (upgrade it:")
    torch_floor.check_torch(installed="2.6.0+cpu", floor="2.6")
    torch_floor.check_torch(installed="2.13.0", floor="2.6")
    torch_floor.check_torch(installed="nightly", floor="2.6")  # unreadable: not checked, never a traceback


def test_a_command_on_an_older_torch_is_one_error_line_but_help_still_shows(monkeypatch, capsys) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "2.4.1+cu121" if name == "torch" else real(name))
    monkeypatch.setattr(metadata, "requires", lambda name: ["torch>=2.6"])
    with pytest.raises(SystemExit) as e:
        cli.main(["inspect", "somewhere"])
    assert e.value.code != 0
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("error: PyTorch 2.4.1+cu121 is installed; gpt1 needs torch>=2.6")
    assert "Traceback" not in err
    for argv in (["--help"], ["--version"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 0


def test_the_library_refuses_an_older_torch_before_training(monkeypatch) -> None:
    """A Python user who never runs the CLI gets the same error from the Trainer both trainers use, not an
    AttributeError at the first update's clipping."""
    import torch

    from gptcli.train.trainer import Trainer

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "2.4.1" if name == "torch" else real(name))
    monkeypatch.setattr(metadata, "requires", lambda name: ["torch>=2.6"])
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    args = (model, optimizer, lambda m, b: m(b).sum(), lambda step: 0.1)
    with pytest.raises(GPT1Error, match=r"^PyTorch 2\.4\.1 is installed; gpt1 needs torch>=2\.6"):
        Trainer(*args, device=torch.device("cpu"))
    monkeypatch.setattr(metadata, "version", real)
    Trainer(*args, device=torch.device("cpu"))  # the installed torch passes
