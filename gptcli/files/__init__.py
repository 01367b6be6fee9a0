"""What gpt1 does with files: atomic writes and moves (``fsutil``), which outputs gpt1 may replace (``outputs``), and
one run per output folder (``locks``).

They share a floor because every room that writes anything uses them, and keeping them together puts the rules about
the user's files — never half-written, never destroyed unasked — in one place.
"""
