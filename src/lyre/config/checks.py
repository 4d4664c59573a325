"""The rules that relate keys of several sections (each key's own rule is declared in
:mod:`lyre.config.schema`). Each refusal names the key, its value and the key it must agree with."""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

from lyre.config.schema import API_KEYS_ENV, LyreConfig, window_seconds
from lyre.config.validation import ConfigError
from lyre.model.orpheus import (
    FRAME_TOKENS,
    OPENAI_VOICE_ALIASES,
    RIVA_SUBVOICES,
    RIVA_VOICE_ALIASES,
    SAMPLE_RATE,
    SAMPLES_PER_FRAME,
)


def check(cfg: LyreConfig) -> None:
    """Raise :class:`ConfigError` for the first rule ``cfg`` breaks."""
    for rule in (_server, _scheduler, _batch, _voices, _codec, _cloning, _build):
        rule(cfg)


def _server(cfg: LyreConfig) -> None:
    for i, proxy in enumerate(cfg.server.trusted_proxies):
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise ConfigError(f"config key 'server.trusted_proxies[{i}]' = {proxy!r} is not an IP address or CIDR "
                              "network") from None
    for key, account in cfg.server.api_keys.items():
        if not key.strip() or not account.strip():
            raise ConfigError("config key 'server.api_keys' holds an empty key or account name")
    for i, origin in enumerate(cfg.server.cors_origins):
        if (why := origin_error(origin)) is not None:
            raise ConfigError(f"config key 'server.cors_origins[{i}]' = {origin!r} is not allowed: {why}")
    keyed = cfg.server.api_key or cfg.server.api_keys or cfg.server.api_keys_file or os.environ.get(API_KEYS_ENV)
    if "*" in cfg.server.cors_origins and keyed:
        raise ConfigError("config key 'server.cors_origins' = ['*'] is not allowed with API keys: any page could use "
                          "a key a user typed into it; list the origins of your pages")


def origin_error(origin: str) -> str | None:
    """Why ``origin`` cannot be a ``server.cors_origins`` entry, or None."""
    if origin == "*":
        return None
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") or parts.query \
            or parts.fragment or "@" in parts.netloc:
        return "must be * or an origin: scheme://host[:port], e.g. https://app.example.com"
    return None


def _scheduler(cfg: LyreConfig) -> None:
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


def _batch(cfg: LyreConfig) -> None:
    b = cfg.batch
    seconds = window_seconds(b.completion_window)
    if seconds is None or not 0 < seconds <= b.max_completion_window_s:
        raise ConfigError(f"config key 'batch.completion_window' = {b.completion_window!r} is not allowed: give a "
                          f"duration such as 24h, 90m or 3600s, up to batch.max_completion_window_s "
                          f"({b.max_completion_window_s:.0f} s)")


def _voices(cfg: LyreConfig) -> None:
    m = cfg.model
    if not m.voices:
        raise ConfigError("config key 'model.voices' = [] is not allowed: name at least one voice")
    for alias, voice in m.voice_aliases.items():
        if voice not in m.voices and OPENAI_VOICE_ALIASES.get(alias) != voice:  # a default may point at a
            # voice this config does not serve: it is unused (resolve_voice skips it)
            raise ConfigError(f"config key 'model.voice_aliases.{alias}' = {voice!r} is not allowed: must be one of "
                              f"model.voices ({', '.join(m.voices)})")
        if alias.lower() in (v.lower() for v in m.voices):
            raise ConfigError(f"config key 'model.voice_aliases.{alias}' is not allowed: {alias!r} is a voice's own name")
    for sub, voice in cfg.riva.subvoices.items():
        if voice not in m.voices and RIVA_SUBVOICES.get(sub) != voice:
            raise ConfigError(f"config key 'riva.subvoices.{sub}' = {voice!r} is not allowed: must be one of "
                              f"model.voices ({', '.join(m.voices)})")
    for alias, voice in cfg.riva.voice_aliases.items():
        if voice not in m.voices and RIVA_VOICE_ALIASES.get(alias) != voice:  # (a default for a voice not served)
            raise ConfigError(f"config key 'riva.voice_aliases.{alias}' = {voice!r} is not allowed: must be one of "
                              f"model.voices ({', '.join(m.voices)})")
    if m.default_voice not in m.voices:
        raise ConfigError(
            f"config key 'model.default_voice' = {m.default_voice!r} is not allowed: must be one of "
            f"model.voices ({', '.join(m.voices)})"
        )


def _codec(cfg: LyreConfig) -> None:
    c, s = cfg.codec, cfg.scheduler
    if c.max_chunk_frames < s.flush_every_n_tokens // FRAME_TOKENS:
        raise ConfigError(
            f"config key 'codec.max_chunk_frames' = {c.max_chunk_frames} is out of range: must be >= "
            f"scheduler.flush_every_n_tokens / 7 ({s.flush_every_n_tokens // FRAME_TOKENS}), the smallest later chunk"
        )
    chunk_s = c.max_chunk_frames * SAMPLES_PER_FRAME / SAMPLE_RATE
    if s.consumer_timeout_s <= chunk_s:
        raise ConfigError(
            f"config key 'scheduler.consumer_timeout_s' = {s.consumer_timeout_s} is out of range: must be > the "
            f"longest chunk, codec.max_chunk_frames ({c.max_chunk_frames}) x 85.3 ms = {chunk_s:.2f} s, or a client "
            f"that takes each chunk when its player needs it would count as slow"
        )
    if c.warmup_frames < s.flush_first_n_tokens // FRAME_TOKENS:
        raise ConfigError(
            f"config key 'codec.warmup_frames' = {c.warmup_frames} is out of range: must be >= "
            f"scheduler.flush_first_n_tokens / 7 ({s.flush_first_n_tokens // FRAME_TOKENS}), or the first chunk "
            f"could not be provisional and would wait for exact audio"
        )


def _cloning(cfg: LyreConfig) -> None:
    v = cfg.voices
    if v.min_seconds >= v.max_seconds:
        raise ConfigError(f"config key 'voices.min_seconds' = {v.min_seconds} is out of range: must be < "
                          f"voices.max_seconds ({v.max_seconds})")


def _build(cfg: LyreConfig) -> None:
    b = cfg.build
    if b.max_input_len >= b.max_seq_len:
        raise ConfigError(
            f"config key 'build.max_input_len' = {b.max_input_len} is out of range: must be < "
            f"build.max_seq_len ({b.max_seq_len})"
        )
