"""A local stand-in for the Hugging Face Hub: repositories written straight into the Hugging Face cache layout
(``models--owner--name/{refs/main, snapshots/<commit>/…}``, ``datasets--owner--name/…``), read by huggingface_hub
with ``HF_HUB_OFFLINE`` set — exactly what it does for a user whose cache already holds them. Nothing is downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

MODEL_COMMIT = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"
DATASET_COMMIT = "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"
VOCAB = 40478  # the released BPE's token count


def use_cache(monkeypatch, cache: Path) -> None:
    """Point huggingface_hub at ``cache`` (HF_HUB_CACHE) and keep it offline, for this test."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def snapshot_dir(cache: Path, repo_id: str, commit: str, repo_type: str = "model") -> Path:
    """Create ``refs/main`` → ``commit`` and return the (empty) snapshot folder to fill."""
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    return snap


def write_gpt1_repo(
    cache: Path,
    bpe_dir: Path,
    repo_id: str = "openai-community/openai-gpt",
    commit: str = MODEL_COMMIT,
    n_positions: int = 128,
) -> Path:
    """A small random ``OpenAIGPTLMHeadModel`` (the real 40,478-token vocabulary, 2 layers × 32 dims) saved by
    transformers itself, with the released BPE files as ``vocab.json``/``merges.txt``; returns its snapshot."""
    import torch
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    snap = snapshot_dir(cache, repo_id, commit)
    torch.manual_seed(1234)
    config = OpenAIGPTConfig(vocab_size=VOCAB, n_positions=n_positions, n_embd=32, n_layer=2, n_head=2)
    OpenAIGPTLMHeadModel(config).save_pretrained(snap, safe_serialization=True)
    shutil.copyfile(bpe_dir / "encoder_bpe_40000.json", snap / "vocab.json")
    shutil.copyfile(bpe_dir / "vocab_40000.bpe", snap / "merges.txt")
    return snap


def write_dataset_repo(cache: Path, repo_id: str, tables: dict[str, object], commit: str = DATASET_COMMIT) -> Path:
    """A dataset repository: ``tables`` maps a repo path (``rte/train-00000-of-00001.parquet``) to a pyarrow Table."""
    import pyarrow.parquet as pq

    snap = snapshot_dir(cache, repo_id, commit, "dataset")
    for rel, table in tables.items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, snap / rel)
    return snap


def glue_rows(path: Path, text_columns: dict[str, str], labels: tuple[str, ...] | None) -> list[dict]:
    """A real GLUE TSV's rows as the Hub has them: the Hub's column names, int labels, ``idx`` (the ``index``
    column when the file has one, else the row number)."""
    lines = path.read_text(encoding="utf-8-sig").split("\n")
    header = lines[0].split("\t")
    col = {c: i for i, c in enumerate(header)}
    rows = []
    for k, line in enumerate(x for x in lines[1:] if x):
        cells = line.split("\t")
        row = {hub: cells[col[official]] for official, hub in text_columns.items()}
        if labels is not None:
            label = cells[col["label"]] if "label" in col else None
            row["label"] = labels.index(label) if label is not None else -1
        row["idx"] = int(cells[col["index"]]) if "index" in col else k
        rows.append(row)
    return rows


def table(rows: list[dict]):
    """Rows as a pyarrow Table with the Hub's types (int64 labels, int32 idx)."""
    import pyarrow as pa

    columns = {name: [r[name] for r in rows] for name in rows[0]}
    types = {"label": pa.int64(), "idx": pa.int32()}
    return pa.table({n: pa.array(v, type=types.get(n, pa.string())) for n, v in columns.items()})


RTE_LABELS = ("entailment", "not_entailment")  # the Hub's class ids for RTE
PAIR = {"sentence1": "sentence1", "sentence2": "sentence2"}


def _test_split(rows: list[dict], n: int, texts: tuple[str, ...]) -> list[dict]:
    """An unlabeled test split of ``n`` rows made of ``rows``' texts (label -1, as the Hub stores test labels)."""
    return [{**{t: rows[i % len(rows)][t] for t in texts}, "label": -1, "idx": i} for i in range(n)]


def glue_tables(glue: Path, rte_dev_rows: int | None = None, sst2: bool = True) -> dict[str, object]:
    """``nyu-mll/glue``'s RTE (and SST-2) parquet files made from the real GLUE files in ``glue``; the test splits,
    which ../shared lacks, are unlabeled stand-ins of the official size. ``rte_dev_rows`` cuts RTE's dev short."""
    rte_train = glue_rows(glue / "RTE" / "train.tsv", PAIR, RTE_LABELS)
    rte_dev = glue_rows(glue / "RTE" / "dev.tsv", PAIR, RTE_LABELS)[:rte_dev_rows]
    tables = {
        "rte/train-00000-of-00001.parquet": table(rte_train),
        "rte/validation-00000-of-00001.parquet": table(rte_dev),
        "rte/test-00000-of-00001.parquet": table(_test_split(rte_train, 3000, ("sentence1", "sentence2"))),
    }
    if sst2:
        sst_train = glue_rows(glue / "SST-2" / "train.tsv", {"sentence": "sentence"}, ("0", "1"))
        sst_dev = glue_rows(glue / "SST-2" / "dev.tsv", {"sentence": "sentence"}, ("0", "1"))
        tables.update(
            {
                "sst2/train-00000-of-00001.parquet": table(sst_train),
                "sst2/validation-00000-of-00001.parquet": table(sst_dev),
                "sst2/test-00000-of-00001.parquet": table(_test_split(sst_train, 1821, ("sentence",))),
            }
        )
    return tables
