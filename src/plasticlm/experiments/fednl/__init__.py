"""FedNL experiments: the paper's variant table over rounds, beyond-window and streaming memory, the central baseline (``plasticlm fednl experiment``)."""
