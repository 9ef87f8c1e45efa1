"""Exercise 7.2 as redesigned (issue 30, item 7): whole-word masking from given draws. A right answer scores full
marks; token-level masking (the chapter's) and other plausible wrong answers do not, with a message naming the
mistake. The reference here is written apart from the solution notebook and companion/grading/ch07.py."""

import torch

from companion.grading import get_exercise, run_exercise


def earned(*students):
    res = run_exercise(get_exercise("7.2"), *students)
    return res.earned, res.points, [c.message for c in res.cases if c.earned < c.points]


def masking(input_ids, attention_mask, special_ids, mask_id, select, action, random_tokens, p, word_of):
    """word_of(select, continuation) -> the select draw that decides each position."""
    eligible = ~torch.isin(input_ids, torch.tensor(list(special_ids))) & attention_mask.bool()
    selected = (word_of(select) < p) & eligible
    labels = input_ids.masked_fill(~selected, -100)
    out = input_ids.masked_fill(selected & (action < 0.8), mask_id)
    swap = selected & (action >= 0.8) & (action < 0.9)
    return torch.where(swap, random_tokens, out), labels


def first_piece_draw(select, continuation):
    if continuation is None:
        return select
    out = select.clone()
    for t in range(1, select.shape[1]):  # left to right: a continuation takes the draw of the piece before it
        out[:, t] = torch.where(continuation[:, t], out[:, t - 1], select[:, t])
    return out


def good(input_ids, attention_mask, special_ids, mask_id, select, action, random_tokens, p, continuation=None):
    return masking(input_ids, attention_mask, special_ids, mask_id, select, action, random_tokens, p,
                   lambda s: first_piece_draw(s, continuation))


def test_right_answer_scores_full_marks():
    assert earned(good)[:2] == (8, 8)


def test_token_level_masking_the_chapters():
    def token_level(input_ids, attention_mask, special_ids, mask_id, select, action, random_tokens, p,
                    continuation=None):
        return masking(input_ids, attention_mask, special_ids, mask_id, select, action, random_tokens, p,
                       lambda s: s)

    got, points, messages = earned(token_level)
    assert got == 2 < points and any("selected by its own draw" in m for m in messages)


def test_one_action_for_the_whole_word():
    def word_action(input_ids, attention_mask, special_ids, mask_id, select, action, random_tokens, p,
                    continuation=None):
        per_word = lambda z: first_piece_draw(z, continuation)  # noqa: E731
        return masking(input_ids, attention_mask, special_ids, mask_id, select, per_word(action),
                       per_word(random_tokens.float()).long(), p, per_word)

    got, _, messages = earned(word_action)
    assert got < 8 and any("first piece's action" in m for m in messages)


def test_any_piece_draw_selects_the_word():
    def any_piece(input_ids, attention_mask, special_ids, mask_id, select, action, random_tokens, p,
                  continuation=None):
        if continuation is None:
            return good(input_ids, attention_mask, special_ids, mask_id, select, action, random_tokens, p)
        word = torch.cumsum(~continuation, dim=1)  # word number of each piece
        hit = (select < p) & ~continuation | (select < p) & continuation
        any_hit = torch.zeros_like(hit)
        for b in range(word.shape[0]):
            for t in range(word.shape[1]):
                any_hit[b, t] = hit[b][word[b] == word[b, t]].any()
        return masking(input_ids, attention_mask, special_ids, mask_id, torch.where(any_hit, 0.0, 1.0), action,
                       random_tokens, p, lambda s: s)

    got, _, messages = earned(any_piece)
    assert got < 8 and any("continuation pieces" in m for m in messages)


def test_special_tokens_masked():
    def no_specials(input_ids, attention_mask, special_ids, mask_id, select, action, random_tokens, p,
                    continuation=None):
        return good(input_ids, attention_mask, [], mask_id, select, action, random_tokens, p, continuation)

    got, _, messages = earned(no_specials)
    assert got < 8 and any("labels" in m for m in messages)
