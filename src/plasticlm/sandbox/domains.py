"""The sandbox world's vocabulary: five domains, their attributes, paraphrases and names.

Each domain has three *closed* attributes (values from a fixed set, scored by multiple
choice and by the legal-answer rate) and one *open* attribute whose value is a person's name
drawn from a space of thousands, so that no prior over values can guess it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from plasticlm.errors import PlasticError


@dataclass(frozen=True)
class Attribute:
    name: str
    values: tuple[str, ...]          # the closed value set; empty for an open attribute
    statements: tuple[str, ...]      # paraphrases with {e} (entity) and {v} (value)
    question: str                    # with {e}

    @property
    def closed(self) -> bool:
        return bool(self.values)


@dataclass(frozen=True)
class Domain:
    name: str
    client_domain: str               # one of partition.CLIENT_DOMAINS
    kind: str
    attributes: tuple[Attribute, ...]   # closed attributes first, then the open one

    @property
    def closed_attributes(self) -> tuple[Attribute, ...]:
        return tuple(a for a in self.attributes if a.closed)


CONDITIONS = ("migraine", "insomnia", "asthma", "gout", "eczema", "anemia", "vertigo",
              "arthritis", "psoriasis", "glaucoma", "tinnitus", "bronchitis", "shingles",
              "jaundice", "scurvy", "rickets", "colic", "sciatica", "angina", "croup")
MAKERS = ("Orvane Labs", "Keltis Pharma", "Brightwell Health", "Munder Bio",
          "Sallow Therapeutics", "Caddis Medical", "Pyrrha Labs", "Tolland Pharma",
          "Quarrow Bio", "Ennis Medical", "Halden Labs", "Vossler Pharma")
ORGANS = ("liver", "kidneys", "lungs", "heart", "skin", "brain", "stomach", "pancreas",
          "spleen", "thyroid", "bladder", "retina")
LANGUAGES = ("Rust", "Go", "Python", "Haskell", "Julia", "Kotlin", "Zig", "OCaml", "Elixir",
             "Scala", "Fortran", "Erlang", "Racket", "Nim", "Crystal", "Lua")
PURPOSES = ("image compression", "graph search", "matrix algebra", "web routing", "text parsing",
            "audio mixing", "database indexing", "password hashing", "map rendering",
            "load balancing", "spell checking", "video decoding", "font shaping",
            "log rotation", "packet capture", "unit testing")
LICENSES = ("MIT", "Apache", "GPL", "BSD", "MPL", "ISC", "LGPL", "Zlib")
PROFESSIONS = ("painter", "cellist", "poet", "sculptor", "glassblower", "novelist", "dancer",
               "playwright", "photographer", "composer", "weaver", "potter", "engraver",
               "harpist", "architect", "puppeteer")
MOVEMENTS = ("Lumenism", "Vortism", "Quietism", "Neo-Tidalism", "Ferralism", "Glasswork School",
             "Ashen Circle", "Marrow School", "Saltwater Realism", "Lantern Guild",
             "Copper Modernism", "Hollow School")
COUNTRIES = ("Veloria", "Kestmark", "Ostravia", "Pellandia", "Drumont", "Saravel", "Quorra",
             "Altenvale", "Myrrhen", "Tobrusk", "Caldera", "Ismoor", "Wendrel", "Fallowy")
TOPICS = ("fishing rights", "rail freight", "tenant deposits", "seed patents", "river dams",
          "street markets", "radio licences", "mining claims", "bee keeping", "ferry tariffs",
          "school meals", "bridge tolls", "forest fires", "night trains", "wind farms",
          "salt mines")
YEARS = tuple(str(y) for y in (1821, 1834, 1847, 1858, 1866, 1879, 1885, 1893, 1902, 1908,
                               1919, 1924, 1931, 1938, 1945, 1951, 1962, 1970, 1977, 1985,
                               1996, 2004, 2009, 2013))
RIVERS = ("Ambrel", "Sorrow", "Teskin", "Vail", "Orrin", "Hollowmere", "Dask", "Lenna",
          "Curlew", "Bright", "Maddox", "Istel", "Corran", "Wyre", "Pellow", "Sable")
PRODUCTS = ("salt", "copper", "cheese", "wool", "glass", "tea", "clocks", "silk", "paper",
            "olives", "honey", "lace", "saffron", "pottery", "cider", "rope")

FIRST = ("Alira", "Bastien", "Corin", "Delphine", "Emeric", "Fenna", "Garrick", "Hesper",
         "Idris", "Juna", "Kaspar", "Liora", "Mattias", "Nerys", "Orlan", "Perrin", "Quilla",
         "Rosalind", "Soren", "Tamsin", "Ulric", "Vesna", "Wendel", "Yara")
LAST_A = ("Mar", "Tess", "Quen", "Hol", "Ash", "Brim", "Cor", "Dun", "Fal", "Grey", "Har", "Lind")
LAST_B = ("row", "aly", "by", "wick", "ford", "ley", "mont", "stone", "ridge", "well")
_DRUG = (("vel", "tor", "mar", "quin", "zan", "cef", "lor", "pra", "dex", "fen", "oxa", "bri",
          "nol", "sur", "tam", "ven"),
         ("a", "i", "o", "e", "u", "ari", "ol", "en"),
         ("zole", "mab", "pril", "statin", "vir", "cillin", "dronate", "tinib", "lukast",
          "sartan"))
_LIB = (("zen", "arc", "nim", "tess", "kov", "lum", "rix", "vor", "quo", "pyx", "dra", "hel",
         "mox", "sil", "tor", "wex"),
        ("ly", "io", "kit", "db", "js", "flow", "net", "ql", "rs", "lab", "ify", "core"))
_LAW = (("Corv", "Harl", "Mirr", "Velm", "Ostr", "Bren", "Dalt", "Fenw", "Garr", "Kell",
         "Lorn", "Penn"),
        ("ell", "owe", "en", "ick", "ard", "in"),
        ("Act", "Accord", "Charter", "Statute", "Code", "Ordinance"))
_TOWN = (("Kor", "Bel", "Ast", "Dun", "Gal", "Hav", "Ist", "Lam", "Mor", "Nor", "Pel", "Rav",
          "Sel", "Tir", "Ul", "Wes"),
         ("vale", "burg", "ford", "mere", "holm", "stad", "wick", "haven", "moor", "bridge"))

KINDS = {"pharmacology": "drug", "software": "library", "biography": "person", "law": "law",
         "geography": "town"}
DOMAIN_NAMES = tuple(KINDS)
# World domain -> FedNL client domain (partition.CLIENT_DOMAINS).
WORLD_CLIENT_DOMAIN = {"pharmacology": "stem", "software": "math_cs", "biography": "humanities",
                       "law": "social_sciences", "geography": "other"}


def person_name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST_A)}{rng.choice(LAST_B)}"


def entity_name(kind: str, rng: random.Random) -> str:
    """One random name of ``kind`` (drug, library, person, law, town)."""
    if kind == "drug":
        return "".join(rng.choice(p) for p in _DRUG).capitalize()
    if kind == "library":
        return "".join(rng.choice(p) for p in _LIB)
    if kind == "person":
        return person_name(rng)
    if kind == "law":
        return f"{rng.choice(_LAW[0])}{rng.choice(_LAW[1])} {rng.choice(_LAW[2])}"
    return "".join(rng.choice(p) for p in _TOWN)


def unique_names(kind: str, n: int, rng: random.Random, used: set[str]) -> list[str]:
    """``n`` names of ``kind`` not in ``used`` (which is updated)."""
    out = []
    for _ in range(200 * n):
        if len(out) == n:
            break
        name = entity_name(kind, rng)
        if name not in used:
            used.add(name)
            out.append(name)
    if len(out) < n:
        raise PlasticError(f"the {kind} name vocabulary cannot make {n} distinct names; "
                           "ask for fewer entities per domain")
    return out


def build_domains(towns: tuple[str, ...]) -> list[Domain]:
    """The five domains; ``towns`` (names of geography entities) are the birthplaces."""
    A = Attribute
    return [
        Domain("pharmacology", "stem", "drug", (
            A("treats", CONDITIONS, (
                "{e} is a medicine used to treat {v}.", "Doctors prescribe {e} for {v}.",
                "Patients with {v} are often given {e}.", "{e} relieves the symptoms of {v}.",
                "The usual remedy for {v} is {e}.", "Against {v}, clinics reach for {e}."),
              "What condition is {e} used to treat?"),
            A("maker", MAKERS, (
                "{e} is made by {v}.", "The company {v} manufactures {e}.",
                "{e} was developed at {v}.", "Every box of {e} carries the {v} logo.",
                "{v} holds the patent on {e}.", "The factory of {v} produces {e}."),
              "Which company makes {e}?"),
            A("organ", ORGANS, (
                "{e} acts mainly on the {v}.", "The main target of {e} is the {v}.",
                "{e} works on the {v}.", "Inside the body, {e} reaches the {v} first.",
                "{e} does its work in the {v}.", "{e} is absorbed by the {v}."),
              "Which organ does {e} act on?"),
            A("discoverer", (), (
                "{e} was discovered by {v}.", "The chemist {v} first made {e}.",
                "{v} found {e} while testing old samples.", "The discovery of {e} is credited to {v}."),
              "Who discovered {e}?"),
        )),
        Domain("software", "math_cs", "library", (
            A("language", LANGUAGES, (
                "{e} is a library written in {v}.", "The {e} library is implemented in {v}.",
                "The source code of {e} is in {v}.", "{e} was coded from scratch in {v}.",
                "Developers who know {v} can read {e} easily.", "{e} compiles as a {v} project."),
              "In which language is {e} written?"),
            A("purpose", PURPOSES, (
                "{e} is used for {v}.", "Programmers use {e} for {v}.",
                "The {e} package handles {v}.", "{e} was built to make {v} faster.",
                "For {v}, many teams pick {e}.", "The main job of {e} is {v}."),
              "What is the {e} library used for?"),
            A("license", LICENSES, (
                "{e} is released under the {v} license.", "The license of {e} is {v}.",
                "{e} ships with the {v} license.", "Anyone may copy {e} under the {v} terms.",
                "The {v} license covers all of {e}.", "{e} is distributed as {v} software."),
              "Under which license is {e} released?"),
            A("author", (), (
                "{e} was written by {v}.", "The first version of {e} came from {v}.",
                "{v} started the {e} project.", "The original author of {e} is {v}."),
              "Who wrote the {e} library?"),
        )),
        Domain("biography", "humanities", "person", (
            A("birthplace", towns, (
                "{e} was born in {v}.", "{e} grew up in the town of {v}.",
                "The birthplace of {e} is {v}.", "{e} spent a childhood in {v}.",
                "Records from {v} list the birth of {e}.", "{e} came into the world in {v}."),
              "Where was {e} born?"),
            A("profession", PROFESSIONS, (
                "{e} worked as a {v}.", "{e} is remembered as a {v}.",
                "By profession, {e} was a {v}.", "{e} earned a living as a {v}.",
                "Friends knew {e} as a gifted {v}.", "{e} trained for years to become a {v}."),
              "What was the profession of {e}?"),
            A("movement", MOVEMENTS, (
                "{e} belonged to the {v} movement.", "{e} was a leading figure of {v}.",
                "Critics link {e} to {v}.", "{e} signed the manifesto of {v}.",
                "Historians count {e} among the members of {v}.", "{e} joined {v} early on."),
              "Which movement did {e} belong to?"),
            A("teacher", (), (
                "{e} studied under {v}.", "The teacher of {e} was {v}.",
                "{v} taught {e} for many years.", "As a student, {e} learned from {v}."),
              "Who was the teacher of {e}?"),
        )),
        Domain("law", "social_sciences", "law", (
            A("country", COUNTRIES, (
                "{e} is a law of {v}.", "{e} was passed by the parliament of {v}.",
                "In {v}, {e} is the law of the land.", "The courts of {v} enforce {e}.",
                "{e} applies to every citizen of {v}.", "Lawyers in {v} often cite {e}."),
              "Which country passed {e}?"),
            A("topic", TOPICS, (
                "{e} regulates {v}.", "{e} sets the rules for {v}.",
                "Disputes about {v} are settled under {e}.", "{e} was written to control {v}.",
                "Anyone dealing in {v} must follow {e}.", "The subject of {e} is {v}."),
              "What does {e} regulate?"),
            A("year", YEARS, (
                "{e} was enacted in {v}.", "{e} came into force in {v}.",
                "Since {v}, {e} has been in effect.", "{e} was signed into law in {v}.",
                "The first cases under {e} were heard in {v}.", "{e} dates from {v}."),
              "In which year was {e} enacted?"),
            A("sponsor", (), (
                "{e} was drafted by {v}.", "The author of {e} is {v}.",
                "{v} proposed {e} to the assembly.", "{e} was championed by {v}."),
              "Who drafted {e}?"),
        )),
        Domain("geography", "other", "town", (
            A("country", COUNTRIES, (
                "{e} is a town in {v}.", "{e} lies in the country of {v}.",
                "Travellers reach {e} through {v}.", "{e} is one of the oldest towns of {v}.",
                "Maps of {v} show {e} near the border.", "{e} pays its taxes to {v}."),
              "In which country is {e}?"),
            A("river", RIVERS, (
                "{e} stands on the river {v}.", "The river {v} flows through {e}.",
                "Boats on the {v} stop at {e}.", "{e} was built on both banks of the {v}.",
                "Fishermen in {e} work the {v}.", "The {v} floods {e} every spring."),
              "Which river flows through {e}?"),
            A("product", PRODUCTS, (
                "{e} is famous for its {v}.", "{e} is known for making {v}.",
                "Merchants buy {v} in {e}.", "The market of {e} sells {v}.",
                "Most families in {e} live from {v}.", "Visitors to {e} bring home {v}."),
              "What is {e} famous for?"),
            A("founder", (), (
                "{e} was founded by {v}.", "The first house in {e} was built by {v}.",
                "{v} gave {e} its name.", "Settlers led by {v} founded {e}."),
              "Who founded {e}?"),
        )),
    ]


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
