"""Jobs that run models over a dataset, resumable from what they wrote.

``decode``: one decoding setting over a split, a record per example (the workflow's decode rule);
``traces``: rollouts under behaviour policies, stored for head training; ``check``: a trained head
rolled out on-policy against the static rule at its own mean w; ``bench``: timed steps and the
memory-bandwidth floor. May import: the core modules, :mod:`diversed.engine`,
:mod:`diversed.backends`, :mod:`diversed.loading`, :mod:`diversed.evaluation` and
:mod:`diversed.training`; nothing imports a job but the CLI and :mod:`diversed.pipeline`.
"""
