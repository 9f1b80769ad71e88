"""The sweep layer: many scenarios. Grids of points, running them in blocks (:mod:`.runner`) on
threads, forked processes or Dask (:mod:`.backends`) with checkpoints, memory estimates,
labelled netCDF outputs and the summary tables. Imports
:mod:`fastsim.analysis` and below; every dataset fastsim writes is written here."""
