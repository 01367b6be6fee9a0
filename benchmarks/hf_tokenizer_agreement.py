"""How often the Hugging Face tokenizer ``gpt1 convert --to hf`` writes gives exactly gpt1's ids (docs/convert.md).

For the original BPE and for a sentencepiece BPE learned by ``gpt1 prepare``'s trainer on the books, export a tiny
checkpoint, load its tokenizer with ``transformers.AutoTokenizer`` (no remote code) and compare ids with gpt1's own
tokenizer on a random sample of real texts: WikiText-2 valid lines, paragraphs of the books, GLUE sentences.

    PYTHONPATH=. python3 benchmarks/hf_tokenizer_agreement.py --data ../shared/data --n 2000 --vocab 8000
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

GLUE = (
    ("SST-2/dev.tsv", (0,), 1),
    ("RTE/dev.tsv", (1, 2), 1),
    ("CoLA/dev.tsv", (3,), 0),
    ("MRPC/dev.tsv", (3, 4), 1),
    ("STS-B/dev.tsv", (7, 8), 1),
)


def texts(data: Path) -> dict[str, list[str]]:
    """Every candidate text of the three sources."""
    from gptcli.tokenizers.text import strip_gutenberg

    wiki = [x for x in (data / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8").split("\n") if x.strip()]
    books = []
    for p in sorted((data / "books").glob("*.txt")):
        body = strip_gutenberg(p.read_text(encoding="utf-8-sig"))[0].replace("\r\n", "\n")
        books += [x.strip() for x in body.split("\n\n") if x.strip()]
    glue = []
    for name, cols, header in GLUE:
        for line in (data / "glue" / name).read_text(encoding="utf-8-sig").split("\n")[header:]:
            cells = line.split("\t")
            glue += [cells[i] for i in cols if len(cells) > max(cols) and cells[i].strip()]
    return {"WikiText-2 valid lines": wiki, "book paragraphs": books, "GLUE sentences": glue}


def tokenizers(data: Path, vocab: int, books: int):
    """(name, gpt1 tokenizer) pairs: the original BPE, and a BPE learned on the first ``books`` books."""
    from gptcli.tokenizers.learned import LearnedBPETokenizer
    from gptcli.tokenizers.openai import OpenAIBPETokenizer
    from gptcli.tokenizers.text import strip_gutenberg, word_lines

    lines = []
    for p in sorted((data / "books").glob("*.txt"))[:books]:
        lines += word_lines(strip_gutenberg(p.read_text(encoding="utf-8-sig"))[0])
    yield "original BPE (40,478)", OpenAIBPETokenizer.from_dir(data / "openai-gpt-bpe")
    yield f"learned BPE ({vocab:,}, {books} books)", LearnedBPETokenizer.train(lines, vocab_size=vocab, seed=0)


def exported(tok, where: Path):
    """``tok`` through ``gpt1 convert --to hf`` (a tiny model), loaded back with AutoTokenizer."""
    from transformers import AutoTokenizer

    from gptcli.checkpoint import save_checkpoint
    from gptcli.interop.convert import to_hf
    from gptcli.model.gpt import GPT, ModelConfig

    save_checkpoint(
        where / "ck",
        GPT(ModelConfig(vocab_size=tok.vocab_size, n_ctx=32, n_embd=16, n_layer=1, n_head=1, n_inner=64)),
        tok,
    )
    return AutoTokenizer.from_pretrained(to_hf(where / "ck", where / "hf")[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--n", type=int, default=2000, help="texts sampled per source")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--books", type=int, default=8, help="books the learned BPE is trained on")
    args = ap.parse_args()
    rng = random.Random(0)
    sample = {k: rng.sample(v, min(args.n, len(v))) for k, v in texts(args.data).items()}
    print("| tokenizer | " + " | ".join(sample) + " |\n|---|" + "---|" * len(sample))
    for name, tok in tokenizers(args.data, args.vocab, args.books):
        with tempfile.TemporaryDirectory() as tmp:
            hf = exported(tok, Path(tmp))
            cells = []
            for items in sample.values():
                ours = tok.encode_batch(items)
                same = sum(a == hf.encode(t, add_special_tokens=False) for a, t in zip(ours, items))
                cells.append(f"{100 * same / len(items):.1f} % ({same}/{len(items)})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
