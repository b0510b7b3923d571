"""FedNL's processes on machines: plasticlm's gated SuperLink (:mod:`.superlink`, with the
operator check of :mod:`.peer_uid`), the simulation runtime (:mod:`.simulation`), a local
deployment of a SuperLink and SuperNodes (:mod:`.deployment`), ``fednl submit``
(:mod:`.submit`), Flower's executables and process groups (:mod:`.processes`), and the Flower
app folder ``flwr run`` reads (``flower_app/``)."""
