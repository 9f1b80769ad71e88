"""The model layer: pure data and formulas. The config schema (:mod:`.schema`) and how configs
are read (:mod:`.loading`), the hardware and model presets (:mod:`.presets`), the step-cost
model (:mod:`.cost`) and the fleet's pools as configs, GPUs and prices (:mod:`.fleet`).
Imports nothing else of fastsim (but the Numba flags, :mod:`fastsim._jit`)."""
