"""Memory experiments: multi-query associative recall (``plasticlm memory mqar``)."""
