"""Chapter experiments built from the models: kept out of :mod:`companion.models`.

* :mod:`companion.experiments.extrapolation`: positional schemes trained short, scored long (3)
"""
