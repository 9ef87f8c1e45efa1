"""Tokenizers written from scratch (Chapter 9: byte-level BPE).

The package is called ``tokenizers`` inside ``companion`` (``companion.tokenizers``);
never name a module ``tokenize``, which would shadow the standard library.
"""

from .bpe import ByteBPE, MergeStep, bytes_to_unicode, merge_pair, pair_counts, pretokenize, train_bpe

__all__ = ["ByteBPE", "MergeStep", "bytes_to_unicode", "merge_pair", "pair_counts", "pretokenize", "train_bpe"]
