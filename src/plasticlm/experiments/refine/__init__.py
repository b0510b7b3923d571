"""FedRefine experiments: the transfer ladder and its rungs, the taught oracle, fuser transfer to unseen entities (``plasticlm refine experiment``)."""
