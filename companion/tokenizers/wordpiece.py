"""WordPiece, BERT's tokenizer, written out so you can watch it work (Chapter 7).

Three stages turn text into ids:

1. **Normalize** like BERT's basic tokenizer (Hugging Face ``BertNormalizer``):
   remove NUL, U+FFFD and control characters, turn every whitespace into a
   space, put spaces around CJK ideographs (each becomes its own word), strip
   accents (NFD, then drop the non-spacing marks) and lower-case.
2. **Pre-tokenize** (``BertPreTokenizer``): split on whitespace and cut every
   punctuation character out as its own word.
3. **WordPiece** (Wu et al., 2016; BERT section 3): each word is cut greedily,
   longest match first, into vocabulary pieces; a piece that does not start the
   word carries the prefix ``##``. A word longer than ``max_input_chars_per_word``
   or with a spot no piece matches becomes ``[UNK]`` as a whole.

Unicode tables: Python's ``unicodedata`` and the Rust crates behind Hugging
Face ``tokenizers`` may follow different Unicode versions, so characters added or
re-categorised recently (a few hundred, e.g. U+0890, U+1734) can normalize
differently; the tests compare the scripts in common use.

Training (:func:`train_wordpiece`) starts from the characters (``c`` at the
start of a word, ``##c`` inside it) and joins pairs, as BPE does. Two scores
are offered:

* ``score="frequency"``: the pair occurring most often, ties to the smallest
  ``(left id, right id)``. This is what Hugging Face ``tokenizers``'
  ``WordPieceTrainer`` does: it *is* its ``BpeTrainer`` with
  ``continuing_subword_prefix="##"`` (``tokenizers/src/models/wordpiece/trainer.rs``
  and ``models/bpe/trainer.rs``: a heap ordered by count, then ascending pair).
* ``score="likelihood"``: the pair with the largest ``freq(ab) / (freq(a) freq(b))``,
  the likelihood-gain criterion of the original WordPiece (Schuster & Nakajima,
  2012), as popularised by Hugging Face's course. It prefers pairs whose parts
  rarely occur apart.

Tie-break and ids: both trainers number the tokens specials first, then the
single characters sorted by code point, then the ``##c`` forms. Hugging Face
numbers the ``##c`` forms in the order it meets them while walking a Rust
``HashMap`` of words, which is seeded at random per process; so when two pairs
tie on count and one involves a ``##c`` form, its choice can vary from run to
run. Here the ``##c`` forms are sorted by code point (``tie_break="lowest_ids"``),
or you pass ``tie_break=`` a ``{token: id}`` mapping (e.g. a trained Hugging
Face vocabulary): the initial tokens are then numbered in its order, and ties
follow those ids.
"""

from __future__ import annotations

import heapq
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .bpe import merge_pair

__all__ = [
    "BERT_SPECIAL_TOKENS", "bert_normalize", "bert_pretokenize", "is_cjk", "is_punctuation",
    "wordpiece_encode_word", "WordPieceStep", "WordPiece", "train_wordpiece",
]

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
# 0x2B920 (not 0x2B820, the start of CJK Extension E) is what Hugging Face's Rust BertNormalizer uses;
# Google's BERT and transformers' slow BasicTokenizer start at 0x2B820. We follow the fast tokenizer:
# the 256 ideographs U+2B820..U+2B91F stay glued to their neighbours, as in BertTokenizerFast.


def is_cjk(ch: str) -> bool:
    """True for a CJK Unified Ideograph (the blocks BERT's tokenizer isolates; not Hangul, Hiragana or Katakana)."""
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def is_punctuation(ch: str) -> bool:
    """BERT's punctuation: every ASCII non-alphanumeric printable (``$``, ``^``, `````...) or a Unicode P* character."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_control(ch: str) -> bool:
    # Cc, Cf and Co (private use) are removed; unassigned code points (Cn) are kept, as Hugging Face's
    # BertNormalizer does (the slow BasicTokenizer drops every C* category).
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf", "Co")


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) in ("Zs", "Zl", "Zp")


def _clean_char(ch: str, handle_chinese_chars: bool) -> str:
    if ch in ("\x00", "\ufffd") or _is_control(ch):
        return ""
    if _is_whitespace(ch):
        return " "
    if handle_chinese_chars and is_cjk(ch):
        return f" {ch} "
    return ch


def bert_normalize(text: str, *, lowercase: bool = True, strip_accents: bool | None = None,
                   handle_chinese_chars: bool = True) -> str:
    """BERT's normalization (Hugging Face ``BertNormalizer``): clean, space out CJK, strip accents, lower-case.

    ``strip_accents=None`` follows ``lowercase`` (BERT's uncased models do both).

    >>> bert_normalize("Héllo\\tWörld\\x00 日本")
    'hello world  日  本 '
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    # Each character maps on its own, so decide once per distinct character and let str.translate
    # apply the table (a per-character Python loop over the text is several times slower).
    text = text.translate({ord(c): _clean_char(c, handle_chinese_chars) for c in set(text)})
    if strip_accents if strip_accents is not None else lowercase:
        text = unicodedata.normalize("NFD", text)
        text = text.translate({ord(c): None for c in set(text) if unicodedata.category(c) == "Mn"})
    return text.lower() if lowercase else text


def bert_pretokenize(text: str) -> list[str]:
    """Split normalized text into words: on whitespace, and every punctuation character alone.

    >>> bert_pretokenize("don't stop--now")
    ['don', "'", 't', 'stop', '-', '-', 'now']
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    table = {}
    for c in set(text):
        if _is_whitespace(c):
            table[ord(c)] = " "
        elif is_punctuation(c):
            table[ord(c)] = f" {c} "
    return [w for w in text.translate(table).split(" ") if w]


def wordpiece_encode_word(word: str, vocab: Mapping[str, int] | set[str], *, unk_token: str = "[UNK]",
                          prefix: str = "##", max_input_chars_per_word: int = 100) -> list[str]:
    """Greedy longest-match-first WordPiece of one word: a list of vocabulary pieces, or ``[unk_token]``.

    From the current position take the longest substring in ``vocab`` (with
    ``prefix`` unless it starts the word); if none matches, the whole word is unknown.

    >>> wordpiece_encode_word("unaffable", {"un", "##aff", "##able", "##a"})
    ['un', '##aff', '##able']
    """
    if not isinstance(word, str):
        raise TypeError(f"word must be a str, got {type(word).__name__}")
    if len(word) > max_input_chars_per_word:
        return [unk_token]
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start:
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                break
            end -= 1
        else:
            return [unk_token]
        pieces.append(piece)
        start = end
    return pieces


@dataclass(frozen=True)
class WordPieceStep:
    """One learned merge: ``left + right -> token`` (the right part loses its ``##``)."""

    rank: int  # order of the merge (0 = first)
    left: str
    right: str
    token: str
    count: int  # how often the pair occurred when it was chosen
    score: float  # the score it won with (== count for score="frequency")


class WordPiece:
    """A WordPiece tokenizer over a vocabulary ``{token: id}``, encoding like ``BertTokenizerFast``.

    ``merges`` holds the training steps when the tokenizer came from
    :func:`train_wordpiece` (empty when read from a ``vocab.txt``).
    """

    def __init__(self, vocab: Mapping[str, int] | Sequence[str], *, unk_token: str = "[UNK]", cls_token: str = "[CLS]",
                 sep_token: str = "[SEP]", pad_token: str = "[PAD]", mask_token: str = "[MASK]",
                 lowercase: bool = True, strip_accents: bool | None = None, handle_chinese_chars: bool = True,
                 prefix: str = "##", max_input_chars_per_word: int = 100,
                 merges: Sequence[WordPieceStep] = ()) -> None:
        if isinstance(vocab, Mapping):
            self.vocab = {str(t): int(i) for t, i in vocab.items()}
        elif isinstance(vocab, Sequence) and not isinstance(vocab, str):
            self.vocab = {}
            for i, t in enumerate(vocab):
                self.vocab.setdefault(t, i)  # a duplicate line keeps its first id, as BertTokenizerFast does
        else:
            raise TypeError(f"vocab must be a {{token: id}} mapping or a list of tokens, got {type(vocab).__name__}")
        for name, tok in (("unk_token", unk_token), ("cls_token", cls_token), ("sep_token", sep_token),
                          ("pad_token", pad_token), ("mask_token", mask_token)):
            if tok not in self.vocab:
                raise ValueError(f"{name} {tok!r} is not in the vocabulary ({len(self.vocab)} tokens)")
        if isinstance(max_input_chars_per_word, bool) or not isinstance(max_input_chars_per_word, int) \
                or max_input_chars_per_word <= 0:
            raise ValueError(f"max_input_chars_per_word must be a positive int, got {max_input_chars_per_word!r}")
        self.unk_token, self.cls_token, self.sep_token = unk_token, cls_token, sep_token
        self.pad_token, self.mask_token = pad_token, mask_token
        self.lowercase, self.strip_accents, self.handle_chinese_chars = lowercase, strip_accents, handle_chinese_chars
        self.prefix, self.max_input_chars_per_word = prefix, max_input_chars_per_word
        self.merges = list(merges)
        self.id_to_token = {i: t for t, i in self.vocab.items()}

    # ---- vocabulary files -------------------------------------------------------------------------
    @classmethod
    def from_vocab_file(cls, path: str | Path, **kwargs) -> WordPiece:
        """Read a BERT ``vocab.txt`` (one token per line; the line number is the id)."""
        lines = Path(path).read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return cls([line.rstrip("\r") for line in lines], **kwargs)

    def save_vocab(self, path: str | Path) -> None:
        """Write ``vocab.txt``: tokens in id order (ids must be 0..n-1)."""
        ids = sorted(self.id_to_token)
        if ids != list(range(len(ids))):
            raise ValueError("ids must be 0..n-1 to write a vocab.txt")
        Path(path).write_text("".join(self.id_to_token[i] + "\n" for i in ids), encoding="utf-8")

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def special_ids(self) -> list[int]:
        return [self.vocab[t] for t in (self.pad_token, self.unk_token, self.cls_token, self.sep_token, self.mask_token)]

    def token_to_id(self, token: str) -> int:
        return self.vocab.get(token, self.vocab[self.unk_token])

    # ---- encoding ---------------------------------------------------------------------------------
    def normalize(self, text: str) -> str:
        return bert_normalize(text, lowercase=self.lowercase, strip_accents=self.strip_accents,
                              handle_chinese_chars=self.handle_chinese_chars)

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text``; a special token written in the text (``[MASK]``) stays one token.

        Special tokens are found in the raw text before normalization, as Hugging
        Face's added tokens are (so ``[mask]`` in lower case is *not* special).
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        specials = (self.pad_token, self.unk_token, self.cls_token, self.sep_token, self.mask_token)
        pattern = "(" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")"
        out: list[str] = []
        for i, part in enumerate(re.split(pattern, text)):
            if i % 2 == 1:
                out.append(part)
                continue
            for word in bert_pretokenize(self.normalize(part)):
                out += wordpiece_encode_word(word, self.vocab, unk_token=self.unk_token, prefix=self.prefix,
                                             max_input_chars_per_word=self.max_input_chars_per_word)
        return out

    def encode(self, text: str, text_pair: str | None = None, *, max_length: int | None = None,
               truncation: bool = False, padding: bool = False) -> dict[str, list[int]]:
        """``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with ``token_type_ids`` (0 for A, 1 for B) and ``attention_mask``.

        ``truncation=True`` cuts to ``max_length`` like Hugging Face's ``longest_first``:
        the shorter side keeps ``min(len, budget // 2)`` tokens, the longer the rest of
        the budget. ``padding=True`` pads with ``[PAD]`` (mask 0) up to ``max_length``.
        """
        a = [self.token_to_id(t) for t in self.tokenize(text)]
        b = None if text_pair is None else [self.token_to_id(t) for t in self.tokenize(text_pair)]
        n_special = 2 if b is None else 3
        if (truncation or padding) and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < n_special):
            raise ValueError(f"truncation/padding need an int max_length >= {n_special} (the special tokens), "
                             f"got {max_length!r}")
        if truncation:
            budget = max_length - n_special
            if b is None:
                a = a[:budget]
            elif len(a) + len(b) > budget:
                if len(a) > len(b):
                    keep_b = min(len(b), budget // 2)
                    keep_a = min(len(a), budget - keep_b)
                else:
                    keep_a = min(len(a), budget // 2)
                    keep_b = min(len(b), budget - keep_a)
                a, b = a[:keep_a], b[:keep_b]
        cls_id, sep_id = self.vocab[self.cls_token], self.vocab[self.sep_token]
        ids = [cls_id] + a + [sep_id]
        types = [0] * len(ids)
        if b is not None:
            ids += b + [sep_id]
            types += [1] * (len(b) + 1)
        mask = [1] * len(ids)
        if padding and len(ids) < max_length:
            n = max_length - len(ids)
            ids += [self.vocab[self.pad_token]] * n
            types += [0] * n
            mask += [0] * n
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}

    def encode_batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                     max_length: int | None = None, truncation: bool = False) -> dict[str, list[list[int]]]:
        """Encode several texts (or pairs) and pad them to the longest (``padding="longest"``)."""
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"pairs must have one entry per text ({len(texts)}), got {len(pairs)}")
        encs = [self.encode(t, None if pairs is None else pairs[i], max_length=max_length, truncation=truncation)
                for i, t in enumerate(texts)]
        longest = max((len(e["input_ids"]) for e in encs), default=0)
        pad = self.vocab[self.pad_token]
        out: dict[str, list[list[int]]] = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
        for e in encs:
            n = longest - len(e["input_ids"])
            out["input_ids"].append(e["input_ids"] + [pad] * n)
            out["token_type_ids"].append(e["token_type_ids"] + [0] * n)
            out["attention_mask"].append(e["attention_mask"] + [0] * n)
        return out

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Join tokens back into text: ``##`` pieces glue to the previous one (lower-cased, accents gone)."""
        specials = set(self.special_ids)
        words: list[str] = []
        for i in ids:
            i = int(i)
            if i not in self.id_to_token:
                raise ValueError(f"id {i} is not in the vocabulary (size {self.vocab_size})")
            if skip_special_tokens and i in specials:
                continue
            tok = self.id_to_token[i]
            if tok.startswith(self.prefix) and words:
                words[-1] += tok[len(self.prefix):]
            else:
                words.append(tok)
        return " ".join(words)


def _word_counts(texts: str | Iterable[str], lowercase: bool, strip_accents: bool | None) -> Counter:
    if isinstance(texts, str):
        texts = [texts]
    counts: Counter = Counter()
    for t in texts:
        counts.update(bert_pretokenize(bert_normalize(t, lowercase=lowercase, strip_accents=strip_accents)))
    return counts


def train_wordpiece(
    texts: str | Iterable[str],
    vocab_size: int,
    *,
    special_tokens: Sequence[str] = BERT_SPECIAL_TOKENS,
    min_frequency: int = 0,
    score: str = "frequency",
    tie_break: str | Mapping[str, int] = "lowest_ids",
    lowercase: bool = True,
    strip_accents: bool | None = None,
    prefix: str = "##",
) -> WordPiece:
    """Learn a WordPiece vocabulary of (at most) ``vocab_size`` tokens; the steps are in ``.merges``.

    Initial vocabulary: ``special_tokens``, every character seen (sorted by code
    point), then the ``##c`` forms of the characters seen inside words. Each step
    joins the best adjacent pair inside words (weighted by word frequency) until the
    vocabulary holds ``vocab_size`` tokens, no pair is left, or the best count is
    below ``min_frequency``. ``score`` and ``tie_break``: see the module docstring.
    With ``score="frequency"`` and the default ``tie_break`` the result equals
    ``tokenizers.trainers.WordPieceTrainer`` whenever no tie involves a ``##c``
    form; with ``tie_break=<its vocabulary>`` it equals it always.

    A merge whose string already exists (``"a"+"##bc"`` after ``"ab"+"##c"``) reuses its id.
    The frequency trainer updates pair counts incrementally (only the words that
    contained the merged pair are recounted) and finds the best with a lazy heap.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if score not in ("frequency", "likelihood"):
        raise ValueError(f"score must be 'frequency' or 'likelihood', got {score!r}")
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 0:
        raise ValueError(f"min_frequency must be an int >= 0, got {min_frequency!r}")
    if isinstance(tie_break, str) and tie_break != "lowest_ids":
        raise ValueError(f"tie_break must be 'lowest_ids' or a {{token: id}} mapping, got {tie_break!r}")
    missing = [t for t in BERT_SPECIAL_TOKENS if t not in special_tokens]
    if missing:
        raise ValueError(f"special_tokens must include {missing} (the tokenizer needs them), got {list(special_tokens)}")
    word_freq = _word_counts(texts, lowercase, strip_accents)

    id_to_tok: list[str] = []
    tok_to_id: dict[str, int] = {}

    def add(tok: str) -> int:
        if tok not in tok_to_id:
            tok_to_id[tok] = len(id_to_tok)
            id_to_tok.append(tok)
        return tok_to_id[tok]

    initial = list(special_tokens) + sorted({c for w in word_freq for c in w})
    initial += sorted({prefix + c for w in word_freq for c in w[1:]})
    if isinstance(tie_break, Mapping):  # number the initial tokens in the order of the given vocabulary
        missing = [t for t in initial if t not in tie_break]
        if missing:
            raise ValueError(f"tie_break mapping lacks initial tokens, e.g. {missing[:5]}")
        initial.sort(key=lambda t: int(tie_break[t]))
    for t in initial:
        add(t)
    words = [[tok_to_id[c if i == 0 else prefix + c] for i, c in enumerate(w)] for w in word_freq]
    freqs = list(word_freq.values())

    counts: Counter = Counter()
    where: dict[tuple[int, int], set[int]] = {}
    unit: Counter = Counter()  # frequency of each token in the current segmentation (likelihood score)
    for wi, (w, f) in enumerate(zip(words, freqs)):
        for t in w:
            unit[t] += f
        for pair in zip(w, w[1:]):
            counts[pair] += f
            where.setdefault(pair, set()).add(wi)

    def join(a: int, b: int) -> str:
        right = id_to_tok[b]
        return id_to_tok[a] + (right[len(prefix):] if right.startswith(prefix) else right)

    merges: list[WordPieceStep] = []
    # max-heap by count, ties to the smallest (left id, right id), as HF's BpeTrainer orders its queue
    heap = [(-c, p) for p, c in counts.items()]
    heapq.heapify(heap)
    while len(id_to_tok) < vocab_size:
        if score == "frequency":
            pair = None
            while heap:
                neg, p = heapq.heappop(heap)
                current = counts.get(p, 0)
                if current == -neg:
                    pair = p
                    break
                if current > 0:
                    heapq.heappush(heap, (-current, p))
            if pair is None:
                break
            best_score = float(counts[pair])
        else:
            live = [(p, c) for p, c in counts.items() if c > 0]
            if not live:
                break
            pair, best_score = None, -1.0
            for p, c in live:
                s = c / (unit[p[0]] * unit[p[1]])
                if s > best_score or (s == best_score and p < pair):
                    pair, best_score = p, s
        count = counts[pair]
        if count < 1 or count < min_frequency:
            break
        token = join(*pair)
        new_id = add(token)
        merges.append(WordPieceStep(len(merges), id_to_tok[pair[0]], id_to_tok[pair[1]], token, count, best_score))
        touched: set[tuple[int, int]] = set()
        for wi in where.pop(pair, ()):
            w, f = words[wi], freqs[wi]
            merged = merge_pair(w, pair, new_id)
            if len(merged) == len(w):
                continue
            for p in zip(w, w[1:]):
                counts[p] -= f
            for t in w:
                unit[t] -= f
            for t in merged:
                unit[t] += f
            for p in zip(merged, merged[1:]):
                counts[p] += f
                where.setdefault(p, set()).add(wi)
                touched.add(p)
            words[wi] = merged
        counts.pop(pair, None)
        if score == "frequency":
            for p in touched:
                if counts[p] > 0:
                    heapq.heappush(heap, (-counts[p], p))
        else:
            for p in [p for p, c in counts.items() if c <= 0]:
                del counts[p]
    return WordPiece(tok_to_id, lowercase=lowercase, strip_accents=strip_accents, prefix=prefix, merges=merges)
