"""Reading a config: the YAML file (or the built-in defaults), dotted overrides such as
``scheduler.max_batch_size=8`` (``--set``), validation against :mod:`lyre.config.schema`, then the
rules between keys (:mod:`lyre.config.checks`). A refusal is a :class:`ConfigError` naming the key,
the value and what is allowed. Relative paths in the file are relative to the working directory.

Keys missing from the file take their defaults; a mapping in the file (a section, a tuning
profile, ``voice_aliases``) is merged into the default one key by key, so a file names only what
it changes.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from lyre.config import checks
from lyre.config.schema import LyreConfig
from lyre.config.validation import EXPECTED, RANGE_ERRORS, ConfigError, describe_range, limits_of

DEFAULT_CONFIG_PATH = Path("config/model_config.yaml")

__all__ = ["DEFAULT_CONFIG_PATH", "ConfigError", "add_config_arguments", "apply_overrides", "config_from_args",
           "config_to_dict", "load_config"]


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] | Mapping[str, Any] = (),
) -> LyreConfig:
    """Load ``path`` (built-in defaults when None) and apply dotted ``overrides``.

    ``overrides`` is either ``["scheduler.max_batch_size=8", ...]`` (values parsed as YAML
    scalars, as from ``--set``) or a mapping ``{"scheduler.max_batch_size": 8}``.
    """
    raw: Any = {}
    source = "built-in defaults"
    if path is not None:
        path = Path(path)
        source = str(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(raw).__name__}")
    return _build(_merge(config_to_dict(LyreConfig()), raw), overrides,
                  f"in {source}{' with overrides' if overrides else ''}")


def apply_overrides(cfg: LyreConfig, overrides: Sequence[str] | Mapping[str, Any]) -> LyreConfig:
    """``cfg`` with dotted ``overrides`` applied and validated as load_config does."""
    return _build(config_to_dict(cfg), overrides, "with overrides")


def config_to_dict(cfg: BaseModel) -> dict[str, Any]:
    """Plain dicts, lists and scalars, in the shape of the YAML file."""
    return cfg.model_dump(mode="json")


def _build(raw: dict[str, Any], overrides: Sequence[str] | Mapping[str, Any], where: str) -> LyreConfig:
    for key, value in _parse_overrides(overrides):
        _set_dotted(raw, key, value)
    try:
        try:
            cfg = LyreConfig.model_validate(raw)
        except ValidationError as e:
            raise ConfigError(_describe(e.errors(include_url=False)[0])) from None
        checks.check(cfg)
    except ConfigError as e:
        raise ConfigError(f"{e} ({where})") from None
    return cfg


def _merge(base: Any, given: Any) -> Any:
    """``given`` over ``base``: mappings key by key, anything else replaced."""
    if not (isinstance(base, dict) and isinstance(given, dict)):
        return given
    merged = dict(base)
    for key, value in given.items():
        merged[key] = _merge(base.get(key), value) if key in base else value
    return merged


def _parse_overrides(overrides: Sequence[str] | Mapping[str, Any]) -> list[tuple[str, Any]]:
    if isinstance(overrides, Mapping):
        return list(overrides.items())
    out = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        out.append((key, value))
    return out


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: '{'.'.join(parts[: i + 1])}' is not a section")
        node = child
    node[parts[-1]] = _merge(node.get(parts[-1]), value)


# --------------------------------------------------------------------------------------------
# the refusal


def _describe(err: dict[str, Any]) -> str:
    """pydantic's first error as Lyre says it: the key, the value given, the rule."""
    loc = err["loc"]
    key = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc))
    kind, got = err["type"], err.get("input")
    if kind == "extra_forbidden":
        names = list(_model_at(loc[:-1]).model_fields)
        close = difflib.get_close_matches(str(loc[-1]), names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"unknown config key '{key}'; valid keys here: {', '.join(names)}{hint}"
    if kind in RANGE_ERRORS:
        limits = limits_of(_model_at(loc[:-1]), str(loc[-1]))
        verdict = "is not allowed" if kind == "multiple_of" else "is out of range"
        return f"config key '{key}' = {got!r} {verdict}: {describe_range(limits)}"
    if kind == "literal_error":
        return f"config key '{key}' = {got!r} is not allowed: must be one of {err['ctx']['expected'].replace(' or ', ', ')}"
    if kind in EXPECTED:
        return f"config key '{key}' = {got!r} has the wrong type: expected {EXPECTED[kind]}"
    return f"config key '{key}' = {got!r} is not allowed: {err['msg']}"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel]:
    """The section class that holds the key at ``loc`` + (name,)."""
    tp: Any = LyreConfig
    for part in loc:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            tp = tp.model_fields[part].annotation
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        while get_origin(tp) is not None and get_origin(tp) is not dict:  # X | None
            tp = next(a for a in get_args(tp) if a is not type(None))
    return tp


# --------------------------------------------------------------------------------------------
# command-line options


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and the repeatable ``--set section.key=value`` to a CLI."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"YAML config file (default: {DEFAULT_CONFIG_PATH} when it exists, else built-in defaults)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set scheduler.max_batch_size=8 (repeatable)",
    )


def config_from_args(args: argparse.Namespace) -> LyreConfig:
    path = args.config
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        path = DEFAULT_CONFIG_PATH
    return load_config(path, args.overrides)
