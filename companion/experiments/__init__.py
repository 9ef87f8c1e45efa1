"""Chapter experiments built from the models: kept out of :mod:`companion.models`.

* :mod:`companion.experiments.extrapolation`: positional schemes trained short, scored long (3)
* :mod:`companion.experiments.ddp_training`: the training loop on one process or under ``torchrun`` (15)
"""
