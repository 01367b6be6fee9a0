"""Shared test fixtures: the real data in ../shared and small helpers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# No test downloads anything: a Hugging Face Hub id resolves from the Hugging Face cache or fails with the offline
# line (the Hub stand-ins of tests/interop/test_hub.py and tests/interop/test_datasets.py point the cache at their own
# folders). Set before any test imports huggingface_hub, which reads it once.
os.environ["HF_HUB_OFFLINE"] = "1"

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GPT1_SHARED", REPO.parent / "shared"))
DATA = SHARED / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (real benchmark files); tests that need it skip with a reason when it is absent."""
    if not DATA.is_dir():
        pytest.skip(f"real data not found at {DATA} (set GPT1_SHARED)")
    return DATA


def _folder_state(cwd: Path) -> dict[str, tuple[int, int]]:
    """The entries of ``cwd`` (by name: the system's temporary folder, which every process writes in, not at all)
    and those of the folders gpt1 writes in by default, runs/ and corpus/ (with inode and mtime)."""
    state: dict[str, tuple[int, int]] = {}
    top = [] if cwd == Path(tempfile.gettempdir()).resolve() else [cwd]
    for d, stat in [*((d, False) for d in top), (cwd / "runs", True), (cwd / "corpus", True)]:
        try:
            entries = list(d.iterdir())
        except OSError:
            continue
        for p in entries:
            try:
                st = p.lstat()
            except OSError:
                continue
            state[str(p.relative_to(cwd))] = (st.st_ino, st.st_mtime_ns) if stat else (0, 0)
    return state


@pytest.fixture(autouse=True)
def _hermetic_cwd():
    """No test writes in the folder pytest runs from (a user's checkout may hold a quickstart's runs/ and corpus/,
    which a test must neither change nor depend on): every output goes under ``tmp_path``; a test of the default
    ./corpus or runs/… runs in ``monkeypatch.chdir(tmp_path)``."""
    cwd = Path.cwd().resolve()
    before = _folder_state(cwd)
    yield
    after = _folder_state(cwd)
    changed = sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))
    if changed:
        pytest.fail(f"the test changed {', '.join(changed)} in the current folder {cwd} (write under tmp_path)")


@pytest.fixture(autouse=True)
def _deterministic_torch():
    """Keep torch to the cores CI has and make every test start from the same RNG state."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        yield
        return
    torch.manual_seed(0)
    yield


MODEL_TESTS = REPO / "tests" / "model"
"""The model's own tests: the reference model's compile nothing, the kernels' build the library when they use it."""


@pytest.fixture(scope="session")
def compiled_kernels():
    """The compiled CPU kernels, built (or loaded) once."""
    from gptcli.model.kernels import native

    return native.library()


@pytest.fixture(autouse=True)
def _compiled_kernels_built_before_runs(request):
    """Outside tests/model, build the compiled kernels before the test: a run under ``--kernels auto`` reports their
    first build as a progress stage of its own (``gptcli.model.kernels.prepare``), so without this, which test ran
    first would change what a run reports."""
    if MODEL_TESTS not in Path(request.node.path).parents:
        request.getfixturevalue("compiled_kernels")
    yield


@pytest.fixture(autouse=True)
def _kernels_follow_the_environment():
    """A test may choose the kernel mode for the process (``set_kernels``; a run gives the caller's back itself) or
    force a form (``force_amx``, ``force_onednn_fp32``); the next test starts without it, following $GPT1_KERNELS
    and the CPU's flags as code outside a run does."""
    import sys

    yield
    kernels = sys.modules.get("gptcli.model.kernels")
    if kernels is not None:
        kernels.set_kernels(None)
        kernels.force_amx(None)
        kernels.force_onednn_fp32(None)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one torch thread. With 2 threads on a busy 2-core machine, small ops spin-wait (measured 25×
    slower); opt in per module with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A 'pretrained' tiny LM checkpoint (random weights) carrying the toy tokenizer (tests/helpers/toy_model.py)."""
    from toy_model import save_tiny_pretrained

    return save_tiny_pretrained(tmp_path_factory.mktemp("pre"))


@pytest.fixture(autouse=True)
def _encoding_cache(tmp_path_factory, monkeypatch):
    """Fine-tuning caches encoded examples under $GPT1_CACHE (default ~/.cache/gpt1/encoded): every test gets its
    own empty folder, so no test writes to the real home or sees another test's entries."""
    monkeypatch.setenv("GPT1_CACHE", str(tmp_path_factory.mktemp("gpt1-cache")))


@pytest.fixture(autouse=True)
def _hub_offline(tmp_path_factory, monkeypatch):
    """Hub models are converted into $GPT1_MODELS (default ~/.cache/gpt1/models): every test gets its own empty
    folder; and huggingface_hub stays offline even if something imported it before this file set HF_HUB_OFFLINE."""
    import sys

    monkeypatch.setenv("GPT1_MODELS", str(tmp_path_factory.mktemp("gpt1-models")))
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
