"""``TTSService``: the library API — text in, streaming 24 kHz PCM out — usable without any server.

    async with TTSService.from_config("config/model_config.yaml") as tts:
        async for chunk in tts.stream("Hello world", voice="tara"):
            play(chunk.pcm)                      # int16, 24 kHz, mono
        audio = await tts.synthesize("Bye now")  # whole result with metrics

One engine thread owns the scheduler, the token engine and the codec. The asyncio side validates
requests, takes a place at the admission gate (overload is refused at once), and talks to the
engine thread only by message; audio comes back through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lyre.audio.watermark import Marker, Watermark
from lyre.config import LyreConfig, apply_overrides, load_config
from lyre.config.schema import PUBLISHED_WATERMARK_KEY
from lyre.core.admission import AdmissionGate, Overloaded
from lyre.core.engine_loop import EngineLoop
from lyre.core.metrics import Metrics
from lyre.core.scheduler import Scheduler
from lyre.core.session import Segment, Session
from lyre.core.stats import StatsSnapshot
from lyre.engine.base import SamplingParams
from lyre.errors import (
    InvalidRequest,
    OutOfRange,
    OverloadedError,
    QuotaExceeded,
    ServiceUnavailable,
    TextTooLong,
    UnknownVoice,
)
from lyre.family import ORPHEUS, Family
from lyre.model import checkpoint, orpheus
from lyre.service import batch, runtime, said, upkeep
from lyre.service.consents import Consents
from lyre.service.lexicons import Lexicons
from lyre.service.options import SynthesisRequest, parse
from lyre.service.stream import Audio, SpeechStream
from lyre.service.utterance import SsmlPiece, Utterance
from lyre.service.voices import Voices
from lyre.storage.registry import Voice
from lyre.trust.accounts import DEFAULT_ACCOUNT, Accounts
from lyre.trust.audit import AuditEntry, AuditTrail
from lyre.trust.quotas import Quotas

log = logging.getLogger("lyre.service")


# --------------------------------------------------------------------------------------------
# the service


class TTSService:
    def __init__(self, config: LyreConfig, shared: runtime.Shared | None = None):
        self.config = config
        self.shared = shared  # loaded parts shared with other services in this process (runtime.Shared)
        self.accounts = Accounts(config.server)  # who a key names (the keys file and LYRE_API_KEYS read once, here)
        self.metrics = Metrics(self.accounts.names)
        self.quotas = Quotas(config, self.accounts.names, on_refusal=self.metrics.refused)
        self.gate = AdmissionGate(config.scheduler.max_concurrent_sessions, config.scheduler.max_pending,
                                  self.quotas.of)
        self._ids = itertools.count()
        self._loop: EngineLoop | None = None
        self.scheduler: Scheduler | None = None
        self.model: checkpoint.ResolvedModel | None = None
        self.tokenizer: Any = None
        self.backend: Any = None  # BackendChoice once loaded
        self.family: Family = ORPHEUS  # the checkpoint's model family, once loaded
        self.voices = Voices(config)  # cloned voices (the registry opens with the service)
        self.consents = Consents(self.voices)  # consent recordings (OpenAI's voice consents)
        self.lexicons = Lexicons(self.voices)  # pronunciation lexicons (W3C PLS), per account
        self._tasks: list[asyncio.Task] = []  # the running service's upkeep: sweeper, heartbeat, lexicons' refresh
        self.batches: batch.BatchJobs | None = None  # batch jobs, once started with a database
        self.database: Any = None  # SQLAlchemy engine of the voices registry and the audit trail, once started
        self.audit: AuditTrail | None = None
        w = config.watermark
        self.watermark = Watermark(w.key, w.strength_db, w.threshold)  # marks outputs (when enabled), verifies uploads
        if w.enabled and w.key == PUBLISHED_WATERMARK_KEY:
            log.warning("watermark.key is the published default: set your own so that only you can detect the mark")

    @classmethod
    def from_config(cls, path_or_config: str | Path | LyreConfig | None = None, *, shared: runtime.Shared | None = None,
                    **overrides: Any) -> TTSService:
        """``overrides`` are dotted keys, e.g. ``**{"scheduler.max_batch_size": 8}`` or
        ``scheduler__max_batch_size=8``; ``shared``: loaded parts to share with other services of
        this process (:class:`lyre.service.runtime.Shared`)."""
        dotted = {k.replace("__", "."): v for k, v in overrides.items()}
        if isinstance(path_or_config, LyreConfig):
            return cls(apply_overrides(path_or_config, dotted), shared)
        return cls(load_config(path_or_config, dotted), shared)

    # --- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> TTSService:
        rt = await asyncio.to_thread(runtime.start, self.config, self.gate, self.metrics, self.voices, self.shared)
        self.backend, self.database, self.audit = rt.backend, rt.database, rt.audit
        self.lexicons.audit = rt.audit
        self.config, self.family = rt.config, rt.family  # (a Qwen3-TTS checkpoint's speakers are its voices)
        self.model, self.tokenizer, self.scheduler, self._loop = rt.model, rt.tokenizer, rt.scheduler, rt.loop
        if self.database is not None:  # batch jobs (lyre.service.batch): their API and the runner claiming items
            self.batches = batch.start(self)
        self.voices.on_delete.append(self._forget_voice)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(upkeep.sweep_deleted_voices(self.voices, self._kept_prefixes)),
                       loop.create_task(upkeep.heartbeat(self.scheduler)), loop.create_task(self.lexicons.keep_fresh())]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop: requests from now on get ServiceUnavailable at once; open sessions are cancelled."""
        for task in self._tasks:
            task.cancel()
        if self.batches is not None:  # (items running here are given back, queued again at once)
            await self.batches.runner.stop()
        if self._loop is not None and self._loop.thread.is_alive():
            await asyncio.to_thread(self._loop.stop)
        if self.audit is not None:
            await asyncio.to_thread(self.audit.close)  # the rows still queued are written first
        self.voices.workers.close()
        await asyncio.to_thread(self.voices.workers.join, 30.0)  # (a job running ends first: an upload's encode)

    @property
    def ready(self) -> bool:
        return self._loop is not None and self._loop.alive and not self._loop.closing

    def readiness(self) -> str | None:
        """Why this service should not be sent new callers ("unavailable": not running; "full":
        admission is full, max_concurrent_sessions + max_pending inside; "audit_unavailable": the
        audit trail cannot be written and audit.required refuses syntheses), or None when it can
        take them."""
        if not self.ready:
            return "unavailable"
        if self.gate.full:
            return "full"
        if self.audit is not None and self.audit.refusing:
            return "audit_unavailable"
        return None

    def sees_all(self, account: str) -> bool:
        """Whether ``account`` may see every account's figures (/metrics, the whole /v1/stats): an
        operator account (server.operator_accounts), or anyone on a server of one account."""
        return len(self.accounts.names) == 1 or account in self.config.server.operator_accounts

    @property
    def builtin_voices(self) -> tuple[str, ...]:
        return self.config.model.voices

    # --- requests -------------------------------------------------------------------------------

    def stream(self, text: str, voice: str | Voice | None = None, *, account: str = DEFAULT_ACCOUNT,
               protocol: str = "library", audit: AuditEntry | None = None, mark: Marker | None = None,
               tempo: float = 1.0, **sampling: Any) -> SpeechStream:
        """Start synthesising ``text``; iterate the result for audio chunks as they are decoded.
        ``voice``: a built-in voice or alias, or ``account``'s cloned voice (its id, or the
        :class:`Voice` from ``await tts.voices.resolve(...)``, which saves a database read here).
        The synthesis is audited under ``protocol`` and watermarked (``audit``, ``mark``: those of
        an utterance it is a piece of). Raises InvalidRequest / UnknownVoice / TextTooLong /
        OverloadedError (QuotaExceeded: ``account`` holds its quota), and DatabaseError while the
        audit trail cannot be written, at once. ``tempo``: the caller plays the audio this many times
        faster (a time-stretched response: the listener's clock, which paces the session, runs so)."""
        if not self.ready:
            raise ServiceUnavailable("the service is not running (use `async with TTSService...`)")
        voice = self._voice(voice, account)
        segments, params, chars = self._prepare(text, voice, sampling, account)
        owns_audit = audit is None
        if owns_audit:
            audit = self._audit_entry(voice, account, protocol)
        try:
            self.gate.enter(account)
        except Overloaded as e:
            self.metrics.rejections.labels(reason="overloaded").inc()
            raise OverloadedError(e.retry_after_s) from None
        except QuotaExceeded as e:
            self.metrics.refused(account, e.key)
            raise
        if owns_audit:  # (an utterance's pieces were counted as they were appended)
            try:
                self.charge(account, chars)
            except BaseException:
                self.gate.leave(account)
                raise
            audit.add_text(text)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        session = Session(
            session_id=f"s{next(self._ids)}",
            segments=segments,
            sampling=params,
            sink=lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev),
            created=time.monotonic(),
            account=account,
            listen_on_read=not owns_audit,  # a piece of an utterance: heard once the pieces before it are
            tempo=tempo,
        )
        if not self._loop.post(lambda: self.scheduler.submit(session)):
            self.gate.leave(account)
            raise ServiceUnavailable("the service is shutting down")
        audit.begin()  # admitted: its row is written now, before its first audio (an utterance's: at its first piece)
        return SpeechStream(session, events, lambda: self._cancel(session.session_id), audit, owns_audit,
                            mark if mark is not None else self.marker(), text=text if owns_audit else None)

    async def synthesize(self, text: str, voice: str | Voice | None = None, *, account: str = DEFAULT_ACCOUNT,
                         **sampling: Any) -> Audio:
        """The whole utterance at once, with metrics."""
        stream = self.stream(text, voice, account=account, **sampling)
        parts = [chunk.pcm async for chunk in stream]
        pcm = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)
        return Audio(pcm=pcm, sample_rate=orpheus.SAMPLE_RATE, metrics=stream.metrics)

    def speak(self, text: str, voice: str | Voice | None = None, *, account: str = DEFAULT_ACCOUNT,
              protocol: str = "library", tempo: float = 1.0, **sampling: Any) -> SpeechStream | Utterance:
        """One whole text as one ordered stream of chunks (REST, gRPC and Riva ``Synthesize``): a single
        synthesis when it fits the profile's ``max_text_chars``; longer text, up to
        ``server.max_input_chars``, is split into sentences by an :class:`Utterance`. Raises as
        :meth:`stream` does (an overload of a long text's first piece: on the first chunk)."""
        limit = self.config.active_profile.max_text_chars
        if not isinstance(text, str) or len(text) <= limit or said.is_document(text, sampling.get("ssml")):
            return self.stream(text, voice, account=account, protocol=protocol, tempo=tempo, **sampling)
        most = max(limit, self.config.server.max_input_chars)
        if len(text) > most:
            raise TextTooLong(f"text has {len(text)} characters; at most {most} are accepted "
                              f"(server.max_input_chars; the '{self.config.profile}' profile speaks up to {limit} "
                              "as one synthesis)")
        if not text.strip():
            raise InvalidRequest("text is empty: there is nothing to speak")
        utterance = self.utterance(voice, account=account, protocol=protocol, tempo=tempo, **sampling)
        utterance.max_pending_chars = len(text)
        try:
            utterance.append(text)
        except BaseException:
            utterance.cancel()
            raise
        utterance.end()
        return utterance

    async def _sweep_once(self) -> None:
        """(:func:`lyre.service.upkeep.sweep_once`.)"""
        await upkeep.sweep_once(self.voices, self._kept_prefixes)

    async def _kept_prefixes(self) -> list[str]:
        """Names of what is kept of voices here: the engine's prefixes, the codec's warmed-up states
        (Qwen3-TTS clones) and the voices' reference prompts."""
        kept = await self.on_engine_thread(lambda: self.scheduler.engine.kept_prefixes())
        warm = getattr(self.scheduler.audio.codec, "warm", None)
        return [*kept, *(warm.keys() if warm is not None else []), *self.voices.kept()]

    def _forget_voice(self, voice_id: str) -> None:
        """A deleted voice's kept prefix leaves the engine at its next step."""
        if self._loop is not None and self._loop.alive:
            self._loop.post(lambda: self.scheduler.engine.forget_prefix(voice_id + ":"))
        forget = getattr(self.scheduler.audio.codec, "forget", None) if self.scheduler is not None else None
        if forget is not None:  # (a clone's warmed-up codec state; thread-safe)
            forget(voice_id)

    def _cancel(self, session_id: str) -> None:
        if self._loop is not None and self._loop.alive:
            self._loop.post(lambda: self.scheduler.cancel(session_id, "cancelled"))

    def utterance(self, voice: str | Voice | None = None, *, account: str = DEFAULT_ACCOUNT,
                  protocol: str = "library", tempo: float = 1.0, **sampling: Any) -> Utterance:
        """An utterance whose text arrives in pieces (``append`` / ``flush`` / ``end``), spoken as one
        ordered stream of chunks (iterate it). Raises InvalidRequest / UnknownVoice at once."""
        if not self.ready:
            raise ServiceUnavailable("the service is not running (use `async with TTSService...`)")
        voice = self._voice(voice, account)
        self._sampling(parse(SynthesisRequest, {"text": "", **sampling}))
        audit = self._audit_entry(voice, account, protocol)
        mark = self.marker()  # one watermark across the pieces: the pattern runs on without a jump
        def speak(piece: str) -> SpeechStream:  # (a piece of plain text is never read as SSML, whatever it holds)
            ssml_mode = sampling.get("ssml") if isinstance(piece, SsmlPiece) else "off"
            return self.stream(piece, voice, account=account, audit=audit, mark=mark, tempo=tempo,
                               **{**sampling, "ssml": ssml_mode})

        def check(document: str) -> int:  # a document appended is checked whole before anything changes
            return self._prepare(document, voice, sampling, account)[2]

        return Utterance(speak,
                         self.config.active_profile.max_text_chars, self.config.server.max_pending_text_chars, audit,
                         charge=lambda n: self.charge(account, n),
                         control=self._control_token, ssml_mode=sampling.get("ssml"), check_document=check)

    def _control_token(self, text: str) -> Any:
        """Text an utterance holds back that the tokenizer would read as a control token (Orpheus)."""
        return orpheus.control_token(self.tokenizer, text) if self.family.name == "orpheus" else None

    def charge(self, account: str, chars: int) -> None:
        """Count ``chars`` characters of text against ``account``'s ``chars_per_minute``; raises
        QuotaExceeded (TextTooLong for more than a minute's worth) and counts nothing when it is spent."""
        self.quotas.charge_chars(account, chars)
        self.metrics.account_chars(account, chars)

    def marker(self) -> Marker | None:
        """A new stream's watermarker (None with watermark.enabled false)."""
        return self.watermark.marker() if self.config.watermark.enabled else None

    def _audit_entry(self, voice: str | Voice, account: str, protocol: str) -> AuditEntry:
        label = voice if isinstance(voice, str) else voice.id
        if self.audit is None:  # a service without an audit trail (the benchmark's peer)
            return AuditEntry(None, account, label, protocol)
        self.audit.check()  # refused while rows cannot be written: nothing goes unrecorded
        return self.audit.entry(account, label, protocol)

    def _voice(self, voice: str | Voice | None, account: str) -> str | Voice:
        """A built-in voice's name, or ``account``'s cloned voice (UnknownVoice for anyone else's)."""
        if isinstance(voice, Voice):
            if voice.owner != account or voice.id in self.voices.deleted:
                raise UnknownVoice(f"no voice {voice.id} (cloned voices are visible only to the account that enrolled "
                                   "them)")
            return voice
        return self.voices.resolve_now(voice, account)

    def _sampling(self, request: SynthesisRequest) -> SamplingParams:
        """The request's sampling over the family's defaults, checked as a whole before it reaches the
        engine (a request's ``min_tokens`` above its ``max_tokens`` is refused; a ``max_tokens`` below
        the default ``min_tokens`` brings that down with it)."""
        params = self.family.sampling(self.config.sampling, request.sampling())
        params.validate()
        return params

    def _language(self, code: str | None) -> str | None:
        """An SSML <lang>'s BCP-47 code as a multilingual family names the language (None for Orpheus,
        which speaks English whatever the text's language: <lang> picks only how its text is normalised)."""
        of = getattr(self.family, "language_of", None)
        if code is None or of is None:
            return None
        try:
            return of(code)
        except ValueError as e:
            raise InvalidRequest(f"SSML <lang xml:lang={code!r}>: {e}") from None

    def _prepare(self, text: str, voice: str | Voice, sampling: dict[str, Any],
                 account: str = DEFAULT_ACCOUNT) -> tuple[list[Segment], SamplingParams, int]:
        cfg = self.config
        request = parse(SynthesisRequest, {"text": text, **sampling})
        params = self._sampling(request)
        if not request.text.strip():
            raise InvalidRequest("text is empty: there is nothing to speak")
        aliases = self.lexicons.aliases(account, request.lexicons)  # (the request's lexicons, or the account's defaults)
        pieces, chars = said.of_request(request, cfg, aliases)  # (each piece keeps the caller's text beside what is read)
        try:
            segments = []
            for p in pieces:
                options = dict(language=self._language(p.language) or request.language, instructions=request.instructions)
                if isinstance(voice, Voice):  # a cloned voice: its reference as its family reads it, then the text
                    key, reference = self.voices.reference(voice)
                    made = self.family.cloned(self.tokenizer, p.spoken, key, reference, **options)
                else:
                    made = {"prompt": self.family.prompt(self.tokenizer, p.spoken, voice, **options)}
                segments.append(Segment(**made, text=p.text, places=p.places, pause_before_s=p.pause_before_s,
                                        pause_after_s=p.pause_after_s, rate=p.rate))
        except InvalidRequest:
            raise  # (ControlTokenInText: text that spells a control token)
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
        longest = max(len(s.prompt) for s in segments)
        room = cfg.kv_cache.max_seq_len - longest
        if room < 1:
            raise InvalidRequest(f"a segment's prompt has {longest} tokens; kv_cache.max_seq_len is {cfg.kv_cache.max_seq_len}")
        # (a Qwen3-TTS segment's frames are capped by its text: that cap, where lower, is what must fit)
        needed = max(min(params.max_tokens, getattr(s.prompt, "max_frames", None) or params.max_tokens)
                     for s in segments)
        if needed > room:  # never capped silently by the engine
            raise OutOfRange(f"'max_tokens' = {needed} is out of range (the request's, or its text's cap): with this "
                             f"prompt ({longest} tokens) a slot of kv_cache.max_seq_len {cfg.kv_cache.max_seq_len} "
                             f"tokens holds at most {room}")
        return segments, params, chars

    async def on_engine_thread(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread between steps and return its result (for inspection)."""
        return await self._loop.call(fn)

    # --- observability --------------------------------------------------------------------------

    def stats(self) -> StatsSnapshot | None:
        """The server as the engine thread published it after its last step (None before the start);
        ``.as_dict()`` is seed 004's ``/v1/stats`` JSON."""
        return self.scheduler.snapshot if self.scheduler is not None else None
