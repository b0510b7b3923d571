"""Data: loaders and writers for real datasets, NIAH samples and non-IID partitions.

Imports nothing of the package but ``errors``; the generated sandbox world, its tasks and
its models live in :mod:`plasticlm.sandbox`."""

from plasticlm.data.corpus import load_haystack, load_text_corpus, write_text_corpus
from plasticlm.data.longbench import extract_answer, load_longbench, write_longbench
from plasticlm.data.mmlu import load_mmlu, load_mmlu_hub, mmlu_subjects, write_mmlu
from plasticlm.data.niah import (
    TASKS,
    NIAHConfig,
    NIAHSample,
    generate_niah,
    haystack_sentences,
    make_sample,
    score,
)
from plasticlm.data.niah_files import load_niah, write_niah
from plasticlm.data.partition import (
    CLIENT_DOMAINS,
    MMLU_CLIENT_DOMAIN,
    client_domain,
    partition_by_domain,
    partition_by_task,
    partition_dirichlet,
)
from plasticlm.data.records import QA, Answer, Document, LongItem, MCQuestion, Passage, Stream
from plasticlm.data.squad import load_squad, write_squad
from plasticlm.data.streams import load_streams, write_streams

__all__ = [
    "CLIENT_DOMAINS", "MMLU_CLIENT_DOMAIN", "QA", "TASKS", "Answer",
    "Document", "LongItem", "MCQuestion", "NIAHConfig", "NIAHSample", "Passage", "Stream",
    "client_domain",
    "extract_answer", "generate_niah",
    "haystack_sentences", "load_haystack", "load_longbench", "load_mmlu",
    "load_mmlu_hub", "load_niah", "load_squad", "load_streams", "load_text_corpus",
    "make_sample", "mmlu_subjects", "partition_by_domain", "partition_by_task",
    "partition_dirichlet", "score", "write_longbench", "write_mmlu",
    "write_niah", "write_squad", "write_streams", "write_text_corpus",
]
