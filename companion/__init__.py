"""companion: the tested code of the course "Transformers from scratch: GPT, BERT and T5".

Modules are organised by concept, not by chapter (the chapter that defines
each is in brackets):

* :mod:`companion.attention`: scaled dot-product and multi-head attention (2), with the
  extension points of later models: score bias, own head size, scale, grouped kv heads, cache
* :mod:`companion.masks`: boolean attention masks, True = may attend (2, 6)
* :mod:`companion.recurrence`: the RNN loop, FLOP counts, path lengths, timings (1)
* :mod:`companion.positional`: sinusoidal, learned, T5 buckets, RoPE, ALiBi (3)
* :mod:`companion.blocks`: norms, (gated) feed-forward, the open pre/post-LN ``Block`` (4, 5)
* :mod:`companion.diagnostics`: gradient norms per layer, warm-up runs (5)
* :mod:`companion.models`: the encoder-decoder (4), a positional-scheme LM (3), GPT (9);
  ``models/_hf.py`` is the one Hugging Face loader helper
* :mod:`companion.experiments`: chapter experiments built from the models (3)
* :mod:`companion.kv_cache`, :mod:`companion.generation`: caching and decoding (9, 10)
* :mod:`companion.tokenizers`: byte-level BPE from scratch (9)
* :mod:`companion.toy_tasks`, :mod:`companion.data`: toy seq2seq tasks, the offline text corpus
* :mod:`companion.training`: the one training loop and the one ``lm_loss`` every chapter uses
* :mod:`companion.viz`, :mod:`companion.notebook`: plots, widgets, seeding, ``glue``
* :mod:`companion.grading`: checks for the graded exercises (the instructor's grader is
  the separate ``companion_grader``, in ``grader/`` of the repository)
"""

__version__ = "0.1.0"
