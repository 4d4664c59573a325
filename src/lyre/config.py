"""Typed configuration for every section of ``config/model_config.yaml``.

``load_config(path, overrides)`` reads the YAML file (or the built-in defaults), applies dotted
overrides such as ``scheduler.max_batch_size=8`` and returns a frozen tree of dataclasses.
Unknown keys, wrong types and out-of-range values raise :class:`ConfigError` with a message that
names the key, the value and what is allowed.

Each field's allowed range lives in its ``metadata`` (``ge``/``gt``/``le``/``lt``/``multiple_of``);
``Literal`` types give the allowed choices. Relations between keys are checked in
:func:`_check_relations`. Relative paths in the file are relative to the working directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from lyre.model.orpheus import OPENAI_VOICE_ALIASES, RIVA_SUBVOICES, VOICES
from lyre.service.options import SamplingOptions, describe_range, limits_of

DEFAULT_CONFIG_PATH = Path("config/model_config.yaml")


class ConfigError(ValueError):
    """A configuration value a user supplied is not acceptable."""


def _f(default: Any = dataclasses.MISSING, *, factory: Any = None, **limits: Any) -> Any:
    """A dataclass field whose metadata carries its allowed range."""
    if factory is not None:
        return field(default_factory=factory, metadata=limits)
    return field(default=default, metadata=limits)


# --------------------------------------------------------------------------------------------
# sections


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = None  # local Hugging Face checkpoint directory; wins when set
    hf_id: str = "canopylabs/orpheus-3b-0.1-ft"  # used when already in the local HF cache
    revision: str = "main"
    demo_dir: str = "models/demo"  # the demo checkpoint (random weights, noise audio)
    allow_demo: bool = True  # false: refuse to start on the demo checkpoint
    backend: Literal["auto", "torch", "trtllm"] = "auto"  # auto: trtllm when built + importable + GPU, else torch
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    cpu_threads: int = _f(0, ge=0, le=1024)  # torch threads of the PyTorch engine on CPU; 0 = half the cores
    voices: tuple[str, ...] = _f(factory=lambda: VOICES)
    default_voice: str = "tara"
    # other names of the voices (OpenAI's by default); voice names and aliases are case-insensitive
    voice_aliases: dict[str, str] = _f(factory=lambda: dict(OPENAI_VOICE_ALIASES))

    def resolve_voice(self, name: str) -> str | None:
        """The voice ``name`` means (a voice or an alias, any case), or None."""
        key = name.strip().lower()
        voice = next((v for v in self.voices if v.lower() == key), None)
        if voice is not None:
            return voice
        return next((v for a, v in self.voice_aliases.items() if a.lower() == key and v in self.voices), None)

    def aliases_of(self, voice: str) -> list[str]:
        return [a for a, v in self.voice_aliases.items() if v == voice]


@dataclass(frozen=True)
class CodecConfig:
    path: str | None = None  # local SNAC directory; wins when set
    hf_id: str = "hubertsiuzdak/snac_24khz"
    revision: str = "main"
    mode: Literal["stream", "window"] = "stream"  # stream: each frame decoded once; window: inside context windows
    runtime: Literal["auto", "torch", "onnxruntime", "openvino"] = "auto"  # stream mode: who runs the decoder
    onnx_dir: str = "models/codec-onnx"  # the exported streaming decoder, cached per codec and torch version
    cpu_threads: int = _f(0, ge=0, le=1024)  # threads of the onnxruntime / openvino codec; 0 = every core
    context_frames: int = _f(3, ge=0, le=9)
    warmup_frames: int = _f(4, ge=1, le=64)
    max_chunk_frames: int = _f(4, ge=1, le=64)
    max_round_ms: float = _f(50.0, gt=0.0, le=10000.0)
    noise: bool = True
    noise_seed: int | None = None
    fp16: bool = False
    device: Literal["auto", "cpu", "cuda"] = "auto"
    overlap: Literal["auto", "on", "off"] = "auto"


@dataclass(frozen=True)
class KVCacheConfig:
    max_seq_len: int = _f(4096, ge=64, le=131072)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    free_gpu_memory_fraction: float = _f(0.9, gt=0.0, le=1.0)
    enable_block_reuse: bool = True


@dataclass(frozen=True)
class SamplingConfig:
    """Defaults of every request's sampling; their limits are the request options' (lyre.service.options)."""

    temperature: float = _f(0.6, **limits_of(SamplingOptions, "temperature"))
    top_p: float = _f(0.8, **limits_of(SamplingOptions, "top_p"))
    top_k: int = _f(0, **limits_of(SamplingOptions, "top_k"))
    repetition_penalty: float = _f(1.1, **limits_of(SamplingOptions, "repetition_penalty"))
    repetition_window: int = _f(64, ge=0)
    max_tokens: int = _f(1200, **limits_of(SamplingOptions, "max_tokens"))
    min_tokens: int = _f(0, **limits_of(SamplingOptions, "min_tokens"))
    constrain_audio: bool = True
    seed: int | None = _f(None, **limits_of(SamplingOptions, "seed"))


@dataclass(frozen=True)
class SchedulerConfig:
    max_concurrent_sessions: int = _f(32, ge=1, le=4096)
    max_batch_size: int = _f(16, ge=1, le=4096)
    ttfb_priority_tokens: int = _f(20, ge=0)
    flush_first_n_tokens: int = _f(7, ge=7, le=7 * 64, multiple_of=7)
    flush_every_n_tokens: int = _f(14, ge=7, le=7 * 64, multiple_of=7)
    first_chunk: Literal["bridge", "eager"] = "bridge"
    max_pending: int = _f(64, ge=0)
    policy: Literal["fair", "deadline"] = "fair"
    max_wait_steps: int = _f(4, ge=1)
    max_prefill_tokens: int = _f(512, ge=16)
    reserved_slots: int = _f(2, ge=0)
    max_buffer_s: float = _f(2.0, gt=0.0, le=600.0)
    session_timeout_s: float = _f(120.0, gt=0.0, le=86400.0)
    consumer_timeout_s: float = _f(10.0, gt=0.0, le=3600.0)


@dataclass(frozen=True)
class TuningProfile:
    max_text_chars: int = _f(250, ge=1)
    target_concurrent: int = _f(16, ge=1)
    target_ttfb_ms: float = _f(150.0, gt=0.0)


def _default_profiles() -> dict[str, TuningProfile]:
    return {
        "conversational": TuningProfile(max_text_chars=250, target_concurrent=24, target_ttfb_ms=100.0),
        "longform": TuningProfile(max_text_chars=5000, target_concurrent=16, target_ttfb_ms=300.0),
    }


@dataclass(frozen=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = _f(8000, ge=0, le=65535)
    grpc_port: int = _f(50051, ge=0, le=65535)
    max_body_bytes: int = _f(262144, ge=1024)
    drain_timeout_s: float = _f(10.0, ge=0.0)
    # on SIGTERM: /ready and the gRPC health say "draining" this long before new requests are refused,
    # so a balancer polling /ready stops sending first (Kubernetes: the preStop sleep does this)
    drain_notice_s: float = _f(0.0, ge=0.0, le=600.0)
    # balancers whose X-Forwarded-For names the client (addresses or CIDRs): the per-client limit and
    # the consent record's address then count the real client, not the balancer
    trusted_proxies: tuple[str, ...] = ()
    api_key: str | None = None  # required as "Authorization: Bearer <key>" on /v1/ and gRPC when set
    # API key -> account name: with keys, every request needs one, and sees only its account's cloned
    # voices (api_key, when set too, is one more key, of the account "default")
    api_keys: dict[str, str] = _f(factory=dict)
    # limits a public server needs (each refused with a clear error)
    max_pending_text_chars: int = _f(10000, ge=1, le=10_000_000)  # text of an utterance waiting to be spoken
    # one request's whole text (REST input, gRPC/Riva Synthesize): past the profile's max_text_chars
    # it is split into sentences and spoken as one stream; OpenAI's limit by default
    max_input_chars: int = _f(4096, ge=1, le=10_000_000)
    ws_max_message_bytes: int = _f(65536, ge=1024, le=64 * 2**20)  # one WebSocket message
    max_contexts_per_socket: int = _f(8, ge=1, le=1024)  # utterances open at once on one WebSocket
    ws_idle_timeout_s: float = _f(300.0, gt=0.0, le=86400.0)  # a WebSocket with nothing to say is closed
    max_connections_per_client: int = _f(64, ge=0, le=100_000)  # open requests + sockets per address; 0 = off


@dataclass(frozen=True)
class VoicesConfig:
    """Cloned voices: the registry (a database), enrollment limits and the cached reference prompt."""

    database_url: str | None = None  # SQLAlchemy URL; None = sqlite:///<data_dir>/lyre.db (PostgreSQL works too)
    max_upload_bytes: int = _f(10 * 2**20, ge=1024, le=2**30)  # one enrollment's audio file
    min_seconds: float = _f(3.0, gt=0.0, le=600.0)  # reference clip duration
    max_seconds: float = _f(30.0, gt=0.0, le=600.0)
    max_per_account: int = _f(100, ge=1, le=1_000_000)
    max_transcript_chars_per_second: float = _f(30.0, gt=0.0)  # longer transcripts cannot be what the clip says
    prefix_cache_mb: int = _f(512, ge=0, le=1_000_000)  # KV of cloned voices' reference prompts (LRU); 0 = off
    sweep_s: float = _f(2.0, gt=0.0, le=3600.0)  # how often kept prefixes of voices deleted elsewhere are dropped


@dataclass(frozen=True)
class AuditConfig:
    """The audit trail: one row per synthesis, in the voices database."""

    enabled: bool = True
    retention_days: float = _f(90.0, gt=0.0)  # older rows are deleted (checked hourly and at start)
    # true: while rows cannot be written (disk full, database down) new syntheses are refused (503);
    # false: they go on, their rows kept in memory (up to max_queued_rows) and written once it works
    required: bool = True
    max_queued_rows: int = _f(100_000, ge=1)


@dataclass(frozen=True)
class WatermarkConfig:
    """The mark on every output (:mod:`lyre.audio.watermark`) and ``POST /v1/audio/verify``."""

    enabled: bool = True
    key: str = "lyre-watermark-v1"  # set your own: whoever knows the key can detect (and remove) the mark
    strength_db: float = _f(-24.0, ge=-60.0, le=-6.0)  # the mark's level under the speech it rides on
    threshold: float = _f(8.0, gt=0.0, le=100.0)  # detection score above which audio counts as marked


@dataclass(frozen=True)
class BuildConfig:
    engine_dir: str = "engines/orpheus-3b-fp8"
    quantization: Literal["fp8", "fp16", "bf16"] = "fp8"
    kv_cache_dtype: Literal["float16", "bfloat16"] = "float16"
    max_batch_size: int = _f(32, ge=1, le=4096)
    max_seq_len: int = _f(4096, ge=64, le=131072)
    max_input_len: int = _f(3072, ge=16)  # a cloned voice's prompt: its reference turn (up to ~2500 tokens) + text
    max_num_tokens: int = _f(8192, ge=64)
    use_paged_context_fmha: bool = True
    calibration_samples: int = _f(256, ge=1)


@dataclass(frozen=True)
class RivaConfig:
    """The Riva-compatible gRPC service (``nvidia.riva.tts.RivaSpeechSynthesis``)."""

    language_code: str = "en-US"  # what Riva clients ask for; another language is refused
    voice_name: str = "English-US"  # Riva voice names are "<voice_name>.<subvoice>"
    # Riva subvoice -> Lyre voice ("English-US.Female-1" -> tara); Lyre's names and aliases work as-is
    subvoices: dict[str, str] = _f(factory=lambda: dict(RIVA_SUBVOICES))

    def resolve_voice(self, name: str) -> str:
        """The Lyre voice a Riva-style ``name`` means, else ``name`` unchanged (a Lyre name or alias)."""
        prefix, dot, sub = name.strip().rpartition(".")
        if dot and prefix.lower() == self.voice_name.lower():
            return next((v for s, v in self.subvoices.items() if s.lower() == sub.lower()), name)
        return name


@dataclass(frozen=True)
class LyreConfig:
    model: ModelConfig = _f(factory=ModelConfig)
    codec: CodecConfig = _f(factory=CodecConfig)
    kv_cache: KVCacheConfig = _f(factory=KVCacheConfig)
    sampling: SamplingConfig = _f(factory=SamplingConfig)
    scheduler: SchedulerConfig = _f(factory=SchedulerConfig)
    profile: str = "conversational"
    tuning: dict[str, TuningProfile] = _f(factory=_default_profiles)
    server: ServerConfig = _f(factory=ServerConfig)
    riva: RivaConfig = _f(factory=RivaConfig)
    build: BuildConfig = _f(factory=BuildConfig)
    voices: VoicesConfig = _f(factory=VoicesConfig)
    audit: AuditConfig = _f(factory=AuditConfig)
    watermark: WatermarkConfig = _f(factory=WatermarkConfig)
    data_dir: str = "data"  # the default database lives here (created when missing)

    @property
    def active_profile(self) -> TuningProfile:
        return self.tuning[self.profile]


# --------------------------------------------------------------------------------------------
# loading


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] | Mapping[str, Any] = (),
) -> LyreConfig:
    """Load ``path`` (built-in defaults when None) and apply dotted ``overrides``.

    ``overrides`` is either ``["scheduler.max_batch_size=8", ...]`` (values parsed as YAML
    scalars, as from ``--set``) or a mapping ``{"scheduler.max_batch_size": 8}``.
    """
    raw: dict[str, Any] = {}
    source = "built-in defaults"
    if path is not None:
        path = Path(path)
        source = str(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(loaded).__name__}")
        raw = loaded
    return _from_raw(raw, overrides, f"in {source}{' with overrides' if overrides else ''}")


def apply_overrides(cfg: LyreConfig, overrides: Sequence[str] | Mapping[str, Any]) -> LyreConfig:
    """``cfg`` with dotted ``overrides`` applied and validated as load_config does."""
    return _from_raw(config_to_dict(cfg), overrides, "with overrides")


def _from_raw(raw: dict[str, Any], overrides: Sequence[str] | Mapping[str, Any], where: str) -> LyreConfig:
    for key, value in _parse_overrides(overrides):
        _set_dotted(raw, key, value)
    try:
        cfg = _build(LyreConfig, raw, "")
        _check_relations(cfg)
    except ConfigError as e:
        raise ConfigError(f"{e} ({where})") from None
    return cfg


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
    node[parts[-1]] = value


def _build(cls: type, raw: Any, path: str, base: Any = None) -> Any:
    """Construct dataclass ``cls`` from ``raw``; missing keys take ``base``'s or the defaults."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config key '{path}' = {raw!r} has the wrong type: expected a mapping of keys")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key in raw:
        if key not in names:
            where = f"'{path}.{key}'" if path else f"'{key}'"
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key {where}; valid keys here: {', '.join(names)}{hint}")
    kwargs = {}
    for f in fields(cls):
        key = f"{path}.{f.name}" if path else f.name
        current = getattr(base, f.name) if base is not None else _default_of(f)
        if f.name in raw:
            kwargs[f.name] = _convert(hints[f.name], raw[f.name], key, f.metadata, current)
        elif base is not None:
            kwargs[f.name] = current
    return cls(**kwargs)


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _convert(tp: Any, value: Any, key: str, limits: Mapping[str, Any], current: Any) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, key, limits, current)
    if origin is Literal:
        if isinstance(value, bool):  # YAML 1.1 reads on/off/yes/no as booleans: take the word the choices use
            value = next((w for w in (("on", "yes", "true") if value else ("off", "no", "false")) if w in args), value)
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"config key '{key}' = {value!r} is not allowed: must be one of {allowed}")
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key, base=current)
    if origin is dict:
        _, item_type = args
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key '{key}' = {value!r} has the wrong type: expected a mapping")
        merged = dict(current or {})
        for name, item in value.items():
            merged[str(name)] = _convert(item_type, item, f"{key}.{name}", {}, merged.get(str(name)))
        return merged
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ConfigError(f"config key '{key}' = {value!r} has the wrong type: expected a list")
        return tuple(_convert(args[0], v, f"{key}[{i}]", {}, None) for i, v in enumerate(value))
    return _check_scalar(tp, value, key, limits)


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _check_scalar(tp: type, value: Any, key: str, limits: Mapping[str, Any]) -> Any:
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[tp]
    if not ok:
        raise ConfigError(f"config key '{key}' = {value!r} has the wrong type: expected {_TYPE_NAMES[tp]}")
    if tp is float:
        value = float(value)
    tests = {"ge": float.__ge__, "gt": float.__gt__, "le": float.__le__, "lt": float.__lt__}
    for name, test in tests.items():
        if name in limits and not test(float(value), float(limits[name])):
            raise ConfigError(f"config key '{key}' = {value!r} is out of range: {describe_range(limits)}")
    if "multiple_of" in limits and value % limits["multiple_of"]:
        raise ConfigError(f"config key '{key}' = {value!r} is not allowed: {describe_range(limits)}")
    return value


def _check_relations(cfg: LyreConfig) -> None:
    import ipaddress

    for i, proxy in enumerate(cfg.server.trusted_proxies):
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise ConfigError(f"config key 'server.trusted_proxies[{i}]' = {proxy!r} is not an IP address or CIDR "
                              "network") from None
    s = cfg.scheduler
    if s.max_batch_size > s.max_concurrent_sessions:
        raise ConfigError(
            f"config key 'scheduler.max_batch_size' = {s.max_batch_size} is out of range: must be <= "
            f"scheduler.max_concurrent_sessions ({s.max_concurrent_sessions})"
        )
    if cfg.profile not in cfg.tuning:
        raise ConfigError(
            f"config key 'profile' = {cfg.profile!r} is not allowed: must be one of the tuning profiles "
            f"({', '.join(sorted(cfg.tuning))})"
        )
    if cfg.sampling.max_tokens >= cfg.kv_cache.max_seq_len:
        raise ConfigError(
            f"config key 'sampling.max_tokens' = {cfg.sampling.max_tokens} is out of range: must be < "
            f"kv_cache.max_seq_len ({cfg.kv_cache.max_seq_len}) to leave room for the prompt"
        )
    if not cfg.model.voices:
        raise ConfigError("config key 'model.voices' = [] is not allowed: name at least one voice")
    for alias, voice in cfg.model.voice_aliases.items():
        if voice not in cfg.model.voices and OPENAI_VOICE_ALIASES.get(alias) != voice:  # a default may point at
            # a voice this config does not serve: it is unused (resolve_voice skips it)
            raise ConfigError(f"config key 'model.voice_aliases.{alias}' = {voice!r} is not allowed: must be one of "
                              f"model.voices ({', '.join(cfg.model.voices)})")
        if alias.lower() in (v.lower() for v in cfg.model.voices):
            raise ConfigError(f"config key 'model.voice_aliases.{alias}' is not allowed: {alias!r} is a voice's own name")
    for sub, voice in cfg.riva.subvoices.items():
        if voice not in cfg.model.voices and RIVA_SUBVOICES.get(sub) != voice:
            raise ConfigError(f"config key 'riva.subvoices.{sub}' = {voice!r} is not allowed: must be one of "
                              f"model.voices ({', '.join(cfg.model.voices)})")
    if cfg.model.default_voice not in cfg.model.voices:
        raise ConfigError(
            f"config key 'model.default_voice' = {cfg.model.default_voice!r} is not allowed: must be one of "
            f"model.voices ({', '.join(cfg.model.voices)})"
        )
    c = cfg.codec
    if c.max_chunk_frames < s.flush_every_n_tokens // 7:
        raise ConfigError(
            f"config key 'codec.max_chunk_frames' = {c.max_chunk_frames} is out of range: must be >= "
            f"scheduler.flush_every_n_tokens / 7 ({s.flush_every_n_tokens // 7}), the smallest later chunk"
        )
    chunk_s = c.max_chunk_frames * 2048 / 24000
    if s.consumer_timeout_s <= chunk_s:
        raise ConfigError(
            f"config key 'scheduler.consumer_timeout_s' = {s.consumer_timeout_s} is out of range: must be > the "
            f"longest chunk, codec.max_chunk_frames ({c.max_chunk_frames}) x 85.3 ms = {chunk_s:.2f} s, or a client "
            f"that takes each chunk when its player needs it would count as slow"
        )
    if c.warmup_frames < s.flush_first_n_tokens // 7:
        raise ConfigError(
            f"config key 'codec.warmup_frames' = {c.warmup_frames} is out of range: must be >= "
            f"scheduler.flush_first_n_tokens / 7 ({s.flush_first_n_tokens // 7}), or the first chunk could not be "
            f"provisional and would wait for exact audio"
        )
    v = cfg.voices
    if v.min_seconds >= v.max_seconds:
        raise ConfigError(f"config key 'voices.min_seconds' = {v.min_seconds} is out of range: must be < "
                          f"voices.max_seconds ({v.max_seconds})")
    for key, account in cfg.server.api_keys.items():
        if not key.strip() or not account.strip():
            raise ConfigError("config key 'server.api_keys' holds an empty key or account name")
    b = cfg.build
    if b.max_input_len >= b.max_seq_len:
        raise ConfigError(
            f"config key 'build.max_input_len' = {b.max_input_len} is out of range: must be < "
            f"build.max_seq_len ({b.max_seq_len})"
        )


# --------------------------------------------------------------------------------------------
# presentation and command line


def config_to_dict(cfg: Any) -> Any:
    """Plain dicts/lists/scalars, in the shape of the YAML file."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in fields(cfg)}
    if isinstance(cfg, dict):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, tuple):
        return [config_to_dict(v) for v in cfg]
    return cfg


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
