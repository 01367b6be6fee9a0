"""Other people's weights: OpenAI's released GPT-1 and Hugging Face ``openai-gpt`` checkpoints, in and out.

``hf.py`` maps parameter names and the Hugging Face config; ``convert.py`` runs a conversion into (or out of) the
checkpoint format of ``checkpoint.py``.
"""
