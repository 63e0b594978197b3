"""Data of the order_sensitivity experiment.

smoke / cpu: procedural evidence/claim items (project design; README, "Experiment"). One parquet
per seed holds every split (train, val, test, dose) as *structured* items: the chunks' (entity, attribute,
value) triples, which of them are relevant, the claim and its label. Token sequences are rendered at run
time under each permutation (:func:`render_ids`), so the same item is scored in many orders.

paper: real evidence items from the hub (FEVER with gold evidence, HotpotQA distractor) turned into the
same structure with text chunks; tests use local stand-ins only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tasks.common.io import write_json, write_parquet
from tasks.order_sensitivity.config import HubConfig, OrderSensitivityConfig, ProceduralDataConfig

SPLITS = ("train", "val", "test", "dose")
NO_LABEL = -1  # gold label of a control item: no evidence, the correct behaviour is to abstain


# ------------------------------------------------------------------------------------------------
# Vocabulary
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Vocabulary:
    """Index ranges of the three input fields of a chunk.

    A chunk ``(e, a, v)`` is ONE position of the tiny model (the sum of an entity, an attribute and a
    value embedding); the claim ``(e*, a*, v*)`` is the last position, marked by a role embedding. The
    label is read at the claim position. The value field enters *claim-relative*: 0 = v != v*, 1 = v = v*,
    2 = the mask ``[M]`` [project design: a precomputed lexical-match feature, because learning value
    equality from scratch did not fit the CPU budget; the model still has to find the relevant chunks by
    entity and attribute among distractors and aggregate their verdicts].
    """

    n_entities: int
    n_attributes: int
    n_values: int

    disagree: int = 0
    agree: int = 1
    mask: int = 2
    value_fields: int = 3


def vocabulary(cfg: ProceduralDataConfig) -> Vocabulary:
    return Vocabulary(cfg.n_entities, cfg.n_attributes, cfg.n_values)


def sequence_length(n_chunks: int) -> int:
    """One position per chunk, then the claim."""
    return n_chunks + 1


# ------------------------------------------------------------------------------------------------
# Procedural items
# ------------------------------------------------------------------------------------------------

def gold_label(n_support: int, n_refute: int) -> int:
    """Majority of the relevant chunks; a tie is not support (label 0): a fixed, order-free rule."""
    return int(n_support > n_refute)


def _relevant_positions(n: int, n_relevant: int, primacy: bool, rng: np.random.Generator) -> np.ndarray:
    """Where the relevant chunks sit: anywhere, or (primacy) within the first third when they fit."""
    front = max(n_relevant, -(-n // 3))
    pool = front if primacy else n
    return rng.choice(pool, size=n_relevant, replace=False)


def make_item(cfg: ProceduralDataConfig, n: int, rng: np.random.Generator, *, control: bool, primacy: bool = False,
              n_support: int | None = None, n_relevant: int | None = None) -> dict[str, Any]:
    """One item. ``n_support``/``n_relevant`` fix the evidence (dose study); else they are drawn."""
    claim_e, claim_a, claim_v = (int(rng.integers(cfg.n_entities)), int(rng.integers(cfg.n_attributes)),
                                 int(rng.integers(cfg.n_values)))
    if control:
        n_relevant = 0
    elif n_relevant is None:
        n_relevant = int(rng.integers(cfg.relevant_min, min(cfg.relevant_max, n) + 1))
    supports = (rng.random(n_relevant) < 0.5 if n_support is None
                else np.arange(n_relevant) < n_support)
    entities = rng.integers(cfg.n_entities - 1, size=n)
    entities = entities + (entities >= claim_e)  # distractors are about other entities
    attributes = rng.integers(cfg.n_attributes, size=n)
    values = rng.integers(cfg.n_values, size=n)
    relevant = np.zeros(n, dtype=bool)
    positions = _relevant_positions(n, n_relevant, primacy, rng)
    for position, support in zip(positions, supports):
        wrong = int(rng.integers(cfg.n_values - 1))
        entities[position], attributes[position] = claim_e, claim_a
        values[position] = claim_v if support else wrong + (wrong >= claim_v)
        relevant[position] = True
    label = NO_LABEL if control else gold_label(int(supports.sum()), int((~supports).sum()))
    return {"n_chunks": n, "entities": entities.tolist(), "attributes": attributes.tolist(),
            "values": values.tolist(), "relevant": relevant.tolist(), "claim_entity": claim_e,
            "claim_attribute": claim_a, "claim_value": claim_v, "label": label, "is_control": control,
            "masked": False, "dose": -1}


def training_item(cfg: ProceduralDataConfig, rng: np.random.Generator) -> dict[str, Any]:
    """A training item: a control gets a random target (no evidence about the claim: its prior is 1/2); every
    other item, masked or not, is trained on its gold label.

    A masked item has the value of every chunk masked (``mask_all_values`` at training time), as a skeleton
    has. Its skeleton still shows how many chunks are about the claim, and that count carries label
    information (the tie rule gives P(label 1 | 2 relevant) = 1/4, 1/2 for 1 or 3), so training it on the
    gold label teaches S_k the closed-book prior P(y | skeleton) the paper's budget measures against. Until
    the 12-02 review it got a random target, which pinned S_k near 1/2 [project design; README, deviation 5].
    The coin is still drawn for a masked item (and discarded) so that every item of a seed is as before."""
    n = int(rng.integers(cfg.train_n_min, cfg.train_n_max + 1))
    control = bool(rng.random() < cfg.control_fraction)
    item = make_item(cfg, n, rng, control=control, primacy=bool(rng.random() < cfg.primacy_fraction))
    if not control and rng.random() < cfg.masked_train_fraction:
        item["masked"] = True
    coin = int(rng.integers(2)) if control or item["masked"] else None
    item["target"] = coin if control else item["label"]
    return item


def evaluation_item(cfg: ProceduralDataConfig, n: int, rng: np.random.Generator) -> dict[str, Any]:
    """A val/test item: chunk order uniform (the test scores it under uniform permutations anyway)."""
    item = make_item(cfg, n, rng, control=bool(rng.random() < cfg.control_fraction))
    return item | {"target": item["label"]}


def dose_item(cfg: ProceduralDataConfig, dose: int, rng: np.random.Generator) -> dict[str, Any]:
    """L chunks, ``dose`` of them supporting the claim, the rest distractors; dose 0 is a control."""
    item = make_item(cfg, cfg.dose_chunks, rng, control=dose == 0, n_support=dose, n_relevant=dose)
    return item | {"target": item["label"], "dose": dose}


def procedural_items(cfg: ProceduralDataConfig, seed: int) -> pl.DataFrame:
    """Every split of one seed (streams of one generator per split, so a split's size never moves another)."""
    streams = np.random.SeedSequence([seed, 7_531]).spawn(len(SPLITS))
    rngs = dict(zip(SPLITS, (np.random.default_rng(s) for s in streams)))
    rows = [training_item(cfg, rngs["train"]) | {"split": "train"} for _ in range(cfg.n_train)]
    val_n = rngs["val"].integers(cfg.train_n_min, cfg.train_n_max + 1, size=cfg.n_val)
    rows += [evaluation_item(cfg, int(n), rngs["val"]) | {"split": "val"} for n in val_n]
    rows += [evaluation_item(cfg, n, rngs["test"]) | {"split": "test"}
             for n in cfg.test_n for _ in range(cfg.test_items_per_n)]
    rows += [dose_item(cfg, d, rngs["dose"]) | {"split": "dose"}
             for d in range(cfg.dose_chunks) for _ in range(cfg.dose_items_per_level)]
    frame = pl.DataFrame(rows)
    return frame.with_row_index("item_id").with_columns(pl.col("item_id").cast(pl.Int64))


def items_path(data_dir: Path, seed: int) -> Path:
    return Path(data_dir) / f"items_seed{seed}.parquet"


def meta_path(data_dir: Path, seed: int) -> Path:
    return Path(data_dir) / f"items_meta_seed{seed}.json"


def write_procedural(cfg: ProceduralDataConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    written = []
    for seed in seeds:
        frame = procedural_items(cfg, seed)
        written.append(write_parquet(frame, items_path(data_dir, seed)))
        written.append(write_json(meta_path(data_dir, seed), {"seed": seed, "data": cfg.model_dump(mode="json")}))
    return written


def read_procedural(cfg: ProceduralDataConfig, data_dir: Path, seed: int) -> pl.DataFrame:
    """The seed's items, after checking they were written for this very data config."""
    path, meta = items_path(data_dir, seed), meta_path(data_dir, seed)
    if not path.is_file() or not meta.is_file():
        raise FileNotFoundError(f"order_sensitivity.data: {path} (or its meta file) is missing; run the data "
                                f"phase first")
    stored = json.loads(meta.read_text(encoding="utf-8"))["data"]
    for key, value in cfg.model_dump(mode="json").items():
        if stored.get(key) != value:
            raise ValueError(f"order_sensitivity.data.{key}: {data_dir} was written with {stored.get(key)!r}, "
                             f"the config says {value!r}; rerun the data phase")
    return pl.read_parquet(path)


# ------------------------------------------------------------------------------------------------
# Rendering items as token ids under permutations
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ItemArrays:
    """Items of one chunk count as arrays: chunk triples (N, n, 3), relevant (N, n), claim triples (N, 3)."""

    chunk_tokens: np.ndarray
    relevant: np.ndarray
    claim_tokens: np.ndarray
    label: np.ndarray
    target: np.ndarray
    is_control: np.ndarray
    masked: np.ndarray
    dose: np.ndarray


def item_arrays(frame: pl.DataFrame, vocab: Vocabulary) -> ItemArrays:
    """(entity, attribute, claim-relative value) index triples of items that all have the same chunk count."""
    counts = frame["n_chunks"].unique().to_list()
    if len(counts) != 1:
        raise ValueError(f"item_arrays needs one chunk count, got {sorted(counts)}")
    n = counts[0]
    entities, attributes, values = (np.array(frame[c].to_list(), dtype=np.int64).reshape(-1, n)
                                    for c in ("entities", "attributes", "values"))
    claim_value = frame["claim_value"].to_numpy()[:, None]
    agreement = np.where(values == claim_value, vocab.agree, vocab.disagree)
    fields = [entities, attributes, agreement]
    claim = np.stack([frame["claim_entity"].to_numpy(), frame["claim_attribute"].to_numpy(),
                      np.full(frame.height, vocab.agree)], axis=1)
    return ItemArrays(np.stack(fields, axis=-1), np.array(frame["relevant"].to_list(), dtype=bool).reshape(-1, n),
                      claim.astype(np.int64), frame["label"].to_numpy(), frame["target"].to_numpy(),
                      frame["is_control"].to_numpy(), frame["masked"].to_numpy(), frame["dose"].to_numpy())


def mask_all_values(items: ItemArrays, vocab: Vocabulary, where: np.ndarray | None = None) -> np.ndarray:
    """Chunk triples with the value of EVERY chunk replaced by ``[M]`` (rows ``where``, default all).

    The skeleton of Algorithm 1 erases the evidence; a user of the method does not know which chunks are
    relevant, so every chunk's value is erased (as the official toolkit's evidence-erase skeleton blanks the
    whole evidence field). Entity and attribute stay: the skeleton keeps the prompt's structure. Gold
    relevance (``items.relevant``) is never read.
    """
    tokens = items.chunk_tokens.copy()
    rows = np.ones(len(tokens), dtype=bool) if where is None else np.asarray(where, dtype=bool)
    tokens[rows, :, 2] = vocab.mask
    return tokens


def render_ids(chunk_tokens: np.ndarray, claim_tokens: np.ndarray, orders: np.ndarray | None = None) -> np.ndarray:
    """Model inputs (N, [m,] n + 1, 3): the chunk triples in the given orders, then the claim triple.

    ``orders`` (N, m, n) are permutations of chunk indices; None keeps the stored order.
    """
    if orders is None:
        return np.concatenate([chunk_tokens, claim_tokens[:, None]], axis=1)
    n_items, m = orders.shape[:2]
    permuted = np.take_along_axis(chunk_tokens[:, None], orders[..., None], axis=2)  # (N, m, n, 3)
    claims = np.broadcast_to(claim_tokens[:, None, None], (n_items, m, 1, 3))
    return np.concatenate([permuted, claims], axis=2)


def random_orders(n_items: int, m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n_items, m, n) uniform random permutations of chunk indices."""
    return np.argsort(rng.random((n_items, m, n)), axis=-1)


# ------------------------------------------------------------------------------------------------
# Paper profile: real evidence items from the hub (tested with local stand-ins only)
# ------------------------------------------------------------------------------------------------

def _cut_words(text: str, max_words: int) -> str:
    return " ".join(str(text).split()[:max_words])


def _fever_item(row: dict[str, Any], max_words: int) -> dict[str, Any] | None:
    """A FEVER gold-evidence row: the evidence sentences are the relevant chunks, the claim is the claim.

    NOT ENOUGH INFO rows become controls (no relevant evidence). Distractors are added by :func:`add_distractors`.
    """
    label = str(row["label"]).upper()
    evidence = [_cut_words(e[2] if isinstance(e, list | tuple) else e, max_words) for e in row.get("evidence", [])]
    if label.startswith("NOT"):
        return {"claim": row["claim"], "chunks": [], "label": NO_LABEL, "is_control": True, "source": "fever"}
    if not evidence:
        return None
    return {"claim": row["claim"], "chunks": evidence, "label": int(label.startswith("SUPPORT")),
            "is_control": False, "source": "fever"}


def _hotpot_item(row: dict[str, Any], max_words: int) -> dict[str, Any]:
    """A HotpotQA distractor row as a binary claim "the answer to Q is A" (label 1); its supporting
    sentences are the relevant chunks, the other paragraphs' sentences are distractors [project design]."""
    titles, sentences = row["context"]["title"], row["context"]["sentences"]
    support = set(zip(row["supporting_facts"]["title"], row["supporting_facts"]["sent_id"]))
    relevant, other = [], []
    for title, sents in zip(titles, sentences):
        for i, sentence in enumerate(sents):
            (relevant if (title, i) in support else other).append(_cut_words(sentence, max_words))
    claim = f"The answer to \"{row['question']}\" is \"{row['answer']}\"."
    return {"claim": claim, "chunks": relevant, "label": 1, "is_control": False, "source": "hotpotqa",
            "distractors": other}


def add_distractors(items: list[dict[str, Any]], max_chunks: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Fill every item up to 3..max_chunks chunks with chunks of *other* items (relevant flag False)."""
    pool = [c for item in items for c in item["chunks"] + item.get("distractors", [])]
    out = []
    for index, item in enumerate(items):
        own = item.get("distractors", [])
        n_total = int(rng.integers(max(3, len(item["chunks"]) + 1), max_chunks + 1))
        extra = list(own[: n_total - len(item["chunks"])])
        while len(item["chunks"]) + len(extra) < n_total and pool:
            candidate = pool[int(rng.integers(len(pool)))]
            if candidate not in item["chunks"]:
                extra.append(candidate)
        chunks = item["chunks"] + extra
        out.append({"item_id": index, "claim": item["claim"], "chunks": chunks,
                    "relevant": [True] * len(item["chunks"]) + [False] * len(extra), "label": item["label"],
                    "is_control": item["is_control"], "source": item["source"], "n_chunks": len(chunks)})
    return out


def load_hub_items(hub: HubConfig, seed: int) -> pl.DataFrame:
    """Paper profile: FEVER (gold evidence) and HotpotQA (distractor) items by hub name, one subset per seed."""
    from datasets import load_dataset

    rng = np.random.default_rng(seed)
    fever = load_dataset(hub.fever_dataset, split=hub.fever_split)
    hotpot = load_dataset(hub.hotpot_dataset, hub.hotpot_config, split=hub.hotpot_split)
    items: list[dict[str, Any]] = []
    n_controls = int(round(hub.control_fraction * hub.items_per_source))
    fever_rows = [fever[int(i)] for i in rng.permutation(len(fever))]
    fever_items = [item for item in (_fever_item(r, hub.max_chunk_words) for r in fever_rows) if item is not None]
    controls = [i for i in fever_items if i["is_control"]][:n_controls]
    items += [i for i in fever_items if not i["is_control"]][: hub.items_per_source - len(controls)] + controls
    for i in rng.permutation(len(hotpot))[: hub.items_per_source]:
        items.append(_hotpot_item(hotpot[int(i)], hub.max_chunk_words))
    return pl.DataFrame(add_distractors(items, hub.max_chunks, rng))


def hub_items_path(data_dir: Path, seed: int) -> Path:
    return Path(data_dir) / f"hub_items_seed{seed}.parquet"


def write_data(cfg: OrderSensitivityConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data phase: the procedural items per seed, or (paper profile) each seed's real evidence items."""
    data_dir = Path(data_dir)
    if cfg.hub is None:
        return write_procedural(cfg.data, seeds, data_dir)
    return [write_parquet(load_hub_items(cfg.hub, seed), hub_items_path(data_dir, seed)) for seed in seeds]
