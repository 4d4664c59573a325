"""The sections of ``config/model_config.yaml``: each key's type, default and allowed range, declared.

Every section is a frozen pydantic model that refuses unknown keys and takes values as YAML gives
them, strictly: ``1.5`` is not an integer, ``true`` is not a number, ``"1"`` is not a number. A
choice (``Literal``) also takes YAML's booleans for the words ``on``/``off`` and ``yes``/``no``
(YAML 1.1 reads those as booleans). Rules between keys of several sections are in
:mod:`lyre.config.checks`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from lyre.model.orpheus import OPENAI_VOICE_ALIASES, RIVA_SUBVOICES, RIVA_VOICE_ALIASES, VOICES


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _yaml_word(choices: tuple[str, ...]):
    """YAML 1.1 reads on/off/yes/no/true/false as booleans: take the word the choices use."""

    def word(value: Any) -> Any:
        if isinstance(value, bool):
            return next((w for w in (("on", "yes", "true") if value else ("off", "no", "false")) if w in choices), value)
        return value

    return word


def choice(*words: str) -> Any:
    """A key whose value is one of ``words``."""
    return Annotated[Literal[words], BeforeValidator(_yaml_word(words))]


def _listed(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


Names = Annotated[tuple[str, ...], BeforeValidator(_listed)]  # a YAML list of strings
Device = choice("auto", "cpu", "cuda")
DType = choice("auto", "float32", "bfloat16", "float16")


class ModelConfig(Section):
    path: str | None = None  # local Hugging Face checkpoint directory; wins when set
    hf_id: str = "canopylabs/orpheus-3b-0.1-ft"  # used when already in the local HF cache
    revision: str = "main"
    demo_dir: str = "models/demo"  # the demo checkpoint (random weights, noise audio)
    allow_demo: bool = True  # false: refuse to start on the demo checkpoint
    family: choice("auto", "orpheus", "qwen3-tts") = "auto"  # auto: the checkpoint's config.json says
    backend: choice("auto", "torch", "trtllm") = "auto"  # auto: trtllm when built + importable + GPU, else torch
    device: Device = "auto"
    dtype: DType = "auto"
    cpu_threads: int = Field(0, ge=0, le=1024)  # torch threads of the PyTorch engine on CPU; 0 = half the cores
    quantize: choice("none", "int8") = "none"  # int8: the PyTorch engine's decoder linears with int8 weights (CPU)
    keep_freed_memory: bool = False  # CPU: glibc keeps freed step memory (lyre.engine.torch.host_heap)
    voices: Names = VOICES
    default_voice: str = "tara"
    # other names of the voices (OpenAI's by default); voice names and aliases are case-insensitive
    voice_aliases: dict[str, str] = Field(default_factory=lambda: dict(OPENAI_VOICE_ALIASES))

    def resolve_voice(self, name: str) -> str | None:
        """The voice ``name`` means (a voice or an alias, any case), or None."""
        key = name.strip().lower()
        voice = next((v for v in self.voices if v.lower() == key), None)
        if voice is not None:
            return voice
        return next((v for a, v in self.voice_aliases.items() if a.lower() == key and v in self.voices), None)

    def aliases_of(self, voice: str) -> list[str]:
        return [a for a, v in self.voice_aliases.items() if v == voice]


class CodecConfig(Section):
    path: str | None = None  # local SNAC directory; wins when set
    hf_id: str = "hubertsiuzdak/snac_24khz"
    revision: str = "main"
    mode: choice("stream", "window") = "stream"  # stream: each frame decoded once; window: inside context windows
    runtime: choice("auto", "torch", "onnxruntime", "openvino") = "auto"  # stream mode: who runs the decoder
    onnx_dir: str = "models/codec-onnx"  # the exported streaming decoder, cached per codec and torch version
    cpu_threads: int = Field(0, ge=0, le=1024)  # threads of the onnxruntime / openvino codec; 0 = every core
    context_frames: int = Field(3, ge=0, le=9)
    warmup_frames: int = Field(4, ge=1, le=64)
    max_chunk_frames: int = Field(4, ge=1, le=64)
    max_round_ms: float = Field(50.0, gt=0.0, le=10000.0)
    noise: bool = True
    noise_seed: int | None = None
    fp16: bool = False
    device: Device = "auto"
    overlap: choice("auto", "on", "off") = "auto"


class KVCacheConfig(Section):
    max_seq_len: int = Field(4096, ge=64, le=131072)
    dtype: DType = "auto"
    free_gpu_memory_fraction: float = Field(0.9, gt=0.0, le=1.0)
    enable_block_reuse: bool = True


class EngineConfig(Section):
    # on a GPU, the PyTorch engine's decode steps (Orpheus, Qwen3-TTS) are CUDA graphs captured at start (a failed
    # capture stops the start, naming the bucket); false: the same steps run eagerly (launch-bound: several times slower)
    cuda_graphs: bool = True


MIN_TEMPERATURE = 0.01


class SamplingConfig(Section):
    """Defaults of every request's sampling, and the one place their limits are declared: a
    request's own values (:class:`lyre.service.options.SamplingOptions`) and an engine's last check
    (:meth:`lyre.engine.base.SamplingParams.validate`) are held to these."""

    temperature: float = Field(0.6, ge=0.0, le=5.0)  # 0 = greedy; else at least MIN_TEMPERATURE
    top_p: float = Field(0.8, ge=0.001, le=1.0)  # (below 0.001 the nucleus underflows: use top_k 1)
    top_k: int = Field(0, ge=0, le=1_000_000)  # 0 = off
    repetition_penalty: float = Field(1.1, ge=1.0, le=3.0)  # 1 = off
    repetition_window: int = Field(64, ge=0)  # most recent generated tokens penalised; 0 = all
    max_tokens: int = Field(1200, ge=1, le=100_000)
    min_tokens: int = Field(0, ge=0, le=100_000)  # here (not in a request) above max_tokens: every stream runs to its max
    constrain_audio: bool = True
    seed: int | None = Field(None, ge=0, le=2**63 - 1)

    @model_validator(mode="after")
    def _consistent(self) -> SamplingConfig:
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"'temperature' = {self.temperature} is out of range: 0 (greedy) or at least "
                             f"{MIN_TEMPERATURE} (smaller values overflow the logits)")
        return self


class SchedulerConfig(Section):
    max_concurrent_sessions: int = Field(32, ge=1, le=4096)
    max_batch_size: int = Field(16, ge=1, le=4096)
    ttfb_priority_tokens: int = Field(20, ge=0)
    flush_first_n_tokens: int = Field(7, ge=7, le=7 * 64, multiple_of=7)
    flush_every_n_tokens: int = Field(14, ge=7, le=7 * 64, multiple_of=7)
    first_chunk: choice("bridge", "eager") = "bridge"
    max_pending: int = Field(64, ge=0)
    policy: choice("fair", "deadline") = "fair"
    max_wait_steps: int = Field(4, ge=1)
    max_prefill_tokens: int = Field(512, ge=16)
    reserved_slots: int = Field(2, ge=0)
    max_buffer_s: float = Field(2.0, gt=0.0, le=600.0)
    first_audio_slack_s: float = Field(0.5, ge=0.0, le=600.0)
    session_timeout_s: float = Field(120.0, gt=0.0, le=86400.0)
    # batch items (lyre.core.lanes) decode only in steps where every live session holds this much unplayed audio
    batch_live_slack_s: float = Field(1.0, ge=0.0, le=600.0)
    consumer_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)


class TuningProfile(Section):
    max_text_chars: int = Field(250, ge=1)
    target_concurrent: int = Field(16, ge=1)
    target_ttfb_ms: float = Field(150.0, gt=0.0)


def _default_profiles() -> dict[str, TuningProfile]:
    return {
        "conversational": TuningProfile(max_text_chars=250, target_concurrent=24, target_ttfb_ms=100.0),
        "longform": TuningProfile(max_text_chars=5000, target_concurrent=16, target_ttfb_ms=300.0),
    }


API_KEYS_ENV = "LYRE_API_KEYS"  # more API keys, "<key> <account>" per line (lyre.trust.accounts)


class ServerConfig(Section):
    host: str = "0.0.0.0"
    port: int = Field(8000, ge=0, le=65535)
    grpc_port: int = Field(50051, ge=0, le=65535)
    max_body_bytes: int = Field(262144, ge=1024)
    drain_timeout_s: float = Field(10.0, ge=0.0)
    # on SIGTERM: /ready and the gRPC health say "draining" this long before new requests are refused,
    # so a balancer polling /ready stops sending first (Kubernetes: the preStop sleep does this)
    drain_notice_s: float = Field(0.0, ge=0.0, le=600.0)
    # balancers whose X-Forwarded-For names the client (addresses or CIDRs): the per-client limit and
    # the consent record's address then count the real client, not the balancer
    trusted_proxies: Names = ()
    api_key: str | None = None  # required as "Authorization: Bearer <key>" on /v1/ and gRPC when set
    # API key -> account name: with keys, every request needs one, and sees only its account's cloned
    # voices (api_key, when set too, is one more key, of the account "default")
    api_keys: dict[str, str] = Field(default_factory=dict)
    # more keys, read at start: a file of "<key> <account>" lines (a key may be given as sha256:<hex>
    # of it, so the file holds no secret); the environment's LYRE_API_KEYS adds more in the same form
    api_keys_file: str | None = None
    # with keys, these accounts see every account's figures (/metrics, the engine's in /v1/stats);
    # the others see the server's load and their own sessions
    operator_accounts: Names = ()
    # the secret client tokens are signed with (POST /v1/auth/tokens; lyre.trust.tokens), at least 16
    # bytes, shared by replicas that accept each other's tokens; or read from a file, or the
    # environment's LYRE_TOKEN_SECRET; none: each process draws its own at start
    token_secret: str | None = None
    token_secret_file: str | None = None
    # origins of the web pages that may call this server from a browser (CORS), e.g.
    # [https://app.example.com]; "*": any page (keyless server only)
    cors_origins: Names = ()
    # the playground page at / (lyre.api.http.playground): type text, pick a voice, hear it streamed
    playground: bool = True
    # limits a public server needs (each refused with a clear error)
    max_pending_text_chars: int = Field(10000, ge=1, le=10_000_000)  # text of an utterance waiting to be spoken
    # one request's whole text (REST input, gRPC/Riva Synthesize): past the profile's max_text_chars
    # it is split into sentences and spoken as one stream; OpenAI's limit by default
    max_input_chars: int = Field(4096, ge=1, le=10_000_000)
    ws_max_message_bytes: int = Field(65536, ge=1024, le=64 * 2**20)  # one WebSocket message
    max_contexts_per_socket: int = Field(8, ge=1, le=1024)  # utterances open at once on one WebSocket
    ws_idle_timeout_s: float = Field(300.0, gt=0.0, le=86400.0)  # a WebSocket with nothing to say is closed
    max_connections_per_client: int = Field(256, ge=0, le=100_000)  # open connections per address, from accept; 0 = off
    # the connection layer of the REST/WebSocket port (lyre.api.connections): a request's headers must
    # arrive within header_timeout_s of its first byte (a new connection's first request: of accept); a
    # body must keep coming at body_min_bytes_per_s on average (after header_timeout_s of grace); an idle
    # keep-alive connection is closed after keepalive_timeout_s; past max_connections open connections
    # (0 = the process's descriptor limit less a reserve) a new one is closed at once
    header_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    body_min_bytes_per_s: int = Field(8192, ge=1, le=2**30)
    keepalive_timeout_s: float = Field(75.0, gt=0.0, le=3600.0)
    max_connections: int = Field(0, ge=0, le=10_000_000)
    # the access log (lyre.api.access): a line per request, stream and call; text, json lines, or off
    access_log: choice("text", "json", "off") = "text"
    # gRPC connections (grpcio's own options): calls open at once on one connection, a connection
    # with no call for this long is closed, and one older than this is asked to reconnect (its calls
    # get grpc_max_connection_age_grace_s to end); 0 = no limit
    grpc_max_streams_per_connection: int = Field(32, ge=1, le=100_000)
    grpc_max_connection_idle_s: float = Field(300.0, ge=0.0, le=86400.0)
    grpc_max_connection_age_s: float = Field(3600.0, ge=0.0, le=7 * 86400.0)
    grpc_max_connection_age_grace_s: float = Field(600.0, ge=0.0, le=86400.0)


class Quota(Section):
    """One account's limits (:mod:`lyre.trust.quotas`). null: accounts.default's value; null there
    too: derived from the server's size, so that no one account can hold the whole server."""

    max_sessions: int | None = Field(None, ge=1, le=100_000)  # sessions holding a KV slot at once
    max_queued: int | None = Field(None, ge=0, le=100_000)  # sessions waiting for a slot
    max_ws_contexts: int | None = Field(None, ge=1, le=100_000)  # WebSocket contexts open over all its sockets
    max_enrollments: int | None = Field(None, ge=1, le=1000)  # voice enrollments in flight
    max_verifies: int | None = Field(None, ge=1, le=1000)  # /v1/audio/verify uploads in flight
    chars_per_minute: int | None = Field(None, ge=0, le=10**9)  # text characters taken per minute; 0 = no limit
    weight: float | None = Field(None, gt=0.0, le=1000.0)  # its share of free KV slots when accounts wait
    # batch jobs (lyre.service.batch): items queued or running over all its batches, one batch's JSONL
    # input, and its items running at once on one server (of batch.max_running)
    batch_items: int | None = Field(None, ge=1, le=100_000_000)
    batch_input_bytes: int | None = Field(None, ge=1024, le=2**32)
    batch_slots: int | None = Field(None, ge=1, le=100_000)


class AccountsConfig(Section):
    """Quotas and fair shares of the accounts (``server.api_keys``; without keys, everyone is "default")."""

    default: Quota = Field(default_factory=Quota)
    quotas: dict[str, Quota] = Field(default_factory=dict)  # account -> what differs from the default


class VoicesConfig(Section):
    """Cloned voices: the registry (a database), enrollment limits and the cached reference prompt."""

    # SQLAlchemy URL; None = the environment's LYRE_DATABASE_URL, else sqlite:///<data_dir>/lyre.db (PostgreSQL works too)
    database_url: str | None = None
    max_upload_bytes: int = Field(10 * 2**20, ge=1024, le=2**30)  # one enrollment's audio file
    min_seconds: float = Field(3.0, gt=0.0, le=600.0)  # reference clip duration
    max_seconds: float = Field(30.0, gt=0.0, le=600.0)
    max_per_account: int = Field(100, ge=1, le=1_000_000)
    max_lexicons_per_account: int = Field(20, ge=1, le=10_000)  # pronunciation lexicons (PLS) one account may hold
    max_lexicon_bytes: int = Field(65536, ge=1024, le=16 * 2**20)  # one lexicon's PLS document
    max_transcript_chars_per_second: float = Field(30.0, gt=0.0)  # longer transcripts cannot be what the clip says
    prefix_cache_mb: int = Field(512, ge=0, le=1_000_000)  # KV of cloned voices' reference prompts (LRU); 0 = off
    sweep_s: float = Field(2.0, gt=0.0, le=3600.0)  # how often kept prefixes of voices deleted elsewhere are dropped
    # enrollments and verifications decode and encode audio in this many worker threads, at a lower CPU
    # priority than the engine's; at most max_in_flight of them (all accounts) wait or run at once
    workers: int = Field(2, ge=1, le=64)
    max_in_flight: int = Field(8, ge=1, le=10_000)


class AuditConfig(Section):
    """The audit trail: one row per synthesis, in the voices database."""

    enabled: bool = True
    retention_days: float = Field(90.0, gt=0.0)  # older rows are deleted (checked hourly and at start)
    # true: while rows cannot reach the database (disk full, database down) new syntheses are refused
    # (503); false: they go on. Either way such rows go to the spool (data_dir/audit-spool.jsonl,
    # fsynced) and are written once it works; max_queued_rows bounds those kept in memory when the
    # spool cannot be written either
    required: bool = True
    max_queued_rows: int = Field(100_000, ge=1)


_WINDOW = re.compile(r"([0-9]{1,9})([smhd])")  # (ASCII digits: int() would read other scripts' too)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def window_seconds(window: object) -> int | None:
    """A completion window's seconds (``<n>s|m|h|d``: ``24h``, ``90m``), or None when it is not one."""
    m = _WINDOW.fullmatch(window) if isinstance(window, str) else None
    return int(m[1]) * _UNIT_S[m[2]] if m else None


class BatchConfig(Section):
    """Batch jobs (``/v1/batches``, :mod:`lyre.service.batch`): items synthesised in the scheduler's batch
    lane, from KV slots live callers leave free, their audio kept in ``results_url``."""

    enabled: bool = True  # false: this server takes no batch items (the API still answers; others may run them)
    # items this server runs at once (sessions handed to the batch lane); 0 = scheduler.max_batch_size
    max_running: int = Field(0, ge=0, le=100_000)
    lease_s: float = Field(30.0, ge=1.0, le=86400.0)  # a claimed item is retried elsewhere once its lease runs out
    max_attempts: int = Field(5, ge=1, le=1000)  # an item whose servers stopped or failed this often fails
    poll_s: float = Field(1.0, gt=0.0, le=600.0)  # how often an idle server looks for items (and expiries)
    completion_window: str = "24h"  # default: unfinished items expire after it (a request's may differ)
    max_completion_window_s: float = Field(7 * 86400.0, gt=0.0)
    max_items_per_batch: int = Field(50_000, ge=1, le=10_000_000)
    # where audio goes: none = <data_dir>/batches; s3://bucket/prefix (endpoint: LYRE_S3_ENDPOINT_URL,
    # credentials: the AWS environment) or a folder
    results_url: str | None = None
    retention_days: float = Field(7.0, gt=0.0)  # batches and their audio are deleted this long after they end


PUBLISHED_WATERMARK_KEY = "lyre-watermark-v1"


class WatermarkConfig(Section):
    """The mark on every output (:mod:`lyre.audio.watermark`) and ``POST /v1/audio/verify``."""

    enabled: bool = True
    key: str = PUBLISHED_WATERMARK_KEY  # set your own: whoever knows the key can detect (and remove) the mark
    strength_db: float = Field(-24.0, ge=-60.0, le=-6.0)  # the mark's level under the speech it rides on
    threshold: float = Field(8.0, gt=0.0, le=100.0)  # detection score above which audio counts as marked


class BuildConfig(Section):
    engine_dir: str = "engines/orpheus-3b-fp8"
    quantization: choice("fp8", "fp16", "bf16") = "fp8"
    kv_cache_dtype: choice("auto", "float16", "bfloat16") = "auto"  # FP8 builds: auto = the checkpoint's dtype
    max_batch_size: int = Field(32, ge=1, le=4096)
    max_seq_len: int = Field(4096, ge=64, le=131072)
    max_input_len: int = Field(3072, ge=16)  # a cloned voice's prompt: its reference turn (up to ~2500 tokens) + text
    max_num_tokens: int = Field(8192, ge=64)
    use_paged_context_fmha: bool = True
    calibration_samples: int = Field(256, ge=1)


class RivaConfig(Section):
    """The Riva-compatible gRPC service (``nvidia.riva.tts.RivaSpeechSynthesis``)."""

    language_code: str = "en-US"  # what Riva clients ask for; another language is refused
    voice_name: str = "English-US"  # Riva voice names are "<voice_name>.<subvoice>"
    # Riva subvoice -> Lyre voice ("English-US.Female-1" -> tara); Lyre's names and aliases work as-is
    subvoices: dict[str, str] = Field(default_factory=lambda: dict(RIVA_SUBVOICES))
    # other full Riva voice names -> Lyre voice (NVIDIA's Magpie voices, which Riva clients ask for by
    # default); a name with one more ".<Emotion>" part after it takes the same voice
    voice_aliases: dict[str, str] = Field(default_factory=lambda: dict(RIVA_VOICE_ALIASES))
    # GetRivaSynthesisConfig answers without an API key (it lists the built-in voices only): Riva
    # clients (Pipecat's NvidiaTTSService) ask for it at start without their metadata
    config_without_key: bool = True

    def resolve_voice(self, name: str) -> str:
        """The Lyre voice a Riva-style ``name`` means, else ``name`` unchanged (a Lyre name or alias)."""
        name = name.strip()
        aliases = {a.lower(): v for a, v in self.voice_aliases.items()}
        for candidate in (name, name.rpartition(".")[0]):
            if candidate.lower() in aliases:
                return aliases[candidate.lower()]
        prefix, dot, sub = name.rpartition(".")
        if dot and prefix.lower() == self.voice_name.lower():
            return next((v for s, v in self.subvoices.items() if s.lower() == sub.lower()), name)
        return name


class LyreConfig(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    codec: CodecConfig = Field(default_factory=CodecConfig)
    kv_cache: KVCacheConfig = Field(default_factory=KVCacheConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    profile: str = "conversational"
    tuning: dict[str, TuningProfile] = Field(default_factory=_default_profiles)
    server: ServerConfig = Field(default_factory=ServerConfig)
    accounts: AccountsConfig = Field(default_factory=AccountsConfig)
    riva: RivaConfig = Field(default_factory=RivaConfig)
    build: BuildConfig = Field(default_factory=BuildConfig)
    voices: VoicesConfig = Field(default_factory=VoicesConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    watermark: WatermarkConfig = Field(default_factory=WatermarkConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    data_dir: str = "data"  # the default database lives here (created when missing)

    @property
    def active_profile(self) -> TuningProfile:
        return self.tuning[self.profile]

