"""The experiments that reproduce the papers, apart from the mechanisms they measure.

Nothing in the library imports this package (or the sandbox world it runs on): only the CLI
does. A user who wants FedNL, FedRefine or SCoL as a library imports :mod:`plasticlm.fednl`,
:mod:`plasticlm.refine`, :mod:`plasticlm.scol` and :mod:`plasticlm.memory`; what is here
builds the papers' tables on top of them.

- :mod:`plasticlm.experiments.fednl`: the FedNL experiment (variants, rounds, tables),
  beyond-window and streaming-memory experiments, the central baseline.
- :mod:`plasticlm.experiments.refine`: the FedRefine transfer ladder, its rungs and the taught
  oracle, the fuser-transfer experiment, the linear probe.
- :mod:`plasticlm.experiments.scol`: the SCoL world streams, oracle walk, policy experiment,
  Fisher alignment, LongBench-format runs, calibration, one-update tables and plots.
- :mod:`plasticlm.experiments.memory`: multi-query associative recall (MQAR) of the memory.
- :mod:`plasticlm.experiments.bench`: ``plasticlm bench`` (the delta-rule kernel, each method's
  step, real shapes); the scripts that compare against a named peer live in ``bench/``.
"""
