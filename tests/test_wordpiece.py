"""WordPiece (Chapter 7) against Hugging Face `tokenizers` / `BertTokenizerFast` and a naive trainer."""

from __future__ import annotations

import unicodedata
from collections import Counter

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import BertTokenizerFast

from companion.data import load_pydoc_text
from companion.tokenizers.bpe import merge_pair
from companion.tokenizers import (
    BERT_SPECIAL_TOKENS, WordPiece, bert_normalize, bert_pretokenize, train_wordpiece, wordpiece_encode_word,
)

PROBES = [
    "Hello, World! This is BERT.",
    "Héllo Wörld: naïve café, façade, Ångström, crème brûlée",
    "ÀÉÎÕÜ àéîõü ñ ß ø Œ",
    "日本語のテキストと中文字符，混合 English words 한국어",
    "don't stop--now... (really?) [yes] {no} $100 #tag @user 50% a+b=c ~x^y`z|w\\v",
    "\tTabs\nnewlines\r\n  and   spaces\u00a0nbsp\u3000ideographic space",
    "control\x00chars\x07here\ufffd and zero\u200bwidth",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101,
    "qzxv jjjjkkkk xylophone zzz 🤗 emoji ☃ ✓",
    "def f(x):\n    return x ** 2  # comment",
    "",
    "   ",
    "[CLS] [MASK] [SEP] tokens in text",
    "Mixed123Numbers 3.14159 1,000,000 2nd 4th",
]
# (HF's __call__ treats text_pair="" as "no pair", a quirk of its Python API, so "" is never a B here)
PAIRS = [(PROBES[i], PROBES[(i * 7 + 3) % len(PROBES)] or "x") for i in range(len(PROBES))]


@pytest.fixture(scope="module")
def text() -> str:
    return load_pydoc_text()[:200_000]


def _hf_train(text: str, vocab_size: int, lowercase: bool = True) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(BERT_SPECIAL_TOKENS),
                                        show_progress=False)
    tok.train_from_iterator([text], trainer)
    return tok


def _common_scripts() -> list[str]:
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x2000, 0x206F), (0x3000, 0x30FF),
              (0x4E00, 0x4F00), (0xAC00, 0xAD00), (0xFF00, 0xFFEF), (0x1F600, 0x1F64F), (0x0, 0x1F), (0xE000, 0xE010)]
    return [chr(cp) for lo, hi in ranges for cp in range(lo, hi + 1)]


@pytest.mark.parametrize("lowercase", [True, False])
def test_normalizer_equals_hf_on_common_scripts(lowercase):
    hf = normalizers.BertNormalizer(lowercase=lowercase)
    for ch in _common_scripts():
        s = f"x{ch}y {ch}"
        assert bert_normalize(s, lowercase=lowercase) == hf.normalize_str(s), hex(ord(ch))
    for s in PROBES:
        assert bert_normalize(s, lowercase=lowercase) == hf.normalize_str(s)


def test_pretokenizer_equals_hf():
    hf = pre_tokenizers.BertPreTokenizer()
    for ch in _common_scripts():
        s = f"ab{ch}cd e{ch}"
        if unicodedata.category(ch).startswith("C") and ch not in "\t\n\r":
            continue  # removed by the normalizer before pre-tokenization
        assert bert_pretokenize(s) == [w for w, _ in hf.pre_tokenize_str(s)], hex(ord(ch))
    for s in PROBES:
        n = bert_normalize(s)
        assert bert_pretokenize(n) == [w for w, _ in hf.pre_tokenize_str(n)]


def test_cjk_range_follows_the_fast_tokenizer():
    # U+2B820..U+2B91F: BertTokenizerFast's table starts at U+2B920, Google's BERT at U+2B820.
    hf = normalizers.BertNormalizer()
    for cp in (0x2B820, 0x2B91F, 0x2B920, 0x4E2D, 0x20000):
        s = f"a{chr(cp)}b"
        assert bert_normalize(s) == hf.normalize_str(s)


def test_encode_word_by_hand():
    vocab = {"un", "##aff", "##able", "##a", "a", "##b"}
    assert wordpiece_encode_word("unaffable", vocab) == ["un", "##aff", "##able"]
    assert wordpiece_encode_word("ab", vocab) == ["a", "##b"]
    assert wordpiece_encode_word("abc", vocab) == ["[UNK]"]  # stuck at "c": the whole word is unknown
    assert wordpiece_encode_word("a" * 6, vocab, max_input_chars_per_word=5) == ["[UNK]"]
    assert wordpiece_encode_word("a" * 5, vocab, max_input_chars_per_word=5) == ["a"] + ["##a"] * 4


def test_trainer_equals_hf_given_its_numbering(text):
    hf = _hf_train(text, 1200)
    ours = train_wordpiece(text, 1200, tie_break=hf.get_vocab())
    assert ours.vocab == hf.get_vocab()  # same tokens with the same ids, i.e. the same merges in the same order
    probe = load_pydoc_text()[-5000:] + " ".join(PROBES)  # text not used for training, plus odd strings
    assert ours.encode(probe)["input_ids"][1:-1] == hf.encode(probe).ids


def test_default_tie_break_differs_only_on_ties(text):
    hf_vocab = _hf_train(text, 1200).get_vocab()
    a = train_wordpiece(text, 1200)
    b = train_wordpiece(text, 1200, tie_break=hf_vocab)
    first = next((i for i, (x, y) in enumerate(zip(a.merges, b.merges)) if x.token != y.token), None)
    if first is not None:
        assert a.merges[first].count == b.merges[first].count


def test_incremental_trainer_equals_naive_recount(text):
    sample = text[:8000]
    tok = train_wordpiece(sample, 10_000)  # until no pair is left
    words = Counter()
    for w in bert_pretokenize(bert_normalize(sample)):
        words[tuple([w[0]] + ["##" + c for c in w[1:]])] += 1
    vocab = set(BERT_SPECIAL_TOKENS) | {c for w in words for c in w} | {c.lstrip("#") for w in words for c in w}
    ids = {t: i for i, t in enumerate(tok.vocab)} | {t: tok.vocab[t] for t in tok.vocab}
    for step in tok.merges[:60]:
        counts = Counter()
        for w, f in words.items():
            for p in zip(w, w[1:]):
                counts[p] += f
        best = max(counts.values())
        pair = min((p for p, c in counts.items() if c == best), key=lambda p: (ids[p[0]], ids[p[1]]))
        assert (step.left, step.right, step.count) == (pair[0], pair[1], best)
        new = pair[0] + pair[1].removeprefix("##")
        vocab.add(new)
        merged = Counter()
        for w, f in words.items():
            merged[tuple(merge_pair(w, pair, new))] += f
        words = merged
    assert all(m.token in tok.vocab for m in tok.merges)


def test_likelihood_score_by_hand():
    # words: "ab" x3, "ac" x1, "db" x5; initial vocabulary: 5 specials, a b c d, ##b ##c (11 tokens).
    # unit counts: a=4 d=5 ##b=8 ##c=1.
    # frequency: (d,##b)=5 wins; likelihood: (a,##c) = 1/(4*1) = .25 beats (a,##b) = 3/(4*8), (d,##b) = 5/(5*8)
    text = "ab ab ab ac db db db db db"
    assert train_wordpiece(text, 1, score="frequency").merges == []
    freq = train_wordpiece(text, 12)
    assert [(m.left, m.right, m.count) for m in freq.merges] == [("d", "##b", 5)]
    like = train_wordpiece(text, 12, score="likelihood")
    assert [(m.left, m.right, m.count) for m in like.merges] == [("a", "##c", 1)]
    assert like.merges[0].score == pytest.approx(0.25)


def _bert_fast(tmp_path, vocab: list[str], lowercase: bool) -> BertTokenizerFast:
    # transformers 5 ignores a vocab_file= keyword of the constructor (the tokenizer would hold only the
    # five specials); from_pretrained on a folder holding vocab.txt reads it, offline.
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    tok = BertTokenizerFast.from_pretrained(str(folder), do_lower_case=lowercase)
    assert len(tok) == len(vocab)
    return tok


@pytest.mark.parametrize("lowercase", [True, False])
def test_vocab_txt_encodes_like_bert_tokenizer_fast(tmp_path, text, lowercase):
    trained = train_wordpiece(text, 900, lowercase=lowercase)
    vocab = [t for t, _ in sorted(trained.vocab.items(), key=lambda kv: kv[1])]
    trained.save_vocab(tmp_path / "ours.txt")
    ours = WordPiece.from_vocab_file(tmp_path / "ours.txt", lowercase=lowercase)
    assert ours.vocab == trained.vocab
    hf = _bert_fast(tmp_path, vocab, lowercase)
    for s in PROBES + text[:3000].split("\n"):
        assert ours.encode(s) == {k: v for k, v in hf(s).items()}, s
    for a, b in PAIRS:
        assert ours.encode(a, b) == dict(hf(a, b)), (a, b)
        for n in (5, 8, 13, 64):
            got = ours.encode(a, b, max_length=n, truncation=True, padding=True)
            want = dict(hf(a, b, max_length=n, truncation=True, padding="max_length"))
            assert got == want, (a, b, n)
    batch = ours.encode_batch(PROBES[:5], PROBES[5:10])
    assert batch == dict(hf(PROBES[:5], PROBES[5:10], padding=True))


def test_decode_and_specials(text):
    tok = train_wordpiece(text, 700)
    enc = tok.encode("Naïve tokenization works", "second")
    assert tok.decode(enc["input_ids"]) == "naive tokenization works second"
    assert [tok.vocab[t] for t in BERT_SPECIAL_TOKENS] == list(range(5)) == tok.special_ids


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="score"):
        train_wordpiece("abc", 100, score="bleu")
    with pytest.raises(ValueError, match="vocab_size"):
        train_wordpiece("abc", 0)
    with pytest.raises(ValueError, match="special_tokens"):
        train_wordpiece("abc", 100, special_tokens=["[UNK]"])
    with pytest.raises(ValueError, match="tie_break"):
        train_wordpiece("abc", 100, tie_break="random")
    with pytest.raises(ValueError, match="unk_token"):
        WordPiece(["a", "b"])
    tok = train_wordpiece("abc abd", 100)
    with pytest.raises(ValueError, match="max_length"):
        tok.encode("abc", "abd", truncation=True, max_length=2)
    with pytest.raises(ValueError, match="vocabulary"):
        tok.decode([10_000])
    with pytest.raises(TypeError, match="str"):
        tok.tokenize(b"bytes")


@pytest.mark.parametrize("lowercase", [True, False])
def test_trainer_equals_hf_on_accents_cjk_and_punctuation(lowercase):
    text = "\n".join(PROBES * 3)
    hf = _hf_train(text, 260, lowercase=lowercase)
    ours = train_wordpiece(text, 260, tie_break=hf.get_vocab(), lowercase=lowercase)
    assert ours.vocab == hf.get_vocab()
    for s in PROBES:
        assert ours.encode(s)["input_ids"] == [2] + hf.encode(s).ids + [3]  # [CLS] ... [SEP] around the pieces
