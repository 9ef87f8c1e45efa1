"""companion: the tested code of the course "Transformers from scratch: GPT, BERT and T5".

Modules are organised by concept, not by chapter (the chapter that defines
each is in brackets). Every public module is listed here
(``tests/test_layout.py`` checks that this map names each one).

Building blocks

* :mod:`companion.recurrence`: the RNN loop, FLOP counts, path lengths, timings (1)
* :mod:`companion.attention`: scaled dot-product attention and the attention layers (2)
* :mod:`companion.masks`: boolean attention masks, True = may attend (2, 6)
* :mod:`companion.positional`: sinusoidal, learned, T5 buckets, RoPE, ALiBi (3)
* :mod:`companion.blocks`: norms, (gated) feed-forward networks, the pre/post-LN residual blocks (4, 5)
* :mod:`companion.kv_cache`: the key/value caches of incremental decoding (9, 10)
* :mod:`companion.moe`: mixture-of-experts feed-forward, routing, its losses and the MoE GPT (14)
* :mod:`companion.efficient_attention`: sparse, low-rank, random-feature attention, fewer KV heads (13)
* :mod:`companion.tiled_attention`: exact attention tile by tile with an online softmax (13)

Models and what is built on them

* :mod:`companion.models`: one module per model (Transformer, GPT, BERT and its variants, T5, BART, DeBERTa,
  the small causal LM of the position and depth experiments);
  ``models/_hf.py`` is the one Hugging Face loader helper
* :mod:`companion.generation`: greedy, sampling and beam-search decoding (10)
* :mod:`companion.diagnostics`: gradient norms per layer, warm-up runs (5)
* :mod:`companion.calculators`: closed-form parameter, FLOP and memory counts (12)
* :mod:`companion.experiments`: chapter experiments built from the models (3, 12, 15)

Data and training

* :mod:`companion.corpus`, :mod:`companion.data`: the frozen offline text corpus and batching
* :mod:`companion.tokenizers`: byte-level BPE, WordPiece and Unigram from scratch (7, 9, 11)
* :mod:`companion.toy_tasks`: toy sequence-to-sequence tasks on digit strings (4)
* :mod:`companion.training`: the one training loop and the one ``lm_loss`` every chapter uses
* :mod:`companion.device`: the device a chapter computes on (CUDA, then MPS, then the CPU) and its mixed precision
* :mod:`companion.mlm`, :mod:`companion.pretraining`: masked-LM data and pre-training of an encoder (7)
* :mod:`companion.finetuning`: fine-tuning a pre-trained BERT on three small tasks (7)
* :mod:`companion.distillation`: distilling BERT into a shallower student (8)
* :mod:`companion.noising`, :mod:`companion.span_corruption`: BART's and T5's pre-training corruptions (11)
* :mod:`companion.text_to_text`, :mod:`companion.text_to_text_t5`: prefixed toy tasks and one small T5 on them (11)
* :mod:`companion.precision`, :mod:`companion.memory`: low-precision floats, loss scaling, peak memory (15)
* :mod:`companion.distributed`: data, tensor and pipeline parallelism with ``torch.distributed`` (15)
* :mod:`companion.pruning`: head importance and head pruning (15)

Notebooks

* :mod:`companion.viz`, :mod:`companion.notebook`: plots, widgets, seeding, ``glue``
* :mod:`companion.diagrams`: boxes, arrows, stacks and grids for the conceptual diagrams of the models
* :mod:`companion.checkpoints`: the small trained checkpoints the notebooks load
* :mod:`companion.grading`: the checks of the graded exercises (the instructor's grader is
  the separate ``companion_grader``, in ``grader/`` of the repository)
"""

__version__ = "0.1.0"
