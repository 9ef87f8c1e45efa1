"""Byte-level byte-pair encoding (BPE), written out so you can watch it work (Chapter 9).

GPT-2's tokenizer (Radford et al., 2019, section 2.2) runs BPE (Sennrich et al.,
2016) on **bytes**: the 256 byte values are the initial vocabulary, so any text
can be encoded and nothing is ever "unknown". Training repeatedly finds the most
frequent adjacent pair of tokens and replaces it by a new token; encoding
replays those merges in the order they were learned.

Text is first cut into "words" by a regular expression (GPT-2's pattern,
:data:`GPT2_SPLIT_PATTERN`), and pairs are never counted across words: a
merge can join ``" t"`` and ``"he"`` but never the end of one word and the
start of the next.

Ids: ``0..255`` are the raw bytes; merge number ``r`` (0-based) makes id
``256 + r`` (unless its byte string already exists; see :func:`train_bpe`).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import regex

__all__ = [
    "GPT2_SPLIT_PATTERN", "bytes_to_unicode", "pretokenize", "pair_counts", "merge_pair",
    "MergeStep", "ByteBPE", "train_bpe",
]

# GPT-2's pre-tokenizer (openai/gpt-2, src/encoder.py; also HF's ByteLevel pre-tokenizer):
# contractions, letters with an optional leading space, digits, other symbols, whitespace.
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable Unicode character (space -> 'Ġ', newline -> 'Ċ').

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to code
    points 256 and up, in byte order. It only makes byte strings printable
    (HF stores vocabularies with it); it changes no merge.
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def pretokenize(text: str, pattern: str = GPT2_SPLIT_PATTERN) -> list[str]:
    """Cut ``text`` into the words BPE works inside (GPT-2's regular expression by default)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return regex.findall(pattern, text)


def pair_counts(words: dict[tuple[int, ...], int]) -> Counter:
    """Count adjacent id pairs over ``{word (tuple of ids): frequency}``: the statistic BPE maximises."""
    counts: Counter = Counter()
    for word, freq in words.items():
        for pair in zip(word, word[1:]):
            counts[pair] += freq
    return counts


def merge_pair(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``ids`` by ``new_id``, left to right, without overlaps.

    >>> merge_pair([5, 5, 5, 6], (5, 5), 9)
    [9, 5, 6]
    """
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


@dataclass(frozen=True)
class MergeStep:
    """One learned merge: ``left + right -> new_id``, chosen because the pair occurred ``count`` times."""

    rank: int  # order in which the merge was learned (0 = first)
    pair: tuple[int, int]  # the two ids joined
    new_id: int  # the id of the joined token
    count: int  # frequency of the pair when it was chosen
    token: bytes  # the bytes of the new token


class ByteBPE:
    """A trained byte-level BPE tokenizer: ``encode``, ``decode`` and the learned :attr:`merges`."""

    def __init__(self, merges: Sequence[MergeStep], pattern: str = GPT2_SPLIT_PATTERN) -> None:
        self.merges = list(merges)
        self.pattern = pattern
        self.vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
        self.ranks: dict[tuple[int, int], int] = {}
        for m in self.merges:
            if m.pair[0] not in self.vocab or m.pair[1] not in self.vocab:
                raise ValueError(f"merge {m.rank} joins an unknown id: {m.pair}")
            self.vocab[m.new_id] = self.vocab[m.pair[0]] + self.vocab[m.pair[1]]
            self.ranks[m.pair] = m.rank
        self._by_rank = {m.rank: m for m in self.merges}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode_word(self, word: str, return_steps: bool = False) -> list[int] | tuple[list[int], list[list[int]]]:
        """Encode one pre-tokenized word: apply the earliest-learned applicable merge until none applies.

        With ``return_steps`` also return the id list after each merge (first entry: the raw bytes).
        """
        ids = list(word.encode("utf-8"))
        steps = [ids]
        while len(ids) >= 2:
            pair = min(zip(ids, ids[1:]), key=lambda p: self.ranks.get(p, float("inf")))
            if pair not in self.ranks:
                break
            ids = merge_pair(ids, pair, self._by_rank[self.ranks[pair]].new_id)
            steps.append(ids)
        return (ids, steps) if return_steps else ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``: pre-tokenize, then encode each word."""
        return [i for word in pretokenize(text, self.pattern) for i in self.encode_word(word)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (bytes that do not form valid UTF-8 become U+FFFD)."""
        unknown = [i for i in ids if int(i) not in self.vocab]
        if unknown:
            raise ValueError(f"ids not in the vocabulary (size {self.vocab_size}): {unknown[:5]}")
        return b"".join(self.vocab[int(i)] for i in ids).decode("utf-8", errors="replace")

    def tokens(self, text: str) -> list[str]:
        """The tokens of ``text`` as readable strings (for display)."""
        return [self.vocab[i].decode("utf-8", errors="replace") for i in self.encode(text)]


TieBreak = Literal["lowest_ids", "hf"]


def _tie_key(tie_break: TieBreak) -> Callable[[tuple[int, int]], tuple[int, int]]:
    """Order among pairs of equal count: the smallest key wins."""
    if tie_break == "lowest_ids":
        return lambda pair: pair
    if tie_break == "hf":
        # HF's BpeTrainer prefers the pair with the smallest *HF ids*; its base ids are the 256
        # bytes sorted by their printable stand-in (bytes_to_unicode), not by byte value.
        order = sorted(range(256), key=lambda b: bytes_to_unicode()[b])
        hf_id = {b: i for i, b in enumerate(order)}
        return lambda pair: (hf_id.get(pair[0], pair[0]), hf_id.get(pair[1], pair[1]))
    raise ValueError(f"tie_break must be 'lowest_ids' or 'hf', got {tie_break!r}")


def train_bpe(
    text: str,
    vocab_size: int,
    *,
    pattern: str = GPT2_SPLIT_PATTERN,
    min_frequency: int = 1,
    tie_break: TieBreak = "lowest_ids",
) -> ByteBPE:
    """Learn byte-level BPE merges from ``text`` until the vocabulary holds ``vocab_size`` tokens.

    Each step joins the most frequent adjacent pair (counted inside words, weighted
    by word frequency); among pairs of equal count the one with the smallest ids
    wins (``tie_break="hf"``: smallest ids in Hugging Face's numbering). Training
    stops early when the best pair occurs fewer than ``min_frequency`` times.

    If a merge produces a byte string already in the vocabulary (``"a"+"bc"`` after
    ``"ab"+"c"``), it reuses that id, as Hugging Face's trainer does.

    Pair counts are updated incrementally: after a merge only the words that
    contained the pair are recounted, and a lazy max-heap finds the next best pair.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 256:
        raise ValueError(f"vocab_size must be an int >= 256 (the byte alphabet), got {vocab_size!r}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
    key = _tie_key(tie_break)
    word_freq = Counter(pretokenize(text, pattern))
    words = [list(w.encode("utf-8")) for w in word_freq]  # each word as a list of ids
    freqs = list(word_freq.values())
    counts: Counter = Counter()
    where: dict[tuple[int, int], set[int]] = {}  # pair -> indices of words that (may) contain it
    for wi, (w, f) in enumerate(zip(words, freqs)):
        for pair in zip(w, w[1:]):
            counts[pair] += f
            where.setdefault(pair, set()).add(wi)
    heap = [(-c, key(p), p) for p, c in counts.items()]
    heapq.heapify(heap)
    vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
    by_bytes = {b: i for i, b in vocab.items()}
    merges: list[MergeStep] = []
    while len(vocab) < vocab_size and heap:
        neg, _, pair = heapq.heappop(heap)
        current = counts.get(pair, 0)
        if current != -neg:  # stale entry: its count went down since it was pushed
            if current > 0:
                heapq.heappush(heap, (-current, key(pair), pair))
            continue
        if current < min_frequency:
            break
        token = vocab[pair[0]] + vocab[pair[1]]
        new_id = by_bytes.get(token, len(vocab))
        vocab[new_id], by_bytes[token] = token, new_id
        merges.append(MergeStep(len(merges), pair, new_id, current, token))
        touched: set[tuple[int, int]] = set()
        for wi in where.pop(pair, ()):
            w, f = words[wi], freqs[wi]
            merged = merge_pair(w, pair, new_id)
            if len(merged) == len(w):  # the word no longer contains the pair
                continue
            for p in zip(w, w[1:]):
                counts[p] -= f
            for p in zip(merged, merged[1:]):
                counts[p] += f
                where.setdefault(p, set()).add(wi)
                touched.add(p)
            words[wi] = merged
        counts.pop(pair, None)
        for p in touched:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], key(p), p))
    return ByteBPE(merges, pattern)
