"""The sandbox: a generated world (entities, passages, questions, client tasks), presets of it
and a small model family pre-trained on it.

Sits above ``data``, ``models`` and ``eval`` (it uses all three) and below the methods.
"""

from plasticlm.data.context_tasks import (
    OpenBookItem,
    StreamSegment,
    load_client_streams,
    load_openbook,
)
from plasticlm.sandbox.domains import WORLD_CLIENT_DOMAIN
from plasticlm.sandbox.drills import (
    niah_drill_batch,
    reading_drill_batch,
    teach_facts,
    train_drills,
)
from plasticlm.sandbox.passages import shuffle_statements
from plasticlm.sandbox.presets import (
    PRESETS,
    SANDBOX_VERSION,
    ModelSpec,
    Preset,
    TokenizerSpec,
    get_preset,
    preset_dir,
)
from plasticlm.sandbox.pretrain import (
    ensure_sandbox_models,
    pretrain_preset,
    sandbox_model,
    sandbox_world,
)
from plasticlm.sandbox.probes import (
    evaluate_niah,
    evaluate_openbook,
    evaluate_world_mc,
    niah_choice,
    probe_table,
    world_mc_items,
)
from plasticlm.sandbox.specs import resolve_data_spec, resolve_model_spec, sandbox_preset_of
from plasticlm.sandbox.tasks import (
    client_stream,
    long_items,
    openbook_items,
    write_world_tasks,
)
from plasticlm.sandbox.text import TextPretrainConfig, pretrain_text
from plasticlm.sandbox.world import World, WorldConfig, generate_world
from plasticlm.sandbox.world_index import read_world_index, write_world

__all__ = [
    "PRESETS", "SANDBOX_VERSION", "ModelSpec", "Preset", "TextPretrainConfig", "TokenizerSpec",
    "ensure_sandbox_models", "evaluate_niah", "evaluate_openbook", "evaluate_world_mc", "get_preset",
    "niah_choice", "niah_drill_batch", "preset_dir", "pretrain_preset", "pretrain_text",
    "probe_table", "reading_drill_batch", "resolve_data_spec", "resolve_model_spec", "sandbox_model",
    "sandbox_preset_of", "sandbox_world", "shuffle_statements", "teach_facts", "train_drills",
    "world_mc_items",
    "OpenBookItem", "StreamSegment", "WORLD_CLIENT_DOMAIN", "World", "WorldConfig", "client_stream",
    "generate_world", "load_client_streams", "load_openbook", "long_items", "openbook_items", "read_world_index",
    "write_world", "write_world_tasks",
]
