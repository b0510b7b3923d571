"""FedRefine's fusers: the trained projection of a transmitter's KV cache into a receiver's
(:mod:`.fuser`, its layers :mod:`.fuser_layers` and config :mod:`.fuser_config`), the layer
and token alignment between two models (:mod:`.align`), and how a fuser is trained
(:mod:`.train`, on examples prepared once by :mod:`.prepared`, with :mod:`.objectives`)."""
