"""The analysis layer: what a run means. Metrics and exact inter-token latencies from an
engine's outcome, one scenario end to end (:mod:`.simulation`) or a sweep's small points many to
a compiled call (:mod:`.batch`), targets, capacity searches and
plans, comparisons of datasets and figures (these two read datasets with xarray). Imports
:mod:`fastsim.engine` and :mod:`fastsim.model`."""
