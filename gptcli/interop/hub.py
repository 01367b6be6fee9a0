"""Hugging Face Hub model ids as checkpoints: ``openai-gpt`` → a gpt1 checkpoint on disk, converted once.

Wherever gpt1 takes a checkpoint (``finetune --init``, ``zeroshot``/``eval``/``generate --checkpoint``,
``convert --from hf``) a Hub id works too, the way ``from_pretrained("openai-community/openai-gpt")`` works in
``transformers``::

    from gptcli.interop.hub import pretrained
    path = pretrained("openai-gpt")      # ~/.cache/gpt1/models/openai-community--openai-gpt/<commit>

The snapshot comes through ``huggingface_hub`` (its cache and environment variables shared with ``transformers``)
and is converted once per commit into an ordinary gpt1 checkpoint that records where it came from, so every command
reads one format and a cache anyone can write into cannot pass off another model as the named one.
:func:`pretrained` says how ids are read, downloaded, converted and checked.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import sha256_file, write_text_atomic
from gptcli.interop.convert import ConvertConfig, Converted, ConvertResult, convert_to_checkpoint, from_hf
from gptcli.progress import SILENT, Progress

DEFAULT_MODEL = "openai-gpt"
"""What the commands use when no checkpoint is given: OpenAI's released GPT-1, the paper's model."""
SHORT_NAMES = {"openai-gpt": "openai-community/openai-gpt"}
"""Short names → Hub ids (``openai-gpt`` moved to the ``openai-community`` organisation on the Hub)."""
MODELS_ENV = "GPT1_MODELS"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
FILES = ("config.json", "vocab.json", "merges.txt", "tokenizer_config.json")
"""What a conversion reads besides the weights (``tokenizer_config.json`` is small and documents the tokenizer)."""

# Hub repo names: letters, digits, -, _ and . (no leading separator); the revision is a branch, tag or commit.
_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w./-]+))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubId:
    """A model on the Hugging Face Hub: its repository and, when given, the revision (``None``: ``main``)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


@dataclass
class HubModel:
    """A Hub model as a local gpt1 checkpoint."""

    path: Path
    """The converted checkpoint (under :func:`models_root`)."""
    hub: HubId
    commit: str
    """The Hub commit the checkpoint was converted from."""
    cached: bool
    """True when it had been converted before: nothing was converted this time."""


def parse_hub_id(spec: str) -> HubId | None:
    """``spec`` as a Hub id (short names expanded), or None when it cannot be one."""
    name, at, rev = spec.partition("@")
    if name in SHORT_NAMES:
        name = SHORT_NAMES[name]
    m = _ID.fullmatch(name + (f"@{rev}" if at else ""))
    if m is None or "--" in m["repo"] or ".." in m["repo"]:
        return None
    return HubId(m["repo"], m["rev"])


def hub_id_of(spec: str | os.PathLike[str]) -> HubId | None:
    """The Hub id ``spec`` names, or None when it is (or must be) a local path: it exists, it starts with ``.``,
    ``/`` or ``~``, or its first part is an existing directory (``runs/x`` is a path even when ``x`` is missing)."""
    text = os.fspath(spec)
    if not text or text.startswith((".", "/", "~")) or Path(text).exists():
        return None
    first = text.split("/", 1)[0]
    if "/" in text and Path(first).is_dir():
        return None
    return parse_hub_id(text)


def models_root() -> Path:
    """Where converted Hub models live: ``$GPT1_MODELS``, else ``~/.cache/gpt1/models``."""
    env = os.environ.get(MODELS_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpt1" / "models"


def _repo_dir(hub: HubId) -> Path:
    """Everything converted from one Hub repository: a folder per commit, and ``refs/`` (revision → commit)."""
    return models_root() / hub.repo_id.replace("/", "--")


def model_dir(hub: HubId, commit: str) -> Path:
    """The converted checkpoint of ``hub`` at ``commit``."""
    return _repo_dir(hub) / commit


def resolve_checkpoint(
    spec: str | os.PathLike[str], *, progress: Progress | None = None
) -> tuple[str, HubModel | None]:
    """``spec`` as a local checkpoint path: itself when it is (or must be) a path, else the Hub model it names,
    converted once (:func:`fetch_model`). Returns the path and, for a Hub id, the :class:`HubModel`."""
    hub = hub_id_of(spec)
    if hub is None:
        return os.fspath(spec), None
    model = fetch_model(hub, progress=progress)
    return str(model.path), model


def pretrained(spec: str = DEFAULT_MODEL, *, progress: Progress | None = None) -> Path:
    """The local gpt1 checkpoint of Hub model ``spec`` (downloaded and converted on first use).

    **Ids.** ``owner/name`` or ``owner/name@revision`` (a branch, tag or commit) of an ``openai-gpt`` model, or a short
    name: ``openai-gpt`` is OpenAI's released GPT-1 (paper §3), ``openai-community/openai-gpt`` on the Hub. A local
    path that exists always wins over an id of the same spelling, and so does one whose first part is an existing
    local directory (``runs/pretrian``, a typo, is reported as a missing checkpoint, not looked up on the Hub).

    **Download.** Through ``huggingface_hub.snapshot_download`` with the files a conversion reads (``config.json``,
    ``model.safetensors`` — ``pytorch_model.bin`` only when there is none —, ``vocab.json``, ``merges.txt``), so the
    Hugging Face cache is shared with ``transformers`` and ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``,
    ``HF_ENDPOINT`` and ``HF_TOKEN`` behave as they do there. Online, each use asks the Hub which commit the revision
    is (as ``from_pretrained`` does); with ``HF_HUB_OFFLINE=1`` or no network the cached snapshot is used.

    **Conversion, once.** The snapshot is converted with :func:`gptcli.interop.convert.from_hf` (weights, and the
    original BPE tokenizer from ``vocab.json``/``merges.txt``) into an ordinary gpt1 checkpoint under
    :func:`models_root` (``$GPT1_MODELS``, else ``~/.cache/gpt1/models``), at ``<owner>--<name>/<commit>``: one folder
    per commit, written whole under a temporary name and renamed into place, under a file lock so that several
    processes (the ranks of a distributed run) convert it once. A later use of the same commit converts nothing
    (:attr:`HubModel.cached`). ``<owner>--<name>/refs/<revision>`` remembers the commit a revision had, so a converted
    model is found offline even when the Hugging Face cache was cleared. Delete the folder to reclaim the space.

    **Provenance.** A conversion records where it came from: the Hub id, the commit and the sha256 of every source
    file. A cached folder is presented as the named model only when that record names this id and commit and, when
    the snapshot is at hand, its files' checksums: anything else at that path (another model written there, an
    older conversion without the record) is converted again, or refused in one line offline — a cache anyone can
    write into must not pass off another model as, say, the paper's.
    """
    hub = parse_hub_id(spec)
    if hub is None:
        raise GPT1Error(
            f"{spec}: not a Hugging Face Hub model id (expected owner/name[@revision] or {', '.join(SHORT_NAMES)})"
        )
    return fetch_model(hub, progress=progress).path


def fetch_model(hub: HubId, *, progress: Progress | None = None) -> HubModel:
    """Download (or find in the Hugging Face cache) and convert ``hub`` once; see the module docstring."""
    report = progress or SILENT
    rev = hub.revision or "main"
    if hub.revision and _COMMIT.fullmatch(hub.revision):
        pinned = model_dir(hub, hub.revision)
        if _is_converted(pinned) and provenance_problem(pinned, hub, hub.revision) is None:
            return HubModel(pinned, hub, hub.revision, cached=True)  # immutable: no Hub call
    try:
        snapshot = download(hub)
    except GPT1Error:
        known = _remembered(hub, rev)  # offline and cleared from the Hugging Face cache, but converted before
        if known is None:
            raise
        target = model_dir(hub, known)
        problem = provenance_problem(target, hub, known)
        if problem is not None:
            raise GPT1Error(
                f"{target}: {problem}, so it is not used as {hub} (delete it, then run once with a network to "
                "convert the model again)"
            ) from None
        report.note(f"{hub}: the Hub cannot be asked; using the converted copy of commit {known[:8]}", level="warn")
        return HubModel(target, hub, known, cached=True)
    commit = snapshot.name
    target = model_dir(hub, commit)
    cached = _convert_once(hub, snapshot, target, report)
    _remember(hub, rev, commit)
    return HubModel(target, hub, commit, cached)


def source_files(snapshot: Path) -> dict[str, str]:
    """sha256 of each file of ``snapshot`` that a conversion reads: what a converted model records it came from."""
    return {name: sha256_file(snapshot / name) for name in (*FILES, *WEIGHTS) if (snapshot / name).is_file()}


def provenance_problem(path: Path, hub: HubId, commit: str, files: dict[str, str] | None = None) -> str | None:
    """Why the folder at ``path`` is not the conversion of ``hub`` at ``commit`` (None when it is): its record of
    where it came from names another model or commit, or (given the snapshot's ``files``, :func:`source_files`)
    other source files."""
    from gptcli.checkpoint import read_header

    try:
        source = read_header(path).meta.get("source")
    except GPT1Error:
        return "it is not a readable checkpoint"
    if not isinstance(source, dict) or source.get("hub") != hub.repo_id or source.get("commit") != commit:
        return f"it records no conversion of {hub.repo_id}@{commit[:8]}"
    if files is not None and source.get("files") != files:
        return f"its recorded source checksums do not match {hub.repo_id}@{commit[:8]}"
    return None


def _is_converted(path: Path) -> bool:
    return (path / "config.json").is_file()


def _remembered(hub: HubId, rev: str) -> str | None:
    ref = _repo_dir(hub) / "refs" / rev
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return commit if _COMMIT.fullmatch(commit) and _is_converted(model_dir(hub, commit)) else None


def _remember(hub: HubId, rev: str, commit: str) -> None:
    ref = _repo_dir(hub) / "refs" / rev
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(ref, commit)
    except OSError:  # a convenience for offline use later; never a reason to fail now
        pass


def _convert_once(hub: HubId, snapshot: Path, target: Path, report: Progress) -> bool:
    """Convert ``snapshot`` into ``target`` unless its conversion is there; True when it was (nothing converted).
    A folder there that is not that conversion is replaced (or, when it is not a checkpoint, refused). The source
    files are hashed once, for the check and the record alike."""
    files = source_files(snapshot)
    if _is_converted(target) and provenance_problem(target, hub, target.name, files) is None:
        return True
    from gptcli.files.locks import output_lock

    with output_lock(target, wait=True):  # a shared cache: wait for another process converting the same model
        problem = provenance_problem(target, hub, target.name, files) if _is_converted(target) else None
        if _is_converted(target) and problem is None:  # another process converted it while this one waited
            return True
        if problem is not None:
            report.note(f"{target}: {problem}; converting the model again", level="warn")
        report.note(f"converting {hub.repo_id}@{target.name[:8]} into a gpt1 checkpoint (once): {target}")
        convert_to_checkpoint(_converted(hub, snapshot, target.name, files), target)
    return False


def _converted(hub: HubId, snapshot: Path, commit: str, files: dict[str, str] | None = None) -> Converted:
    converted = from_hf(snapshot)
    converted.meta["source"] = {
        "format": "hf",
        "hub": hub.repo_id,
        "revision": hub.revision or "main",
        "commit": commit,
        "resolved": str(snapshot),
        "files": source_files(snapshot) if files is None else files,
    }
    return converted


def convert_from_hub(cfg: ConvertConfig, hub: HubId) -> ConvertResult:
    """``gpt1 convert --from hf ID --out DIR``: the Hub model's files converted into ``cfg.out`` (checked by
    ``cfg.check()`` first)."""
    cfg.check()
    assert cfg.out is not None
    snapshot = download(hub)
    converted = _converted(hub, snapshot, snapshot.name)
    path = convert_to_checkpoint(converted, cfg.out)
    return ConvertResult(path, "gpt1", converted.warnings, converted.model.config, converted.model.num_params())


# ------------------------------------------------------------------------------------------------- download
def download(hub: HubId) -> Path:
    """The snapshot folder of model ``hub`` in the Hugging Face cache holding :data:`FILES` and the weights
    (fetched when missing or out of date); its name is the commit. Failures are one-line :class:`GPT1Error`\\ s."""
    snapshot = hub_snapshot(hub.repo_id, [*FILES, WEIGHTS[0]], revision=hub.revision)
    if not (snapshot / WEIGHTS[0]).is_file():  # an older upload: the pickled weights (read without unpickling)
        snapshot = hub_snapshot(hub.repo_id, [WEIGHTS[1]], revision=hub.revision)
    return snapshot


def hub_snapshot(repo_id: str, patterns: list[str], *, revision: str | None = None, repo_type: str = "model") -> Path:
    """``huggingface_hub.snapshot_download`` of the files matching ``patterns`` (models and datasets alike), with
    every Hub failure turned into one line that says what to do."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise GPT1Error(
            f"{repo_id}: reading from the Hugging Face Hub needs the package huggingface_hub "
            "(pip install huggingface_hub)"
        ) from None
    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, revision=revision, allow_patterns=patterns))
    except Exception as e:  # noqa: BLE001 - every Hub failure becomes one line naming what to do
        raise _hub_error(repo_id, revision, repo_type, e) from None


def hf_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set, as huggingface_hub read it."""
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover
        return False
    return bool(constants.HF_HUB_OFFLINE)


def _hub_error(repo_id: str, revision: str | None, repo_type: str, e: BaseException) -> GPT1Error:
    """What a Hub failure means for the user, in one line."""
    names = {c.__name__ for c in type(e).__mro__}
    cause = (str(e).strip().splitlines() or [""])[0][:200]
    spec = repo_id + (f"@{revision}" if revision else "")
    local = "pass a local checkpoint directory" if repo_type == "model" else "get the official distribution"
    if "LocalEntryNotFoundError" in names and hf_offline():
        return GPT1Error(
            f"{repo_id} is not in the Hugging Face cache and HF_HUB_OFFLINE is set (run once with a "
            f"network to download it, or unset HF_HUB_OFFLINE; or {local})"
        )
    if "LocalEntryNotFoundError" in names:
        return GPT1Error(
            f"{spec}: the Hugging Face Hub could not be reached and it is not in the Hugging Face cache "
            f"({cause}) (check the network, a proxy or HF_ENDPOINT; or {local})"
        )
    if "RevisionNotFoundError" in names:
        return GPT1Error(f"{spec}: the Hugging Face Hub has no revision {revision!r} of {repo_id}")
    if "GatedRepoError" in names:
        return GPT1Error(
            f"{repo_id} is gated on the Hugging Face Hub: accept its terms on its page, then log in "
            "(`hf auth login`, or set HF_TOKEN)"
        )
    if "RepositoryNotFoundError" in names:
        return GPT1Error(
            f"{spec}: no such local path, and no {repo_type} {repo_id} on the Hugging Face Hub (a "
            "private one needs `hf auth login` or HF_TOKEN)"
        )
    if "HFValidationError" in names:
        return GPT1Error(f"{spec}: not a local path, nor a valid Hugging Face Hub id ({cause})")
    return GPT1Error(f"{spec}: download from the Hugging Face Hub failed ({type(e).__name__}: {cause})")


def describe(model: HubModel) -> str:
    """``openai-community/openai-gpt@1a2b3c4d (cached: PATH)`` — how the commands say which model they used."""
    how = "cached" if model.cached else "converted"
    return f"{model.hub.repo_id}@{model.commit[:8]} ({how}: {model.path})"


__all__ = [
    "DEFAULT_MODEL",
    "SHORT_NAMES",
    "HubId",
    "HubModel",
    "convert_from_hub",
    "describe",
    "download",
    "fetch_model",
    "hf_offline",
    "hub_id_of",
    "hub_snapshot",
    "models_root",
    "parse_hub_id",
    "pretrained",
    "provenance_problem",
    "resolve_checkpoint",
    "source_files",
]
