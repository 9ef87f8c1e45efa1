"""Complete models built from :mod:`companion.blocks`, one file per model.

* :mod:`companion.models.transformer`: the original encoder-decoder (Chapter 4)
* :mod:`companion.models.bert`: BERT, its pre-training heads and loaders (Chapter 7)
* :mod:`companion.models.gpt`: GPT-1 and GPT-2 style decoder-only models (Chapter 9)
* :mod:`companion.models.encoder_decoder`: one configurable encoder-decoder; T5 and BART are configs of it (Chapter 11)
* :mod:`companion.models.t5`: T5 v1.0/v1.1 configs, sizes and the Hugging Face loader (Chapter 11)
* :mod:`companion.models.bart`: BART as a config of the same encoder-decoder, and its loader (Chapter 11)
* :mod:`companion.models.position_lm`: a small LM with a choice of positional scheme (Chapter 3)

Every model is assembled from :class:`companion.blocks.Block` and
:class:`companion.attention.MultiHeadAttention`; ``from_hf_*`` loaders map
Hugging Face names with :mod:`companion.models._hf` (those names appear nowhere else).

Import the model you need from its module, e.g.
``from companion.models.transformer import Transformer, TransformerConfig``.
"""
