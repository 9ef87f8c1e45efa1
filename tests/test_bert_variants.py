"""RoBERTa, ALBERT and ELECTRA (Chapter 8) against Hugging Face models built from small random configs."""

from __future__ import annotations

import pytest
import torch

from companion.models.albert import ALBERT_CONFIGS, from_hf_albert
from companion.models.bert import BertConfig, BertForMaskedLM, BertModel, padding_position_ids
from companion.calculators import count_parameters
from companion.models.electra import (ElectraDiscriminator, corrupt_with_generator, electra_loss, from_hf_electra,
                                      replaced_token_labels)
from companion.models.roberta import ROBERTA_BASE, from_hf_roberta

transformers = pytest.importorskip("transformers")
ATOL = 1e-5
SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _perturbed(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # random LayerNorms and biases, so that a swapped or dropped tensor shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
    return model.eval()


def _batch(pad_id, seed=0, b=3, t=10):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 99, (b, t), generator=g)
    att = torch.ones(b, t, dtype=torch.long)
    att[1, -4:] = 0
    att[2, -1:] = 0
    ids[att == 0] = pad_id
    return ids, att


def _assert_same_outputs(out, ref, att, head):
    real = att.bool()  # padded positions' outputs are used by nobody; compare the real ones
    if head == "mlm":
        torch.testing.assert_close(out.mlm_logits[real], ref.logits[real], atol=ATOL, rtol=ATOL)
    else:
        torch.testing.assert_close(out.hidden[real], ref.last_hidden_state[real], atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(out.pooled, ref.pooler_output, atol=ATOL, rtol=ATOL)


# --- RoBERTa ------------------------------------------------------------------------------------------

def test_padding_position_ids_by_hand():
    ids = torch.tensor([[0, 7, 8, 2, 1, 1], [0, 1, 9, 2, 1, 1]])
    assert padding_position_ids(ids, pad_id=1).tolist() == [[2, 3, 4, 5, 1, 1], [2, 1, 3, 4, 1, 1]]


@pytest.mark.parametrize("head", ["model", "mlm"])
def test_roberta_matches_hugging_face_with_padding(head):
    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(max_position_embeddings=40, pad_token_id=1, type_vocab_size=1, **SIZES)
    cls = transformers.RobertaForMaskedLM if head == "mlm" else transformers.RobertaModel
    hf = _perturbed(cls(cfg))
    ours = from_hf_roberta(hf)
    assert isinstance(ours, BertForMaskedLM if head == "mlm" else BertModel)
    ids, att = _batch(pad_id=1)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=att)
        out = ours(ids, att)
    _assert_same_outputs(out, ref, att, head)


def test_roberta_positions_matter():
    # with BERT's positions 0..T-1 the same weights give other outputs: the switch is load-bearing
    torch.manual_seed(0)
    hf = _perturbed(transformers.RobertaModel(transformers.RobertaConfig(
        max_position_embeddings=40, pad_token_id=1, type_vocab_size=1, **SIZES)))
    ours = from_hf_roberta(hf)
    ids, att = _batch(pad_id=1)
    with torch.no_grad():
        plain = ours(ids, att, position_ids=torch.arange(ids.shape[1])).hidden
        ref = hf(input_ids=ids, attention_mask=att).last_hidden_state
    assert (plain - ref).abs().max() > 1e-2


def test_roberta_base_count_matches_hugging_face():
    with torch.device("meta"):
        ours = BertModel(ROBERTA_BASE)
        # roberta-base's released config.json: 50,265 tokens, 514 positions, one segment, pad id 1
        hf = transformers.RobertaModel(transformers.RobertaConfig(
            vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1))
    assert count_parameters(ours) == sum(p.numel() for p in hf.parameters())


# --- ALBERT -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("head", ["model", "mlm"])
def test_albert_matches_hugging_face_with_padding(head):
    torch.manual_seed(0)
    cfg = transformers.AlbertConfig(embedding_size=12, max_position_embeddings=40, hidden_act="gelu_new", **SIZES)
    cls = transformers.AlbertForMaskedLM if head == "mlm" else transformers.AlbertModel
    hf = _perturbed(cls(cfg))
    ours = from_hf_albert(hf)
    assert ours.cfg.share_layers and ours.cfg.embedding_size == 12
    ids, att = _batch(pad_id=0, seed=1)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=att)
        out = ours(ids, att)
    _assert_same_outputs(out, ref, att, head)


def test_albert_shares_one_block():
    cfg = BertConfig(vocab_size=50, d_model=16, n_layers=4, n_heads=2, d_ff=32, embedding_size=8, share_layers=True)
    model = BertModel(cfg, pooler=False)
    assert all(b is model.blocks[0] for b in model.blocks)
    one_layer = BertModel(BertConfig(**{**cfg.__dict__, "n_layers": 1}), pooler=False)
    assert count_parameters(model) == count_parameters(one_layer)  # depth costs no parameters
    # factorised embeddings: V E + E D + E D-free tables, by hand
    v, e, d, p, s = 50, 8, 16, cfg.max_positions, cfg.n_segments
    assert count_parameters(model.embeddings) == (v + p + s) * e + 2 * e + (e * d + d)


@pytest.mark.parametrize("size", ["base", "large", "xlarge", "xxlarge"])
def test_albert_counts_match_hugging_face(size):
    cfg = ALBERT_CONFIGS[size]
    with torch.device("meta"):
        ours = BertModel(cfg)
        hf = transformers.AlbertModel(transformers.AlbertConfig(
            vocab_size=cfg.vocab_size, embedding_size=cfg.embedding_size, hidden_size=cfg.d_model,
            num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff))
    assert count_parameters(ours) == sum(p.numel() for p in hf.parameters())


def test_albert_rejects_grouped_layers():
    hf_cfg = transformers.AlbertConfig(num_hidden_groups=2, **SIZES)
    from companion.models.albert import albert_config_from_hf
    with pytest.raises(ValueError, match="num_hidden_groups"):
        albert_config_from_hf(hf_cfg)


# --- ELECTRA ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("embedding_size", [12, 32])
def test_electra_discriminator_matches_hugging_face_with_padding(embedding_size):
    torch.manual_seed(0)
    hf = _perturbed(transformers.ElectraForPreTraining(transformers.ElectraConfig(
        embedding_size=embedding_size, max_position_embeddings=40, **SIZES)))
    ours = from_hf_electra(hf)
    assert isinstance(ours, ElectraDiscriminator)
    assert (ours.bert.embeddings.project is None) == (embedding_size == 32)
    ids, att = _batch(pad_id=0, seed=2)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=att).logits
        out = ours(ids, att)
    real = att.bool()
    torch.testing.assert_close(out[real], ref[real], atol=ATOL, rtol=ATOL)


def test_replaced_token_labels_and_corruption():
    original = torch.tensor([[5, 6, 7, 8]])
    assert replaced_token_labels(original, torch.tensor([[5, 9, 7, 8]])).tolist() == [[0, 1, 0, 0]]
    # a generator sure of the right token at position 1 and of a wrong one at position 2
    logits = torch.full((1, 4, 10), -30.0)
    logits[0, 1, 6] = 30.0
    logits[0, 2, 3] = 30.0
    masked = torch.tensor([[5, 4, 4, 8]])  # 4 = [MASK]
    labels = torch.tensor([[-100, 6, 7, -100]])
    corrupted, originals = corrupt_with_generator(logits, masked, labels)
    assert corrupted.tolist() == [[5, 6, 3, 8]] and originals.tolist() == [[5, 6, 7, 8]]
    # the right sample counts as original: only position 2 is "replaced"
    assert replaced_token_labels(originals, corrupted).tolist() == [[0, 0, 1, 0]]


def test_electra_loss_weights_the_discriminator_by_lambda():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_positions=16, dropout=0.0)
    gen, disc = BertForMaskedLM(cfg), ElectraDiscriminator(cfg)
    ids = torch.randint(5, 30, (4, 12))
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]
    masked = ids.clone()
    masked[:, ::3] = 4
    att = torch.ones_like(ids)
    loss = electra_loss(gen, disc, masked, labels, att, disc_weight=50.0, sampler=torch.Generator().manual_seed(0))
    assert torch.allclose(loss.total, loss.generator + 50.0 * loss.discriminator)
    assert 0.0 < loss.replaced_fraction <= 1 / 3 + 1e-6  # only masked positions can change
    loss.total.backward()
    assert gen.bert.embeddings.tok_emb.weight.grad is not None and disc.out.weight.grad is not None


def test_recorded_electra_vs_bert_run_has_equal_compute():
    import json
    from importlib import resources

    rec = json.loads((resources.files("companion.checkpoints") / "ch08_electra_vs_bert.json").read_text())
    b, e = rec["models"]["bert"], rec["models"]["electra"]
    assert b["steps"] == rec["bert_steps"] and len(rec["seeds"]) >= 3
    assert abs(e["pretrain_flops"] - b["pretrain_flops"]) <= e["flops_per_step"] / 2  # equal to one step
    assert e["flops_per_step"] > b["flops_per_step"]  # the generator costs extra
    assert b["encoder_parameters"] == e["encoder_parameters"]  # the same encoder is compared
    for row in (b, e):
        assert sorted(row["per_seed"]) == sorted(str(s) for s in rec["seeds"])  # every seed recorded
        for task in ("replaced_word", "capitalisation"):
            values = [r[task] for r in row["per_seed"].values()]
            assert 0.0 <= min(values) <= row[task] <= max(values) <= 1.0  # the mean lies in the spread
            assert row[f"{task}_spread"] == {"mean": row[task], "min": min(values), "max": max(values)}


def _electra_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "ch08_electra_vs_bert.py"
    spec = importlib.util.spec_from_file_location("ch08_electra_vs_bert", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_electra_script_generator_shares_the_discriminators_embeddings():
    script = _electra_script()
    cfg = BertConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_positions=16)
    model = script.build("electra", cfg)
    gen, disc = model["generator"], model["discriminator"]
    for name in ("tok_emb", "pos_emb", "seg_emb"):  # one table, used by both networks' inputs
        assert getattr(gen.bert.embeddings, name) is getattr(disc.bert.embeddings, name), name
    assert gen.mlm.tok_emb is disc.bert.embeddings.tok_emb  # and by the generator's output layer
    assert gen.cfg.d_model == cfg.d_model // 2  # a generator half the discriminator's width


def test_recorded_electra_discriminator_learned_more_than_the_base_rate():
    """The first recorded run's discriminator sat at the entropy H(p) of the replaced share p (it answered p
    for every token, to four decimals): over every seed's last 50 steps its loss must stay below H(p)."""
    import json
    import math
    from importlib import resources

    rec = json.loads((resources.files("companion.checkpoints") / "ch08_electra_vs_bert.json").read_text())
    for seed, row in rec["models"]["electra"]["per_seed"].items():
        entropy = [-(p * math.log(p) + (1 - p) * math.log(1 - p)) for p in row["replaced_fraction"][-5:]]
        gap = sum(h - loss for h, loss in zip(entropy, row["discriminator_loss"][-5:])) / 5
        assert gap > 0.005, (seed, gap)  # nats per token below the constant answer
        assert sum(row["replaced_detected"][-5:]) / 5 > 0.01, seed  # it flags some replaced tokens


def _rtd_loss_after_training(replaced_prior, steps=40):
    """A small discriminator trained on uniformly random replacements (15%) of a 35-token 'language' at the
    Chapter 8 learning rate; returns (its BCE on a batch, the entropy of the replaced share)."""
    import math

    import torch.nn.functional as F

    from companion.training import TrainConfig, train

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_positions=32)
    disc = ElectraDiscriminator(cfg, replaced_prior=replaced_prior)
    g = torch.Generator().manual_seed(0)

    def batch(step):
        ids = torch.randint(5, 40, (16, 32), generator=g)
        swap = torch.rand(16, 32, generator=g) < 0.15
        corrupted = torch.where(swap, torch.randint(5, 300, (16, 32), generator=g), ids)
        return corrupted, (corrupted != ids).float()

    train(disc, lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]), b[1]), batch,
          TrainConfig(steps=steps, lr=2e-3, warmup_steps=steps // 10), progress=False)
    corrupted, target = batch(0)
    with torch.no_grad():
        loss = F.binary_cross_entropy_with_logits(disc.eval()(corrupted), target).item()
    p = target.mean().item()
    return loss, -(p * math.log(p) + (1 - p) * math.log(1 - p))


def test_discriminator_started_at_the_base_rate_learns_where_a_zero_bias_stalls():
    # Chapter 8's diagnosis in small: from a zero output bias the discriminator's loss stays at the entropy
    # of "always the base rate"; started at the base rate's log-odds, it learns the (easy) replacements.
    loss, entropy = _rtd_loss_after_training(replaced_prior=0.15)
    assert loss < 0.75 * entropy
    loss, entropy = _rtd_loss_after_training(replaced_prior=None)
    assert loss > 0.9 * entropy


def test_discriminator_replaced_prior_sets_the_starting_probability():
    cfg = BertConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_positions=16, dropout=0.0)
    torch.manual_seed(0)
    disc = ElectraDiscriminator(cfg, replaced_prior=0.15).eval()
    with torch.no_grad():
        prob = torch.sigmoid(disc(torch.randint(5, 50, (2, 12)))).mean().item()
    assert abs(prob - 0.15) < 0.05  # small initial weights: close to the prior for every token
    for bad in (0.0, 1.0, True, -0.1):
        with pytest.raises(ValueError, match="replaced_prior"):
            ElectraDiscriminator(cfg, replaced_prior=bad)
