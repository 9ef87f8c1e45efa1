"""companion: the tested code of the course "Transformers from scratch: GPT, BERT and T5".

Modules are organised by concept, not by chapter:

* :mod:`companion.attention`: scaled dot-product and multi-head attention (Chapter 2)
* :mod:`companion.masks`: boolean attention masks, True = may attend (Chapters 2, 6)
* :mod:`companion.blocks`: norms, feed-forward, pre/post-LN blocks (Chapters 4, 5)
* :mod:`companion.data`, :mod:`companion.training`: offline corpus and one training loop
* :mod:`companion.viz`: plots and widgets
* :mod:`companion.notebook`: seeding and ``glue`` for the notebooks
* :mod:`companion.grading`: checks for the graded exercises, and the instructor's grader
"""

__version__ = "0.1.0"
