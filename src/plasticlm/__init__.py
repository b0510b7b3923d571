"""plasticlm: LLMs that keep learning after pre-training.

Three methods on one shared ground:
- ``plasticlm.fednl``  federated nested learning with a delta-rule memory,
- ``plasticlm.refine`` federated inference by KV-cache exchange,
- ``plasticlm.scol``   self-consolidating language models.
Shared ground: ``plasticlm.models`` (loading, tiny builders, llama2.c import),
``plasticlm.runs`` (run folders), ``plasticlm.runtime`` (seeds, devices, threads),
``plasticlm.config``.

Importing plasticlm changes no process-wide setting; ``plasticlm.cpu.configure()`` pins the
float path the sandbox family was trained on (the ``plasticlm`` command does it first).
"""

from plasticlm.errors import PlasticError

__version__ = "0.1.0"
__all__ = ["PlasticError", "__version__"]
