"""Tokenizers written from scratch (Chapter 9: byte-level BPE; Chapter 7: WordPiece;
Chapter 11: Unigram encoding, trained with sentencepiece).

The package is called ``tokenizers`` inside ``companion`` (``companion.tokenizers``);
never name a module ``tokenize``, which would shadow the standard library.
"""

from .bpe import ByteBPE, MergeStep, bytes_to_unicode, merge_pair, pair_counts, pretokenize, train_bpe
from .wordpiece import (
    BERT_SPECIAL_TOKENS, WordPiece, WordPieceStep, bert_normalize, bert_pretokenize, train_wordpiece,
    wordpiece_encode_word,
)
from .unigram import UnigramTokenizer, load_course_unigram, train_unigram

__all__ = [
    "ByteBPE", "MergeStep", "bytes_to_unicode", "merge_pair", "pair_counts", "pretokenize", "train_bpe",
    "BERT_SPECIAL_TOKENS", "WordPiece", "WordPieceStep", "bert_normalize", "bert_pretokenize", "train_wordpiece",
    "wordpiece_encode_word",
    "UnigramTokenizer", "load_course_unigram", "train_unigram",
]
