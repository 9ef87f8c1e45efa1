"""Chapter experiments built from the models: kept out of :mod:`companion.models`.

* :mod:`companion.experiments.extrapolation`: positional schemes trained short, scored long (3)
* :mod:`companion.experiments.scaling`: each family's forward pass as the sequence grows; training vs generation (12)
* :mod:`companion.experiments.ddp_training`: the training loop on one process or under ``torchrun`` (15)
"""
