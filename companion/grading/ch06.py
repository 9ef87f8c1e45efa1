"""Checks for the Chapter 6 exercises (masks past the chapter's four).

The chapter grows the padding, causal, prefix-LM and cross-attention masks and
``reach``, the boolean matrix power. Each exercise adds what those lines do not
handle: documents packed into one row (6.1), a sliding window whose queries are
the last ``t`` of ``s`` keys (6.2), padding on both sides of cross-attention
with the fully masked query rows named (6.3), and the reach of a sliding
window with sink tokens for a sequence far too long for a ``(T, T)`` matrix
(6.4). The expected values come from small rule-by-rule loops written here,
from :mod:`companion.masks` (``causal_mask``, ``influence_matrix``), or from a
closed form that tests/test_grading_ch06_redesign.py checks against
``influence_matrix``.
"""

from __future__ import annotations

import torch

from ..masks import causal_mask, influence_matrix
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


def _expect_bool_mask(got, want: torch.Tensor, name: str) -> None:
    if isinstance(got, torch.Tensor) and got.dtype != torch.bool:
        raise CheckFailed(f"{name} must be a boolean tensor (True = may attend), got dtype {got.dtype}")
    expect_tensor(got, want, name=name)


def _shaped_bool(got, shape) -> bool:
    return isinstance(got, torch.Tensor) and got.dtype == torch.bool and tuple(got.shape) == tuple(shape)


# ----------------------------------------------------------------- 6.1 packed documents

def _packed_reference(doc_ids: torch.Tensor) -> torch.Tensor:
    """Rule by rule: query i sees key j when j <= i, both in the same document, and j is not padding (-1)."""
    b, t = doc_ids.shape
    out = torch.zeros(b, 1, t, t, dtype=torch.bool)
    for n in range(b):
        for i in range(t):
            for j in range(i + 1):
                out[n, 0, i, j] = bool(doc_ids[n, j] >= 0 and doc_ids[n, j] == doc_ids[n, i])
    return out


def _packed_diagnose(got, doc_ids: torch.Tensor, name: str) -> None:
    want = _packed_reference(doc_ids)
    if _shaped_bool(got, want.shape):
        extra = got & ~want  # pairs the student lets through that the rules block
        ids = doc_ids[:, None, :, None], doc_ids[:, None, None, :]  # query's and key's document
        t = doc_ids.shape[1]
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        if (extra & future).any():
            raise CheckFailed(f"{name}: a query sees a later key; the mask must stay causal inside a document")
        if (extra & (ids[0] != ids[1]) & (ids[0] >= 0) & (ids[1] >= 0)).any():
            n, _, i, j = (int(v) for v in (extra & (ids[0] != ids[1])).nonzero()[0])
            raise CheckFailed(f"{name}: query {i} (document {int(doc_ids[n, i])}) sees key {j} of document "
                              f"{int(doc_ids[n, j])} in row {n}; packed documents must not see each other, "
                              "so AND the causal mask with a same-document test")
        if (extra & (ids[1] < 0)).any():
            raise CheckFailed(f"{name}: a query sees a padding key (document id -1); block padding keys")
        if (extra & (ids[0] < 0)).any():
            raise CheckFailed(f"{name}: a padding query (document id -1) sees a key; its row must be all False")
    _expect_bool_mask(got, want, name)


def _packed_values(student):
    ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2],
                        [0, 1, 1, 1, 1, 1, 2, 3, 3]])  # documents of 1 to 5 tokens, no padding
    _packed_diagnose(student(ids.clone()), ids, "packed_causal_mask for two rows of packed documents")


def _packed_padding(student):
    ids = torch.tensor([[0, 0, 1, 1, 1, -1, -1],
                        [0, 0, 0, 0, 0, 0, 0],
                        [0, -1, -1, -1, -1, -1, -1]])  # right padding; one row without; one nearly all padding
    _packed_diagnose(student(ids.clone()), ids, "packed_causal_mask with right padding (id -1)")


def _packed_one_doc(student):
    ids = torch.tensor([[-1, -1, 0, 0, 0]])  # left padding, one document: the chapter's causal & padding
    _packed_diagnose(student(ids.clone()), ids, "packed_causal_mask for one left-padded document")


register(Exercise(
    id="6.1",
    title="A causal mask for packed documents",
    targets=("packed_causal_mask",),
    forbidden=("companion.masks",),
    cases=(
        Case("documents packed into one row do not see each other", 2, _packed_values),
        Case("padding keys blocked, padding queries see nothing", 2, _packed_padding),
        Case("one document with left padding", 1, _packed_one_doc),
    ),
))


# ----------------------------------------------------------------- 6.2 sliding window over a cache

def _window_reference(t: int, s: int, window: int) -> torch.Tensor:
    """Query i sits at position s - t + i and sees the keys j with position - window < j <= position."""
    out = torch.zeros(t, s, dtype=torch.bool)
    for i in range(t):
        pos = s - t + i
        for j in range(s):
            out[i, j] = pos - window < j <= pos
    return out


def _window_diagnose(got, t: int, s: int, window: int) -> None:
    name = f"sliding_window_mask(t={t}, s={s}, window={window})"
    want = _window_reference(t, s, window)
    if _shaped_bool(got, want.shape) and not torch.equal(got, want):
        top_left = torch.ones(t, s, dtype=torch.bool).tril() & ~torch.ones(t, s, dtype=torch.bool).tril(-window)
        if t < s and torch.equal(got, top_left):
            raise CheckFailed(f"{name} is aligned top-left (query i at position i); the t queries are the "
                              f"last t of the s keys, so query i sits at position s - t + i")
        seen = got.sum(dim=-1)
        if torch.equal(seen, want.sum(dim=-1) + (want.sum(dim=-1) < torch.arange(s - t, s) + 1).long()):
            raise CheckFailed(f"{name}: each query sees one key too many; a window of {window} is {window} "
                              "keys, the query's own position included")
        if torch.equal(seen + (want.sum(dim=-1) > 1).long(), want.sum(dim=-1)):
            raise CheckFailed(f"{name}: each query sees one key too few; a window of {window} is {window} "
                              "keys, the query's own position included")
    _expect_bool_mask(got, want, name)


def _window_square(student):
    for t, window in ((9, 2), (6, 1), (5, 5)):
        _window_diagnose(student(t, t, window), t, t, window)


def _window_cache(student):
    for t, s, window in ((3, 10, 4), (1, 7, 3), (6, 13, 3), (4, 6, 8)):
        _window_diagnose(student(t, s, window), t, s, window)


def _window_long_cache(student):
    t, s, window = 2, 20_000_000, 4096  # a (s, s) mask would need 4 * 10^14 booleans
    name = f"sliding_window_mask(t={t}, s={s:,}, window={window})"
    try:
        got = student(t, s, window)
    except NotImplementedError:
        raise
    except (RuntimeError, MemoryError) as err:
        raise CheckFailed(f"{name} raised {type(err).__name__} ({str(err).splitlines()[0][:100]}...): an (s, s) mask "
                          "of 20 million keys cannot be allocated; compute the (t, s) mask from the queries' "
                          "positions s - t + i directly") from None
    want = torch.zeros(t, s, dtype=torch.bool)
    for i in range(t):
        want[i, s - t + i - window + 1:s - t + i + 1] = True
    if _shaped_bool(got, want.shape) and torch.equal(got, want):
        return
    _expect_bool_mask(got, want, name)


register(Exercise(
    id="6.2",
    title="A sliding-window mask over a KV cache",
    targets=("sliding_window_mask",),
    forbidden=("companion.masks",),
    cases=(
        Case("no cache (t = s): the chapter's window", 1, _window_square),
        Case("t new queries at the end of s keys, window smaller and larger than s", 2, _window_cache),
        Case("a cache of 20 million keys, without an (s, s) mask", 1, _window_long_cache),
    ),
))


# ----------------------------------------------------------------- 6.3 cross-attention, padding on both sides

def _cross_reference(dec: torch.Tensor, enc: torch.Tensor):
    b, t = dec.shape
    s = enc.shape[1]
    mask = torch.zeros(b, 1, t, s, dtype=torch.bool)
    for n in range(b):
        for i in range(t):
            for j in range(s):
                mask[n, 0, i, j] = bool(dec[n, i]) and bool(enc[n, j])
    return mask, ~mask[:, 0].any(dim=-1)


def _cross_pair(got, dec, enc, name):
    want_mask, want_empty = _cross_reference(dec, enc)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed(f"{name} should return a tuple (mask, empty_rows), got {type(got).__name__}")
    mask, empty = got
    if _shaped_bool(mask, want_mask.shape):
        if (mask & ~dec.bool()[:, None, :, None]).any():
            raise CheckFailed(f"{name}: a padded decoder query sees encoder keys; block the rows of padded "
                              "decoder positions too (the chapter's mask blocks only encoder padding)")
        if (mask & ~enc.bool()[:, None, None, :]).any():
            raise CheckFailed(f"{name}: a decoder query sees an encoder padding key; block those columns")
        if (mask & torch.ones_like(mask).triu(1)).sum() < (want_mask & torch.ones_like(want_mask).triu(1)).sum():
            raise CheckFailed(f"{name}: the mask is causal; cross-attention sees the whole (real) source")
    _expect_bool_mask(mask, want_mask, f"{name}, mask")
    return empty, want_empty


def _cross_values(student):
    dec = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    enc = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]])
    _cross_pair(student(dec.clone(), enc.clone()), dec, enc, "cross_attention_mask(decoder (2, 5), encoder (2, 7))")


def _cross_empty(student):
    dec = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    enc = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    name = "cross_attention_mask(decoder (2, 6), encoder (2, 4))"
    empty, want = _cross_pair(student(dec.clone(), enc.clone()), dec, enc, name)
    _expect_bool_mask(empty, want, f"{name}, empty_rows (B, T): True where a query row has no visible key")


def _cross_empty_source(student):
    dec = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    enc = torch.tensor([[0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)  # row 0: the source is all padding
    name = "cross_attention_mask with a source that is all padding (boolean inputs)"
    empty, want = _cross_pair(student(dec.clone(), enc.clone()), dec, enc, name)
    if _shaped_bool(empty, want.shape) and not bool(empty[0].all()):
        raise CheckFailed(f"{name}: with no real source token every query of row 0 is fully masked, "
                          "real decoder positions included; empty_rows[0] must be all True")
    _expect_bool_mask(empty, want, f"{name}, empty_rows")


register(Exercise(
    id="6.3",
    title="Cross-attention with padding on both sides",
    targets=("cross_attention_mask",),
    forbidden=("companion.masks",),
    cases=(
        Case("mask values: decoder and encoder padding blocked", 2, _cross_values),
        Case("the fully masked query rows, named", 1, _cross_empty),
        Case("a source that is all padding: every row fully masked", 1, _cross_empty_source),
    ),
))


# ----------------------------------------------------------------- 6.4 reach without the matrix power

def window_sink_mask(t: int, window: int, n_sink: int = 0) -> torch.Tensor:
    """(t, t): query i sees key j <= i when i - j < window or j < n_sink (only for small t)."""
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    return (j <= i) & ((i - j < window) | (j < n_sink))


def reach_closed_form(t: int, i: int, n_layers: int, window: int, n_sink: int = 0) -> torch.Tensor:
    """Positions that can influence output i: each layer steps back at most window - 1, a sink in one step."""
    out = torch.zeros(t, dtype=torch.bool)
    out[max(0, i - n_layers * (window - 1)):i + 1] = True
    out[:min(n_sink, i + 1)] = True
    return out


def _reach_diagnose(got, want, t: int, i: int, layers: int, window: int, n_sink: int, name: str) -> None:
    if _shaped_bool(got, (t,)) and not torch.equal(got, want):
        if not bool(got[i]):
            raise CheckFailed(f"{name}: position {i} must influence its own output (the residual path)")
        if bool(got[i + 1:].any()):
            raise CheckFailed(f"{name}: a position after {i} is marked; the mask is causal, so no later input "
                              f"(sink or not) reaches output {i}")
        if n_sink and not bool(got[:min(n_sink, i + 1)].all()):
            raise CheckFailed(f"{name}: every query reads the sink keys 0..{n_sink - 1} directly, so they "
                              "influence output i after one layer")
        lo = max(0, i - layers * (window - 1))
        if lo > 0 and bool(got[lo - 1]) and not (lo - 1 < n_sink):
            raise CheckFailed(f"{name}: position {lo - 1} is marked; a window of {window} keys (the query's own "
                              f"included) moves information at most {window - 1} positions per layer")
    _expect_bool_mask(got, want, name)


def _reach_small(student):
    cases = ((12, 3, 1, (0, 5, 11)), (12, 3, 4, (11, 7)), (10, 1, 3, (4,)), (9, 2, 8, (8,)))
    for t, window, layers, positions in cases:
        want_all = influence_matrix(window_sink_mask(t, window), layers)
        for i in positions:
            got = student(t, i, layers, window)
            name = f"influencing_positions(t={t}, i={i}, n_layers={layers}, window={window})"
            _reach_diagnose(got, want_all[i], t, i, layers, window, 0, name)


def _reach_sinks(student):
    t, window, n_sink = 16, 3, 3
    for layers, i in ((1, 15), (2, 15), (3, 1), (2, 6)):
        want = influence_matrix(window_sink_mask(t, window, n_sink), layers)[i]
        got = student(t, i, layers, window, n_sink)
        name = f"influencing_positions(t={t}, i={i}, n_layers={layers}, window={window}, n_sink={n_sink})"
        _reach_diagnose(got, want, t, i, layers, window, n_sink, name)


def _reach_long(student):
    t, window, layers = 20_000_000, 4096, 32  # Mistral 7B's window and depth; a (t, t) mask would be 400 TB
    for i, n_sink in ((t - 1, 0), (10_000_000, 4)):
        name = f"influencing_positions(t={t:,}, i={i:,}, n_layers={layers}, window={window}, n_sink={n_sink})"
        try:
            got = student(t, i, layers, window, n_sink)
        except NotImplementedError:
            raise
        except (RuntimeError, MemoryError) as err:
            raise CheckFailed(f"{name} raised {type(err).__name__} ({str(err).splitlines()[0][:100]}...): a (t, t) "
                              "mask of 20 million positions needs 4 * 10^14 booleans; compute the reached "
                              "positions from the window, the depth and the sinks, without building a (t, t) "
                              "matrix") from None
        want = reach_closed_form(t, i, layers, window, n_sink)
        if not _shaped_bool(got, (t,)):
            expect_tensor(got, want, name=name)
        if not torch.equal(got, want):
            hit = got.nonzero().flatten()
            sinks = f", and the sinks 0 to {n_sink - 1}" if n_sink else ""
            raise CheckFailed(f"{name}: expected {int(want.sum()):,} positions ({max(0, i - layers * (window - 1)):,} "
                              f"to {i:,}{sinks}), got {int(got.sum()):,}"
                              + (f" ({int(hit[0]):,} to {int(hit[-1]):,})" if len(hit) else ""))


register(Exercise(
    id="6.4",
    title="How far a sliding window reaches, without the matrix power",
    targets=("influencing_positions",),
    forbidden=("companion.masks",),
    cases=(
        Case("a sliding window, one to eight layers", 2, _reach_small),
        Case("sink keys every query sees", 1, _reach_sinks),
        Case("20 million positions, Mistral's window and depth", 2, _reach_long),
    ),
))
