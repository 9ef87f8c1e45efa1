"""Chapter experiments built from the models: kept out of :mod:`companion.models`.

* :mod:`companion.experiments.extrapolation`: positional schemes trained short, scored long (3)
* :mod:`companion.experiments.scaling`: each family's forward pass as the sequence grows; training vs generation (12)
* :mod:`companion.experiments.ddp_training`: the training loop on one process or under ``torchrun`` (15)
"""


def seed_spread(values: list[float], digits: int = 4) -> dict[str, float]:
    """Mean, min and max of one result over the seeds of a recorded run, rounded to ``digits``."""
    if not values:
        raise ValueError("seed_spread needs the results of at least one seed, got none")
    return {"mean": round(sum(values) / len(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}
