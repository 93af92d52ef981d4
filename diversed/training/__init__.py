"""Training the ensemble head on stored traces (no LM runs here: the on-policy check that does is
:mod:`diversed.jobs.check`).

``traces``: the stored sequences as training reads them; ``objective``: the loss (policy gradient
on the mixture, acceptance term, baselines); ``selection``: off-policy scores and the rule that
picks a checkpoint; ``trainer``: the loop over lambdas and epochs, and the head's card; ``plots``:
the weight histogram. May import: the core modules only.
"""

from diversed.training.objective import TrainConfig
from diversed.training.plots import plot_weight_histogram
from diversed.training.trainer import train_from_traces

__all__ = ["TrainConfig", "plot_weight_histogram", "train_from_traces"]
