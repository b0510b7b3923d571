"""SCoL experiments on the sandbox world: streams, the oracle walk, the policy experiment, Fisher alignment, calibration (``plasticlm scol experiment``)."""
