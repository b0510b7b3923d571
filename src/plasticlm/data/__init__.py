"""Data: loaders for real datasets, the sandbox world, NIAH samples, non-IID partitions,
(the pre-trained sandbox models live in ``plasticlm.sandbox``)."""

from plasticlm.data.corpus import load_haystack, load_text_corpus, write_text_corpus
from plasticlm.data.longbench import extract_answer, load_longbench, write_longbench
from plasticlm.data.mmlu import load_mmlu, load_mmlu_hub, mmlu_subjects, write_mmlu
from plasticlm.data.niah import (
    TASKS,
    NIAHConfig,
    NIAHSample,
    generate_niah,
    haystack_sentences,
    load_niah,
    make_sample,
    score,
    write_niah,
)
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
from plasticlm.data.world import World, WorldConfig, generate_world, read_world_index, write_world
from plasticlm.data.world_domains import WORLD_CLIENT_DOMAIN
from plasticlm.data.world_tasks import (
    OpenBookItem,
    StreamSegment,
    client_stream,
    load_client_streams,
    load_openbook,
    openbook_items,
    write_world_tasks,
)

__all__ = [
    "CLIENT_DOMAINS", "MMLU_CLIENT_DOMAIN", "QA", "TASKS", "WORLD_CLIENT_DOMAIN", "Answer",
    "Document", "LongItem", "MCQuestion", "NIAHConfig", "NIAHSample", "Passage", "Stream",
    "OpenBookItem", "StreamSegment", "World", "WorldConfig", "client_domain", "client_stream",
    "load_client_streams", "load_openbook", "openbook_items", "write_world_tasks", "extract_answer", "generate_niah",
    "generate_world", "haystack_sentences", "load_haystack", "load_longbench", "load_mmlu",
    "load_mmlu_hub", "load_niah", "load_squad", "load_streams", "load_text_corpus",
    "make_sample", "mmlu_subjects", "partition_by_domain", "partition_by_task",
    "partition_dirichlet", "read_world_index", "score", "write_longbench", "write_mmlu",
    "write_niah", "write_squad", "write_streams", "write_text_corpus", "write_world",
]
