"""What gpt1 needs from the machine it runs on: the oldest PyTorch it supports (``torch_floor``), devices and
precision (``runtime``), glibc's allocator settings for training (``allocator``), and what running out of memory
looks like (``out_of_memory``).

Kept apart from the model and the loops so that a question about the host is answered in one place, once per process.
"""
