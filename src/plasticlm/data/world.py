"""The sandbox world: fictional entities in five domains, written in real dataset formats.

Everything is drawn from one seed. Each domain (drugs, software libraries, artists, laws,
towns) has its own name vocabulary, three attributes with closed value sets, paraphrase
templates and a question per attribute; two relations cross domains (an artist's birthplace
is a town, a law's and a town's country come from one set). Entities are ranked per domain
and mentioned in the corpus a Zipf number of times, so head and tail facts can be scored
apart. Entity roles:

- ``core``: in the pre-training corpus; MC questions (MMLU layout, subject = domain). Half
  of them also have Q/A lines in the corpus (their questions form the ``dev`` split); the
  other half's questions are held out (``val`` and ``test``): only prose teaches them.
- ``specialist``: entities of one domain that only the specialist corpus mentions
  (FedRefine); their questions are in ``specialist_mmlu/``.
- ``unseen``: never in any corpus; SQuAD-style passages with one QA pair per attribute,
  LongBench-style long contexts and ordered streams of passages (SCoL).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from plasticlm.data.corpus import write_text_corpus
from plasticlm.data.longbench import write_longbench
from plasticlm.data.mmlu import write_mmlu
from plasticlm.data.niah import NIAHConfig, make_sample
from plasticlm.data.records import QA, Answer, LongItem, MCQuestion, Passage, Stream
from plasticlm.data.squad import write_squad
from plasticlm.data.streams import write_streams
from plasticlm.errors import PlasticError


@dataclass
class WorldConfig:
    """Sizes of the world. Defaults train the sandbox preset in minutes on 2 CPU cores."""

    seed: int = 0
    core_per_domain: int = 32        # entities in the pre-training corpus, per domain
    unseen_per_domain: int = 20      # entities only in SQuAD / LongBench / streams
    specialist_entities: int = 40    # entities only the specialist corpus mentions
    specialist_domain: str = "pharmacology"
    specialist_mentions: int = 6     # biographies per specialist entity
    max_mentions: int = 20           # biographies of the rank-1 entity of each domain
    min_mentions: int = 4            # biographies of the rarest entities
    zipf_exponent: float = 1.0       # mentions(rank) = max(min, round(max * rank**-s))
    qa_copies: int = 2               # copies of the Q/A block of each Q/A entity
    drills: int = 500                # retrieval drills (NIAH-style) in the corpus
    drill_words: tuple[int, int] = (36, 80)
    longbench_per_length: int = 4
    longbench_words: tuple[int, int, int] = (1500, 4000, 12000)  # short, medium, long
    streams: int = 4
    stream_length: int = 8


@dataclass(frozen=True)
class Attribute:
    name: str
    values: tuple[str, ...]
    statements: tuple[str, ...]      # paraphrases with {e} (entity) and {v} (value)
    question: str                    # with {e}


@dataclass(frozen=True)
class Domain:
    name: str
    client_domain: str               # one of partition.CLIENT_DOMAINS
    kind: str
    attributes: tuple[Attribute, ...]


@dataclass
class Entity:
    id: str
    name: str
    domain: str
    role: str                        # core | specialist | unseen
    rank: int                        # 1 = most mentioned in its domain and role
    mentions: int                    # biographies in the corpus that mentions it
    bucket: str                      # head | torso | tail (by rank)
    qa_in_corpus: bool
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass
class World:
    config: WorldConfig
    domains: list[Domain]
    entities: list[Entity]
    train_docs: list[str]
    valid_docs: list[str]
    specialist_docs: list[str]
    questions: list[MCQuestion]
    specialist_questions: list[MCQuestion]
    question_facts: list[dict]       # per question (same order): fact id, bucket, rank, role
    passages: list[Passage]
    long_items: list[LongItem]
    streams: list[Stream]

    def facts(self) -> list[dict]:
        """One record per (entity, attribute): the value, rank, mentions and bucket."""
        return [{"id": f"{e.id}.{a}", "entity": e.name, "domain": e.domain, "role": e.role,
                 "attribute": a, "value": v, "rank": e.rank, "mentions": e.mentions,
                 "bucket": e.bucket, "qa_in_corpus": e.qa_in_corpus}
                for e in self.entities for a, v in e.attributes.items()]


CONDITIONS = ("migraine", "insomnia", "asthma", "gout", "eczema", "anemia", "vertigo",
              "arthritis", "psoriasis", "glaucoma", "tinnitus", "bronchitis")
ORGANS = ("liver", "kidneys", "lungs", "heart", "skin", "brain", "stomach", "pancreas")
LANGUAGES = ("Rust", "Go", "Python", "Haskell", "Julia", "Kotlin", "Zig", "OCaml", "Elixir",
             "Scala")
PURPOSES = ("image compression", "graph search", "matrix algebra", "web routing", "text parsing",
            "audio mixing", "database indexing", "password hashing", "map rendering",
            "load balancing")
LICENSES = ("MIT", "Apache", "GPL", "BSD", "MPL", "ISC")
PROFESSIONS = ("painter", "cellist", "poet", "sculptor", "glassblower", "novelist", "dancer",
               "playwright", "photographer", "composer")
MOVEMENTS = ("Lumenism", "Vortism", "Quietism", "Neo-Tidalism", "Ferralism", "Glasswork School",
             "Ashen Circle", "Marrow School")
COUNTRIES = ("Veloria", "Kestmark", "Ostravia", "Pellandia", "Drumont", "Saravel", "Quorra",
             "Altenvale", "Myrrhen", "Tobrusk")
TOPICS = ("fishing rights", "rail freight", "tenant deposits", "seed patents", "river dams",
          "street markets", "radio licences", "mining claims", "bee keeping", "ferry tariffs")
YEARS = tuple(str(y) for y in (1821, 1847, 1866, 1879, 1893, 1908, 1919, 1924, 1938, 1951,
                               1962, 1977, 1985, 1996, 2004, 2013))
RIVERS = ("Ambrel", "Sorrow", "Teskin", "Vail", "Orrin", "Hollowmere", "Dask", "Lenna",
          "Curlew", "Bright")
PRODUCTS = ("salt", "copper", "cheese", "wool", "glass", "tea", "clocks", "silk", "paper",
            "olives")

_DRUG_HEAD = ("vel", "tor", "mar", "quin", "zan", "cef", "lor", "pra", "dex", "fen", "oxa", "bri",
              "nol", "sur", "tam", "ven")
_DRUG_MID = ("a", "i", "o", "e", "u", "ari", "ol", "en")
_DRUG_TAIL = ("zole", "mab", "pril", "statin", "vir", "cillin", "dronate", "tinib", "lukast",
              "sartan")
_LIB_HEAD = ("zen", "arc", "nim", "tess", "kov", "lum", "rix", "vor", "quo", "pyx", "dra", "hel",
             "mox", "sil", "tor", "wex")
_LIB_TAIL = ("ly", "io", "kit", "db", "js", "flow", "net", "ql", "rs", "lab", "ify", "core")
_FIRST = ("Alira", "Bastien", "Corin", "Delphine", "Emeric", "Fenna", "Garrick", "Hesper",
          "Idris", "Juna", "Kaspar", "Liora", "Mattias", "Nerys", "Orlan", "Perrin", "Quilla",
          "Rosalind", "Soren", "Tamsin", "Ulric", "Vesna", "Wendel", "Yara")
_LAST_A = ("Mar", "Tess", "Quen", "Hol", "Ash", "Brim", "Cor", "Dun", "Fal", "Grey", "Har", "Lind")
_LAST_B = ("row", "aly", "by", "wick", "ford", "ley", "mont", "stone", "ridge", "well")
_LAW_HEAD = ("Corv", "Harl", "Mirr", "Velm", "Ostr", "Bren", "Dalt", "Fenw", "Garr", "Kell",
             "Lorn", "Penn")
_LAW_MID = ("ell", "owe", "en", "ick", "ard", "in")
_LAW_TAIL = ("Act", "Accord", "Charter", "Statute", "Code", "Ordinance")
_TOWN_HEAD = ("Kor", "Bel", "Ast", "Dun", "Gal", "Hav", "Ist", "Lam", "Mor", "Nor", "Pel", "Rav",
              "Sel", "Tir", "Ul", "Wes")
_TOWN_TAIL = ("vale", "burg", "ford", "mere", "holm", "stad", "wick", "haven", "moor", "bridge")


def _domains(towns: tuple[str, ...]) -> list[Domain]:
    A = Attribute
    return [
        Domain("pharmacology", "stem", "drug", (
            A("treats", CONDITIONS, ("{e} is a medicine used to treat {v}.",
                                     "Doctors prescribe {e} for {v}.",
                                     "Patients with {v} are often given {e}."),
              "What condition is {e} used to treat?"),
            A("maker", ("Orvane Labs", "Keltis Pharma", "Brightwell Health", "Munder Bio",
                        "Sallow Therapeutics", "Caddis Medical", "Pyrrha Labs", "Tolland Pharma"),
              ("{e} is made by {v}.", "The company {v} manufactures {e}.",
               "{e} was developed at {v}."), "Which company makes {e}?"),
            A("organ", ORGANS, ("{e} acts mainly on the {v}.", "The main target of {e} is the {v}.",
                                "{e} works on the {v}."), "Which organ does {e} act on?"),
        )),
        Domain("software", "math_cs", "library", (
            A("language", LANGUAGES, ("{e} is a library written in {v}.",
                                      "The {e} library is implemented in {v}.",
                                      "The source code of {e} is in {v}."),
              "In which language is {e} written?"),
            A("purpose", PURPOSES, ("{e} is used for {v}.", "Programmers use {e} for {v}.",
                                    "The {e} package handles {v}."),
              "What is the {e} library used for?"),
            A("license", LICENSES, ("{e} is released under the {v} license.",
                                    "The license of {e} is {v}.",
                                    "{e} ships with the {v} license."),
              "Under which license is {e} released?"),
        )),
        Domain("biography", "humanities", "person", (
            A("birthplace", towns, ("{e} was born in {v}.", "{e} grew up in the town of {v}.",
                                    "The birthplace of {e} is {v}."), "Where was {e} born?"),
            A("profession", PROFESSIONS, ("{e} worked as a {v}.", "{e} is remembered as a {v}.",
                                          "By profession, {e} was a {v}."),
              "What was the profession of {e}?"),
            A("movement", MOVEMENTS, ("{e} belonged to the {v} movement.",
                                      "{e} was a leading figure of {v}.",
                                      "Critics link {e} to {v}."),
              "Which movement did {e} belong to?"),
        )),
        Domain("law", "social_sciences", "law", (
            A("country", COUNTRIES, ("{e} is a law of {v}.",
                                     "{e} was passed by the parliament of {v}.",
                                     "In {v}, {e} is the law of the land."),
              "Which country passed {e}?"),
            A("topic", TOPICS, ("{e} regulates {v}.", "{e} sets the rules for {v}.",
                                "Disputes about {v} are settled under {e}."),
              "What does {e} regulate?"),
            A("year", YEARS, ("{e} was enacted in {v}.", "{e} came into force in {v}.",
                              "Since {v}, {e} has been in effect."),
              "In which year was {e} enacted?"),
        )),
        Domain("geography", "other", "town", (
            A("country", COUNTRIES, ("{e} is a town in {v}.", "{e} lies in the country of {v}.",
                                     "Travellers reach {e} through {v}."),
              "In which country is {e}?"),
            A("river", RIVERS, ("{e} stands on the river {v}.", "The river {v} flows through {e}.",
                                "Boats on the {v} stop at {e}."),
              "Which river flows through {e}?"),
            A("product", PRODUCTS, ("{e} is famous for its {v}.", "{e} is known for making {v}.",
                                    "Merchants buy {v} in {e}."), "What is {e} famous for?"),
        )),
    ]


DOMAIN_NAMES = ("pharmacology", "software", "biography", "law", "geography")
# World domain -> FedNL client domain (partition.CLIENT_DOMAINS).
WORLD_CLIENT_DOMAIN = {"pharmacology": "stem", "software": "math_cs", "biography": "humanities",
                       "law": "social_sciences", "geography": "other"}


def _name(kind: str, rng: random.Random) -> str:
    if kind == "drug":
        return (rng.choice(_DRUG_HEAD) + rng.choice(_DRUG_MID) + rng.choice(_DRUG_TAIL)).capitalize()
    if kind == "library":
        return rng.choice(_LIB_HEAD) + rng.choice(_LIB_TAIL)
    if kind == "person":
        return f"{rng.choice(_FIRST)} {rng.choice(_LAST_A)}{rng.choice(_LAST_B)}"
    if kind == "law":
        return f"{rng.choice(_LAW_HEAD)}{rng.choice(_LAW_MID)} {rng.choice(_LAW_TAIL)}"
    return rng.choice(_TOWN_HEAD) + rng.choice(_TOWN_TAIL)


def _unique_names(kind: str, n: int, rng: random.Random, used: set[str]) -> list[str]:
    out = []
    for _ in range(200 * n):
        if len(out) == n:
            break
        name = _name(kind, rng)
        if name not in used:
            used.add(name)
            out.append(name)
    if len(out) < n:
        raise PlasticError(f"the {kind} name vocabulary cannot make {n} distinct names; "
                           "ask for fewer entities per domain")
    return out


_FILLER_SUBJ = ("The old clock", "A small boat", "The morning bus", "Our neighbour", "The baker",
                "A grey cat", "The night train", "My cousin", "The school choir", "A tired farmer",
                "The postman", "The wind")
_FILLER_VERB = ("waited near", "passed by", "looked at", "walked past", "painted", "cleaned",
                "sang about", "forgot", "visited", "followed")
_FILLER_OBJ = ("the quiet harbour", "a wooden fence", "the empty market", "an old bridge",
               "the green hill", "a broken cart", "the long road", "the village well",
               "a red door", "the north field", "the stone wall")
_FILLER_TAIL = ("", " in the rain", " before noon", " every Sunday", " without a word",
                " after supper")


def filler_sentences(n: int, seed: int = 0) -> list[str]:
    """Plain everyday sentences with no world facts: the haystack of retrieval drills."""
    rng = random.Random(seed)
    return [f"{rng.choice(_FILLER_SUBJ)} {rng.choice(_FILLER_VERB)} {rng.choice(_FILLER_OBJ)}"
            f"{rng.choice(_FILLER_TAIL)}." for _ in range(n)]


def _bucket(rank: int, n: int) -> str:
    if rank <= max(1, round(0.2 * n)):
        return "head"
    return "tail" if rank > n // 2 else "torso"


def _render(template: str, e: Entity, v: str) -> str:
    s = template.format(e=e.name, v=v)
    # Names keep their own case (libraries are lower-case); only other openings are raised.
    return s if template.startswith("{e}") else s[0].upper() + s[1:]


def biography(e: Entity, domain: Domain, rng: random.Random, extra: int = 1) -> str:
    """One statement per attribute plus ``extra`` more paraphrases, in random order."""
    picks = [(a, rng.choice(a.statements)) for a in domain.attributes]
    pool = [(a, s) for a in domain.attributes for s in a.statements if (a, s) not in picks]
    picks += rng.sample(pool, min(extra, len(pool)))
    rng.shuffle(picks)
    return " ".join(_render(s, e, e.attributes[a.name]) for a, s in picks)


def qa_block(e: Entity, domain: Domain, rng: random.Random) -> str:
    """Q/A lines ``Q: <question> A: <value>.`` for every attribute, in random order."""
    attrs = list(domain.attributes)
    rng.shuffle(attrs)
    return "\n".join(f"Q: {a.question.format(e=e.name)} A: {e.attributes[a.name]}." for a in attrs)


def mc_prompt(question: str) -> str:
    """How a world question is put to a model; each choice is scored as `` <choice>``."""
    return f"Q: {question} A:"


def _mc(e: Entity, a: Attribute, split: str, rng: random.Random, index: int) -> MCQuestion:
    right = e.attributes[a.name]
    wrong = rng.sample([v for v in a.values if v != right], 3)
    choices = [right, *wrong]
    rng.shuffle(choices)
    return MCQuestion(e.domain, split, a.question.format(e=e.name), tuple(choices),
                      "ABCD"[choices.index(right)], index)


def _find_span(context: str, value: str) -> int:
    m = re.search(rf"(?<!\w){re.escape(value)}(?!\w)", context)
    if m is None:
        raise AssertionError(f"value {value!r} missing from its own passage")
    return m.start()


def generate_world(cfg: WorldConfig | None = None) -> World:
    """Build the whole world from ``cfg.seed`` (a second or two at default sizes)."""
    cfg = cfg or WorldConfig()
    if cfg.specialist_domain not in DOMAIN_NAMES:
        raise PlasticError(f"specialist_domain {cfg.specialist_domain!r} is not one of "
                           f"{', '.join(DOMAIN_NAMES)}")
    if cfg.core_per_domain < 8:
        raise PlasticError("core_per_domain must be at least 8 (dev, val and test need entities)")
    rng = random.Random(cfg.seed)
    used: set[str] = set()
    kinds = {"pharmacology": "drug", "software": "library", "biography": "person", "law": "law",
             "geography": "town"}
    names = {d: _unique_names(kinds[d], cfg.core_per_domain + cfg.unseen_per_domain
                              + (cfg.specialist_entities if d == cfg.specialist_domain else 0),
                              rng, used) for d in DOMAIN_NAMES}
    towns = tuple(names["geography"][:16])
    domains = _domains(towns)
    by_name = {d.name: d for d in domains}

    entities: list[Entity] = []
    for d in domains:
        pool = names[d.name]
        groups = [("core", pool[: cfg.core_per_domain]),
                  ("unseen", pool[cfg.core_per_domain: cfg.core_per_domain + cfg.unseen_per_domain])]
        if d.name == cfg.specialist_domain:
            groups.append(("specialist", pool[cfg.core_per_domain + cfg.unseen_per_domain:]))
        for role, group in groups:
            for r, name in enumerate(group, 1):
                if role == "core":
                    mentions = max(cfg.min_mentions,
                                   round(cfg.max_mentions * r ** -cfg.zipf_exponent))
                else:
                    mentions = cfg.specialist_mentions if role == "specialist" else 0
                attrs = {}
                for a in d.attributes:
                    values = [v for v in a.values if v != name]
                    attrs[a.name] = rng.choice(values)
                entities.append(Entity(f"{d.name}.{role}.{r}", name, d.name, role, r, mentions,
                                       _bucket(r, len(group)), role != "unseen" and r % 2 == 1,
                                       attrs))

    def corpus(role: str) -> list[str]:
        docs = []
        for e in entities:
            if e.role != role:
                continue
            d = by_name[e.domain]
            docs += [biography(e, d, rng) for _ in range(e.mentions)]
            if e.qa_in_corpus:
                docs += [qa_block(e, d, rng) for _ in range(cfg.qa_copies)]
        return docs

    train_docs = corpus("core")
    filler = filler_sentences(400, seed=cfg.seed + 1)
    drill_tasks = ("single",) * 6 + ("multikey",) * 3 + ("numeric",)
    for i in range(cfg.drills):
        task = drill_tasks[i % len(drill_tasks)]
        # Four needles and their question take ~50 words before any haystack fits.
        words = rng.randint(*cfg.drill_words) + (40 if task == "multikey" else 0)
        s = make_sample(NIAHConfig(task, words, rng.random()), filler, seed=cfg.seed * 7919 + i)
        train_docs.append(s.prompt + s.target)
    rng.shuffle(train_docs)
    valid_docs = [biography(e, by_name[e.domain], rng) for e in entities if e.role == "core"]
    specialist_docs = corpus("specialist")
    rng.shuffle(specialist_docs)

    def questions(role: str) -> tuple[list[MCQuestion], list[dict]]:
        qs, meta = [], []
        counters: dict[tuple[str, str], int] = {}
        for e in entities:
            if e.role != role:
                continue
            split = "dev" if e.qa_in_corpus else ("val" if e.rank % 4 == 2 else "test")
            for a in by_name[e.domain].attributes:
                k = (e.domain, split)
                counters[k] = counters.get(k, 0) + 1
                qs.append(_mc(e, a, split, rng, counters[k] - 1))
                meta.append({"subject": e.domain, "split": split, "index": counters[k] - 1,
                             "fact": f"{e.id}.{a.name}", "bucket": e.bucket, "rank": e.rank,
                             "mentions": e.mentions, "role": role})
        return qs, meta

    core_q, core_meta = questions("core")
    spec_q, spec_meta = questions("specialist")

    unseen = [e for e in entities if e.role == "unseen"]
    passages = []
    for e in unseen:
        d = by_name[e.domain]
        context = biography(e, d, rng, extra=2)
        qas = tuple(QA(f"{e.id}.{a.name}", a.question.format(e=e.name),
                       (Answer(e.attributes[a.name], _find_span(context, e.attributes[a.name])),))
                    for a in d.attributes)
        passages.append(Passage(e.name, context, qas))

    core_bios = [biography(e, by_name[e.domain], rng) for e in entities if e.role == "core"]
    long_items = []
    for length, words in zip(("short", "medium", "long"), cfg.longbench_words):
        for i in range(cfg.longbench_per_length):
            target = rng.choice(unseen)
            a = rng.choice(by_name[target.domain].attributes)
            target_passage = next(p for p in passages if p.title == target.name).context
            pieces = [target_passage]
            others = [p.context for p in passages if p.title != target.name]
            total = len(target_passage.split())
            while total < words:
                piece = rng.choice(others if rng.random() < 0.3 else core_bios)
                pieces.append(piece)
                total += len(piece.split())
            rng.shuffle(pieces)
            q = _mc(target, a, "test", rng, 0)
            long_items.append(LongItem(f"world-{length}-{i}", target.domain, a.name,
                                       "easy" if length == "short" else "hard", length,
                                       q.question, q.choices, q.answer, "\n\n".join(pieces)))

    streams = []
    titles = [p.title for p in passages]
    for i in range(cfg.streams):
        streams.append(Stream(f"squad-{i}", "squad",
                              rng.sample(titles, min(cfg.stream_length, len(titles)))))
    return World(cfg, domains, entities, train_docs, valid_docs, specialist_docs, core_q, spec_q,
                 core_meta + spec_meta, passages, long_items, streams)


def write_world(world: World, out: str | Path) -> Path:
    """Write the world under ``out`` in the real formats (see the module docstring)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_corpus(out / "corpus" / "train.txt", world.train_docs)
    write_text_corpus(out / "corpus" / "valid.txt", world.valid_docs)
    write_text_corpus(out / "corpus" / "specialist.txt", world.specialist_docs)
    write_mmlu(out / "mmlu", world.questions)
    write_mmlu(out / "specialist_mmlu", world.specialist_questions)
    write_squad(out / "squad" / "unseen.json", world.passages)
    write_longbench(out / "longbench" / "items.json", world.long_items)
    write_streams(out / "streams.jsonl", world.streams)
    index = {
        "config": asdict(world.config),
        "domains": {d.name: {"client_domain": d.client_domain, "kind": d.kind,
                             "attributes": {a.name: {"values": list(a.values),
                                                     "question": a.question}
                                            for a in d.attributes}} for d in world.domains},
        "entities": [asdict(e) for e in world.entities],
        "facts": world.facts(),
        "questions": world.question_facts,
    }
    (out / "world.json").write_text(json.dumps(index, indent=1) + "\n")
    return out


def read_world_index(folder: str | Path) -> dict:
    """The ``world.json`` of a written world: config, domains, entities, facts, questions."""
    path = Path(folder) / "world.json"
    if not path.is_file():
        raise PlasticError(f"{folder} is not a sandbox world folder (no world.json); create one "
                           "with `plasticlm data world --seed S --out DIR`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PlasticError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None


def question_meta(index: dict, role: str = "core") -> dict[tuple[str, str, int], dict]:
    """``(subject, split, index) -> fact record`` for the MC questions of ``role``."""
    return {(q["subject"], q["split"], q["index"]): q for q in index["questions"]
            if q["role"] == role}
