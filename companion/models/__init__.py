"""Complete models built from :mod:`companion.blocks`, one file per model.

Every model module is listed here (``tests/test_layout.py`` checks that this map names each one):

* :mod:`companion.models.small_lm`: a small causal LM with a choice of positional scheme and norm placement (Chapters 3, 5)
* :mod:`companion.models.seq2seq`: what every encoder-decoder shares: forward, decode, the cache, checks (Chapters 4, 11)
* :mod:`companion.models.transformer`: the original encoder-decoder (Chapter 4)
* :mod:`companion.models.bert`: BERT, its pre-training and fine-tuning heads, loaders (Chapter 7)
* :mod:`companion.models.roberta`: RoBERTa as a config of BERT, and its loader (Chapter 8)
* :mod:`companion.models.albert`: ALBERT (factorised embeddings, shared layers) as a config of BERT (Chapter 8)
* :mod:`companion.models.electra`: ELECTRA's discriminator and generator on BERT's encoder (Chapter 8)
* :mod:`companion.models.deberta`: DeBERTa-v2/v3, disentangled attention with relative positions (Chapter 8)
* :mod:`companion.models.gpt`: GPT-1 and GPT-2 style decoder-only models (Chapter 9)
* :mod:`companion.models.llama`: today's decoders, Llama, Qwen2 and Qwen3, from the course's parts, and their loaders (Chapter 16)
* :mod:`companion.models.encoder_decoder`: one configurable encoder-decoder; T5 and BART are configs of it (Chapter 11)
* :mod:`companion.models.t5`: T5 v1.0/v1.1 configs, sizes and the Hugging Face loader (Chapter 11)
* :mod:`companion.models.bart`: BART as a config of the same encoder-decoder, and its loader (Chapter 11)

Every model is assembled from the blocks of :mod:`companion.blocks` and the
attention layers of :mod:`companion.attention`; ``from_hf_*`` loaders map
Hugging Face names with :mod:`companion.models._hf` (those names appear nowhere else).

Import the model you need from its module, e.g.
``from companion.models.transformer import Transformer, TransformerConfig``.
"""
