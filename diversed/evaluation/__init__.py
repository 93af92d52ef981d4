"""From decoded records to figures: scores, intervals, comparisons, tables and plots. No LM runs.

``metrics``: the tasks' metrics and the per-sequence reward; ``score``: a decode file's metrics
with bootstrap intervals (``bootstrap``); ``weights``: where a head or gate put its w;
``frontier``: the static frontier and the paired test against it; ``comparisons``: paired
comparisons of settings; ``report`` and ``plots``: the tables and figures; ``gates``: the
thresholds a gate needs for given acceptances. May import: the core modules and
:mod:`diversed.engine` (its counters); never loaders or jobs.
"""
