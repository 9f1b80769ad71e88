"""The sweep layer: many scenarios. Grids of points, running them in blocks on threads or Dask
with checkpoints, memory estimates, labelled netCDF outputs and the summary tables. Imports
:mod:`fastsim.analysis` and below; every dataset fastsim writes is written here."""
