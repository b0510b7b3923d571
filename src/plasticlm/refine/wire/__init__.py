"""FedRefine between machines: caches and fusers as checked safetensors payloads
(:mod:`.codec`, quantised by :mod:`.quant`), the peer and registry services (:mod:`.service`,
run by :mod:`.serving`, guarded by :mod:`.guard`, their request bodies :mod:`.requests`),
peers and fusers reached over HTTP (:mod:`.remote`), and the fuser registry (:mod:`.registry`)."""
