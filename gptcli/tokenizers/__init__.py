"""Tokenizers behind one interface: the learned sentencepiece BPE and the original OpenAI BPE.

Both run the same pipeline (ftfy + released standardization → spaCy words → lowercase → BPE) and append the
three fine-tuning tokens (start, delimiter, extract) right after their vocabulary.
"""

from gptcli.tokenizers.base import SPECIAL_TOKENS, Tokenizer, load_tokenizer, register_tokenizer

__all__ = ["SPECIAL_TOKENS", "Tokenizer", "load_tokenizer", "register_tokenizer"]
