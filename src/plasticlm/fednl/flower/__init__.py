"""FedNL on Flower: the ``ClientApp`` and ``ServerApp`` to embed (:mod:`.client_app`,
:mod:`.server_app`), the strategy that averages only theta (:mod:`.strategy`), the messages
they exchange, stopping and checkpoints, the privacy mods, and an in-process grid for tests
and benchmarks (:mod:`.in_process_grid`)."""
