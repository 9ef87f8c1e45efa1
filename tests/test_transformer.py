"""companion.models.transformer: the original post-LN encoder-decoder.

The layers are checked against ``torch.nn.TransformerEncoderLayer`` and
``torch.nn.TransformerDecoderLayer`` (post-LN, ReLU, dropout 0) holding the
same weights: an implementation written independently of the companion's.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.blocks import TransformerBlock
from companion.masks import causal_mask
from companion.models.transformer import (
    Transformer,
    TransformerConfig,
    block_from_torch_decoder_layer,
    cross_attention_weights,
    decoder_self_mask,
    greedy_decode,
    seq2seq_loss,
    shift_right,
)

D, H, F_FF = 24, 3, 40  # odd-ish sizes: d_head = 8, d_ff not a multiple of d_model
B, S, T = 3, 13, 7


def _src_valid():
    lengths = torch.tensor([13, 9, 4])
    return torch.arange(S)[None, :] < lengths[:, None]  # (B, S) True = real


def _torch_encoder_layer(seed=0):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(D, H, F_FF, dropout=0.0, activation="relu", batch_first=True, norm_first=False)
    with torch.no_grad():  # non-trivial LayerNorm parameters, so that a swapped norm would show
        for norm in (layer.norm1, layer.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0, 0.1)
    return layer.train()  # training mode with dropout 0: torch's eval fast path (nested tensors) stays off


def _torch_decoder_layer(seed=0):
    torch.manual_seed(seed)
    layer = nn.TransformerDecoderLayer(D, H, F_FF, dropout=0.0, activation="relu", batch_first=True, norm_first=False)
    with torch.no_grad():
        for norm in (layer.norm1, layer.norm2, layer.norm3):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0, 0.1)
    return layer.train()


def test_encoder_layer_matches_torch_post_ln():
    layer = _torch_encoder_layer()
    block = TransformerBlock.from_torch(layer)
    x = torch.randn(B, S, D)
    valid = _src_valid()
    with torch.no_grad():
        want = layer(x, src_key_padding_mask=~valid)  # torch: True = blocked
        got = block(x, valid[:, None, None, :])  # companion: True = may attend
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_encoder_layer_differs_from_pre_ln():
    """The test above would fail for the other wiring: pre-LN gives a different output."""
    layer = _torch_encoder_layer()
    block = TransformerBlock.from_torch(layer)
    block.norm_first = True
    x = torch.randn(B, S, D)
    with torch.no_grad():
        assert (block(x) - layer(x)).abs().max() > 1e-2


def test_decoder_layer_matches_torch_post_ln():
    layer = _torch_decoder_layer()
    block = block_from_torch_decoder_layer(layer)
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    src_valid = _src_valid()
    tgt_valid = torch.arange(T)[None, :] < torch.tensor([7, 5, 2])[:, None]  # (B, T)
    with torch.no_grad():
        want = layer(x, memory, tgt_mask=~causal_mask(T), tgt_key_padding_mask=~tgt_valid,
                     memory_key_padding_mask=~src_valid)
        got = block(x, memory, decoder_self_mask(tgt_valid), src_valid[:, None, None, :])
    # torch gives NaN nowhere here: every query sees at least key 0 (a real token)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_decoder_block_from_torch_rejects_pre_ln_and_gelu():
    with pytest.raises(ValueError, match="post-LN"):
        block_from_torch_decoder_layer(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True, norm_first=True))
    with pytest.raises(ValueError, match="relu"):
        block_from_torch_decoder_layer(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True, activation="gelu"))
    with pytest.raises(TypeError):
        block_from_torch_decoder_layer(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True))


def _small_model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=17, d_model=D, n_heads=H, d_ff=F_FF, n_encoder_layers=2,
                            n_decoder_layers=2, max_positions=32, dropout=0.0, **kw)
    return Transformer(cfg).eval()


def _sinusoid(p, i, d):
    """PE[p, i] from section 3.5, written with math.sin / math.cos."""
    angle = p / 10000 ** (2 * (i // 2) / d)
    return math.sin(angle) if i % 2 == 0 else math.cos(angle)


def test_embedding_is_scaled_token_plus_sinusoid():
    model = _small_model()
    ids = torch.tensor([[5, 1, 16, 0, 9]])
    x = model.embed_tokens(ids)[0]
    for p, tok in enumerate(ids[0].tolist()):
        for i in (0, 1, 6, D - 1):
            want = model.tok_emb.weight[tok, i].item() * math.sqrt(D) + _sinusoid(p, i, D)
            assert x[p, i].item() == pytest.approx(want, abs=1e-5)


def test_encode_and_decode_match_torch_stacks():
    """The whole model = scaled embedding + PE, torch encoder/decoder layers, the tied output matrix."""
    model = _small_model(seed=3)
    torch.manual_seed(4)
    enc_layers = [_torch_encoder_layer(seed=10 + i) for i in range(2)]
    dec_layers = [_torch_decoder_layer(seed=20 + i) for i in range(2)]
    for i in range(2):
        model.encoder[i].load_state_dict(TransformerBlock.from_torch(enc_layers[i]).state_dict())
        model.decoder[i].load_state_dict(block_from_torch_decoder_layer(dec_layers[i]).state_dict())
    src_valid = _src_valid()
    src = torch.randint(1, 17, (B, S)).masked_fill(~src_valid, 0)
    tgt_in = torch.randint(1, 17, (B, T))
    pe = torch.tensor([[_sinusoid(p, i, D) for i in range(D)] for p in range(S)])
    emb = model.tok_emb.weight
    with torch.no_grad():
        x = emb[src] * math.sqrt(D) + pe[:S]
        for layer in enc_layers:
            x = layer(x, src_key_padding_mask=~src_valid)
        y = emb[tgt_in] * math.sqrt(D) + pe[:T]
        for layer in dec_layers:
            y = layer(y, x, tgt_mask=~causal_mask(T), memory_key_padding_mask=~src_valid)
        want = y @ emb.T  # tied pre-softmax projection
        got = model(src, tgt_in, src_valid)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert model.lm_head.weight is model.tok_emb.weight


def test_decoder_is_causal_and_ignores_source_padding():
    model = _small_model()
    torch.manual_seed(1)
    src_valid = _src_valid()
    src = torch.randint(1, 17, (B, S))
    tgt_in = torch.randint(1, 17, (B, T))
    with torch.no_grad():
        logits = model(src, tgt_in, src_valid)
        tgt2 = tgt_in.clone()
        tgt2[:, 4:] = torch.randint(1, 17, (B, T - 4))  # change the future
        assert torch.allclose(model(src, tgt2, src_valid)[:, :4], logits[:, :4], atol=1e-6)
        src2 = torch.where(src_valid, src, torch.randint(1, 17, (B, S)))  # change only padded source positions
        assert torch.allclose(model(src2, tgt_in, src_valid), logits, atol=1e-6)
        assert (model(src2, tgt_in) - logits).abs().max() > 1e-3  # ... which matter once they are not masked


def test_shift_right_hand_case():
    tgt = torch.tensor([[7, 8, 9, 2], [5, 2, 0, 0], [4, 2, -100, -100]])
    want = torch.tensor([[1, 7, 8, 9], [1, 5, 2, 0], [1, 4, 2, 0]])
    assert torch.equal(shift_right(tgt, bos_id=1, pad_id=0), want)
    assert torch.equal(shift_right(torch.tensor([[3]]), bos_id=1), torch.tensor([[1]]))
    with pytest.raises(ValueError):
        shift_right(torch.tensor([1, 2, 3]), bos_id=1)
    with pytest.raises(TypeError):
        shift_right(torch.ones(2, 3), bos_id=1)


def test_decoder_self_mask_hand_case():
    m = decoder_self_mask(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert m.shape == (2, 1, 3, 3) and m.dtype == torch.bool
    assert m[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert m[1, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_seq2seq_loss_is_cross_entropy_over_real_targets():
    model = _small_model()
    torch.manual_seed(2)
    src = torch.randint(3, 17, (B, S))
    tgt = torch.tensor([[5, 6, 7, 2, 0, 0, 0], [8, 2, 0, 0, 0, 0, 0], [9, 9, 9, 9, 9, 9, 2]])
    loss = seq2seq_loss(model, src, tgt, bos_id=1)
    tgt_in = torch.cat([torch.ones(B, 1, dtype=torch.long), tgt[:, :-1]], dim=1)
    logits = model(src, tgt_in)
    logp = logits.log_softmax(-1)
    terms = [-logp[b, t, tgt[b, t]] for b in range(B) for t in range(T) if tgt[b, t] != 0]
    assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), abs=1e-5)
    # right padding: the decoder's padding mask only affects padded queries, whose loss is ignored
    assert loss.item() == pytest.approx(F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=0).item(), abs=1e-5)


def test_greedy_decode_agrees_with_teacher_forced_argmax():
    model = _small_model(seed=5)
    torch.manual_seed(6)
    src = torch.randint(3, 17, (B, 9))
    out = greedy_decode(model, src, bos_id=1, eos_id=2, max_new_tokens=11)
    assert out.shape[0] == B and 1 <= out.shape[1] <= 11
    tgt_in = torch.cat([torch.ones(B, 1, dtype=torch.long), out[:, :-1]], dim=1)
    with torch.no_grad():
        pred = model(src, tgt_in).argmax(-1)
    for b in range(B):
        row = out[b].tolist()
        n = row.index(2) + 1 if 2 in row else len(row)
        assert pred[b, :n].tolist() == row[:n]
        assert all(tok == 0 for tok in row[n:])  # padding after EOS


def test_greedy_decode_stops_at_eos():
    model = _small_model(seed=0)
    with torch.no_grad():
        model.lm_head.weight.zero_()  # (also the tied embedding) every logit 0 ...
    bias = torch.zeros(17)
    bias[2] = 10.0  # ... except EOS: the first token generated is EOS
    model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    out = greedy_decode(model, torch.randint(3, 17, (2, 5)), bos_id=1, eos_id=2, max_new_tokens=8)
    assert out.tolist() == [[2], [2]]


def test_config_and_input_checks():
    with pytest.raises(ValueError, match="divisible"):
        TransformerConfig(vocab_size=10, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="pad_id"):
        TransformerConfig(vocab_size=10, pad_id=10)
    model = _small_model()
    with pytest.raises(ValueError, match=r"src must lie in \[0, 17\)"):
        model(torch.tensor([[1, 17]]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.ones(1, 33, dtype=torch.long), torch.tensor([[1]]))
    with pytest.raises(TypeError):
        model(torch.ones(1, 3), torch.tensor([[1]]))
    with pytest.raises(ValueError):
        model.decode(torch.ones(2, 3, dtype=torch.long), torch.zeros(2, 4, D), torch.ones(3, 4, dtype=torch.bool))


def test_cross_attention_weights_are_distributions_over_real_source_tokens():
    model = _small_model(seed=8)
    torch.manual_seed(9)
    src_valid = _src_valid()
    src = torch.randint(3, 17, (B, S)).masked_fill(~src_valid, 0)
    tgt_in = torch.randint(1, 17, (B, T))
    weights = cross_attention_weights(model, src, tgt_in, src_valid)
    assert len(weights) == 2 and all(w.shape == (B, H, T, S) for w in weights)
    for w in weights:
        torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))
        assert (w.masked_select(~src_valid[:, None, None, :].expand_as(w)) == 0).all()
    # the recorded weights reproduce the layer's output: out = merge(weights @ v) @ W_o + b_o
    block = model.decoder[0]
    captured = {}
    block.cross_attn.register_forward_hook(lambda m, a, o: captured.update(out=o))
    block.cross_attn.register_forward_pre_hook(lambda m, a: captured.update(ctx=a[1]))  # (x, context, mask)
    with torch.no_grad():
        model(src, tgt_in, src_valid)
        v = block.cross_attn.kv(captured["ctx"])[..., D:].view(B, S, H, D // H).transpose(1, 2)  # (B, H, S, Dh)
        heads = (weights[0] @ v).transpose(1, 2).reshape(B, T, D)
        torch.testing.assert_close(block.cross_attn.out(heads), captured["out"], rtol=1e-5, atol=1e-5)


def test_cached_decoding_and_beam_search_through_the_generation_protocol():
    from companion.generation import beam_search, generate

    model = _small_model(seed=5).eval()
    torch.manual_seed(6)
    src = torch.randint(3, 17, (B, 9))
    src[1, 6:] = model.cfg.pad_id  # a padded source
    plain = greedy_decode(model, src, bos_id=1, eos_id=2, max_new_tokens=11)
    assert torch.equal(greedy_decode(model, src, bos_id=1, eos_id=2, max_new_tokens=11, use_cache=True), plain)
    # Teacher forcing on the decoded prefix equals cached step-by-step logits (the cache holds self and cross keys).
    lm = model.decoder_lm(src)
    tgt_in = torch.cat([torch.ones(B, 1, dtype=torch.long), plain], dim=1)
    cache = model.new_cache()
    with torch.no_grad():
        steps = torch.cat([lm(tgt_in[:, i:i + 1], cache=cache) for i in range(tgt_in.shape[1])], dim=1)
        full = model(src, tgt_in)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
    assert cache.cross_attn.length == 9 and cache.length == tgt_in.shape[1]
    # One beam is greedy; beams of a padded batch run with memory repeated per beam.
    start = torch.ones(B, 1, dtype=torch.long)
    one = beam_search(lm, start, num_beams=1, max_new_tokens=6)
    assert torch.equal(one.sequences, generate(lm, start, 6))
    for use_cache in (True, False):
        out = beam_search(lm, start, num_beams=3, max_new_tokens=6, eos_token_id=2, pad_token_id=0, use_cache=use_cache)
        assert out.sequences.shape[0] == B
        if use_cache:
            first = out
        else:
            assert torch.equal(out.sequences, first.sequences)


def test_cross_attention_weights_are_rows_of_probabilities_even_from_a_training_model():
    from companion.models.transformer import cross_attention_weights

    model = Transformer(TransformerConfig(vocab_size=17, d_model=16, n_heads=2, d_ff=24, n_encoder_layers=1,
                                          n_decoder_layers=2, max_positions=16, dropout=0.5)).train()
    src = torch.randint(3, 17, (2, 6))
    weights = cross_attention_weights(model, src, torch.randint(3, 17, (2, 4)))
    assert model.training and len(weights) == 2  # mode restored; no dropout on the recorded weights
    for w in weights:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 4))


def test_recorded_reverse_run_is_shipped_and_consistent():
    # Chapter 4 quotes this recorded run (scripts/ch04_train_reverse.py) and checks its live run against it.
    import json
    from importlib import resources

    rec = json.loads((resources.files("companion.checkpoints") / "ch04_reverse.json").read_text())
    assert rec["config"]["train_steps"] == 1500 and rec["config"]["n_test"] == 2000
    assert 0.99 <= rec["test_accuracy"] <= 1.0 and 0 < rec["final_eval_loss"] < 0.05
    assert rec["step_99"] % 150 == 0 and 0 < rec["step_99"] <= 1500  # an evaluation step
    assert len(rec["xattn_hit"]) == len(rec["xattn_weight"]) == 2  # two decoder layers
    assert all(0 <= h <= 1 for h in rec["xattn_hit"] + rec["xattn_weight"]) and max(rec["xattn_hit"]) >= 0.8
