"""Loading and validating ``params.yaml``.

Every paper declares a pydantic model of one profile's section in ``tasks/<slug>/config.py``
(``CONFIG``). Validation happens before any compute; a bad value fails with the dotted key path
and the reason, e.g. ``arm_ebm.cpu.gpt2.n_layer: must be >= 1 (got 0)``. Unknown keys are errors.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tasks.common.env import PROFILES, repo_root

TOP_LEVEL_KEYS = ("profile", "seeds", "papers")
PAPER_SEEDS_KEY = "seeds"
MAX_SEED = 2**32 - 1  # numpy's and torch's seeding take unsigned 32-bit seeds
MIN_SEEDS = {"cpu": 3}  # the cpu profile's verdicts need an interval over at least three seeds


class ParamsError(ValueError):
    """A bad entry in params.yaml or on the command line; the message names the key path."""


class ProfileConfig(BaseModel):
    """Base of every config section: strict, immutable, no unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class PaperConfig(ProfileConfig):
    """Base of a paper's whole profile section (``<slug>.<profile>``): the knobs every paper has.

    ``device``: auto | cpu | cuda | mps; ``auto`` picks the best available (tasks/common/devices.py).
    """

    device: str = Field(default="auto", pattern="^(auto|cpu|cuda|mps)$")


@dataclass(frozen=True)
class RunSpec:
    """Everything a paper run needs to know about its parameters, validated."""

    slug: str
    profile: str
    seeds: tuple[int, ...]
    config: ProfileConfig
    params_hash: str

    def describe(self) -> dict[str, Any]:
        return {"slug": self.slug, "profile": self.profile, "seeds": list(self.seeds),
                "params_hash": self.params_hash, "config": self.config.model_dump(mode="json")}


def params_path(path: str | Path | None = None) -> Path:
    return Path(path) if path else repo_root() / "params.yaml"


def read_params(path: str | Path | None = None) -> dict[str, Any]:
    file = params_path(path)
    if not file.exists():
        raise ParamsError(f"params: file not found: {file}")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"params: {file} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ParamsError(f"params: top level of {file} must be a mapping")
    return data


def known_papers() -> list[str]:
    """Paper folders: ``tasks/<slug>/`` holding a ``config.py``."""
    tasks_dir = repo_root() / "tasks"
    return sorted(p.name for p in tasks_dir.iterdir() if (p / "config.py").is_file() and p.name != "common")


def config_model(slug: str) -> type[ProfileConfig]:
    if slug not in known_papers():
        raise ParamsError(f"paper: unknown paper {slug!r} (known: {', '.join(known_papers())})")
    module = importlib.import_module(f"tasks.{slug}.config")
    return module.CONFIG


def validate_profile(profile: Any, key: str = "profile") -> str:
    if profile not in PROFILES:
        raise ParamsError(f"{key}: must be one of {'|'.join(PROFILES)}, got {profile!r}")
    return profile


def validate_seeds(seeds: Any, key: str = "seeds") -> tuple[int, ...]:
    if not isinstance(seeds, list | tuple) or not seeds:
        raise ParamsError(f"{key}: must be a non-empty list of integers, got {seeds!r}")
    for i, seed in enumerate(seeds):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise ParamsError(f"{key}[{i}]: must be an integer in [0, {MAX_SEED}], got {seed!r}")
    if len(set(seeds)) != len(seeds):
        raise ParamsError(f"{key}: seeds must be distinct, got {list(seeds)}")
    return tuple(int(s) for s in seeds)


def check_enough_seeds(profile: str, seeds: tuple[int, ...], key: str) -> None:
    """A profile whose verdicts rest on intervals over seeds refuses fewer seeds than it needs."""
    needed = MIN_SEEDS.get(profile, 1)
    if len(seeds) < needed:
        raise ParamsError(f"{key}: the {profile} profile needs at least {needed} seeds (an interval over seeds "
                          f"decides its claims), got {list(seeds)}")


def _format_validation_error(prefix: str, err: ValidationError) -> str:
    first = err.errors()[0]
    path = ".".join([prefix, *[str(p) for p in first["loc"]]])
    reason = first["msg"]
    if first["type"] == "extra_forbidden":
        reason = "unknown key"
    given = first.get("input")
    return f"{path}: {reason} (got {given!r})" if first["type"] != "missing" else f"{path}: {reason}"


def validate_paper_section(slug: str, section: Any) -> dict[str, ProfileConfig]:
    """Validate all three profiles of one paper's section."""
    model = config_model(slug)
    if not isinstance(section, dict):
        raise ParamsError(f"{slug}: must be a mapping with keys {'|'.join(PROFILES)}")
    for key in section:
        if key not in PROFILES and key != PAPER_SEEDS_KEY:
            raise ParamsError(f"{slug}.{key}: unknown profile (expected {'|'.join(PROFILES)} or "
                              f"{PAPER_SEEDS_KEY})")
    paper_seeds(slug, section)
    configs = {}
    for profile in PROFILES:
        if profile not in section:
            raise ParamsError(f"{slug}.{profile}: missing profile section")
        configs[profile] = validate_profile_section(model, f"{slug}.{profile}", section[profile])
    return configs


# No size, count or step number of any paper at any profile comes near this (the largest is 200,000); a value
# above it is a typo that would otherwise fail minutes later, or allocate until the machine swaps.
MAX_PARAM_INT = 10_000_000


def check_integer_bounds(key: str, value: Any) -> None:
    """Every integer of a profile section is at most ``MAX_PARAM_INT`` in absolute value (papers' configs add
    tighter bounds of their own)."""
    if isinstance(value, dict):
        for name, item in value.items():
            check_integer_bounds(f"{key}.{name}", item)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_integer_bounds(f"{key}[{i}]", item)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_PARAM_INT:
        raise ParamsError(f"{key}: {value} is beyond {MAX_PARAM_INT:,}, the largest size, count or step number "
                          "any profile accepts (a typo?)")


def validate_profile_section(model: type[ProfileConfig], key: str, section: Any) -> ProfileConfig:
    """One profile section, validated with JSON's strict types: ``true`` is no integer and ``"3"`` no number
    (pydantic's lax Python mode would read them as 1 and 3), while YAML lists still fill tuple fields."""
    check_integer_bounds(key, section or {})
    try:
        payload = json.dumps(section or {})
    except (TypeError, ValueError) as err:
        raise ParamsError(f"{key}: holds a value that is not plain YAML data ({err})") from None
    try:
        return model.model_validate_json(payload, strict=True)
    except ValidationError as err:
        raise ParamsError(_format_validation_error(key, err)) from None


def paper_seeds(slug: str, section: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """A paper's own seeds per profile (``<slug>.seeds.<profile>``), overriding the top-level ``seeds``.

    Papers whose claims are noisy run more seeds at cpu (five) than the default three.
    """
    raw = section.get(PAPER_SEEDS_KEY) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{slug}.{PAPER_SEEDS_KEY}: must map a profile to a list of seeds, got {raw!r}")
    out = {}
    for profile, seeds in raw.items():
        if profile not in PROFILES:
            raise ParamsError(f"{slug}.{PAPER_SEEDS_KEY}.{profile}: unknown profile (expected {'|'.join(PROFILES)})")
        key = f"{slug}.{PAPER_SEEDS_KEY}.{profile}"
        out[profile] = validate_seeds(seeds, key=key)
        check_enough_seeds(profile, out[profile], key)
    return out


def validate_params(params: dict[str, Any]) -> None:
    """Check the whole file: top-level keys, profile, seeds, the paper list and every section."""
    papers = params.get("papers", [])
    if not isinstance(papers, list):
        raise ParamsError(f"papers: must be a list of paper slugs, got {papers!r}")
    known = known_papers()
    for i, slug in enumerate(papers):
        if slug not in known:
            raise ParamsError(f"papers[{i}]: unknown paper {slug!r} (known: {', '.join(known)})")
    for key in params:
        if key not in TOP_LEVEL_KEYS and key not in known:
            raise ParamsError(f"{key}: unknown key (expected {', '.join(TOP_LEVEL_KEYS)} or a paper slug)")
    check_enough_seeds(validate_profile(params.get("profile")), validate_seeds(params.get("seeds")), "seeds")
    for slug in papers:
        validate_paper_section(slug, params.get(slug))


def hash_config(slug: str, profile: str, seeds: tuple[int, ...], config: BaseModel) -> str:
    payload = json.dumps({"slug": slug, "profile": profile, "seeds": list(seeds),
                          "config": config.model_dump(mode="json")}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def resolve_run(slug: str, profile: str | None = None, seeds: list[int] | tuple[int, ...] | None = None,
                path: str | Path | None = None) -> RunSpec:
    """Validated run specification of one paper; command-line overrides win over params.yaml."""
    params = read_params(path)
    if slug not in known_papers():
        raise ParamsError(f"paper: unknown paper {slug!r} (known: {', '.join(known_papers())})")
    chosen_profile = validate_profile(profile if profile is not None else params.get("profile"),
                                      key="profile" if profile is None else "--profile")
    if slug not in params:
        raise ParamsError(f"{slug}: no section for this paper in {params_path(path)}")
    configs = validate_paper_section(slug, params[slug])
    own_seeds = paper_seeds(slug, params[slug]).get(chosen_profile)
    if seeds is not None:
        chosen_seeds = validate_seeds(list(seeds), key="--seeds")
    elif own_seeds is not None:
        chosen_seeds = own_seeds
    else:
        chosen_seeds = validate_seeds(params.get("seeds"), key="seeds")
    check_enough_seeds(chosen_profile, chosen_seeds,
                       "--seeds" if seeds is not None else f"{slug}.seeds.{chosen_profile}" if own_seeds else "seeds")
    config = configs[chosen_profile]
    return RunSpec(slug, chosen_profile, chosen_seeds, config,
                   hash_config(slug, chosen_profile, chosen_seeds, config))


def params_section(slug: str, path: str | Path | None = None) -> dict[str, Any]:
    """A fresh copy of one paper's raw section of params.yaml (tests mutate it to check errors)."""
    params = read_params(path)
    if slug not in params:
        raise ParamsError(f"{slug}: no section for this paper in {params_path(path)}")
    return copy.deepcopy(params[slug])
