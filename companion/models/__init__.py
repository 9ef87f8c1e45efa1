"""Complete models built from :mod:`companion.blocks`, one file per model.

* :mod:`companion.models.transformer`: the original encoder-decoder (Chapter 4)
* :mod:`companion.models.gpt`: GPT-1 and GPT-2 style decoder-only models (Chapter 9)

Import the model you need from its module, e.g.
``from companion.models.transformer import Transformer, TransformerConfig``.
"""
