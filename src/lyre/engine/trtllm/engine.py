"""The ``TokenEngine`` contract over TensorRT-LLM's Executor bindings (an FP8 engine from build_engine.py).

NOT YET RUN ON A GPU BY THIS PROJECT. No machine this project has run on had a GPU; this module
was written against the ``tensorrt_llm.bindings.executor`` signatures of TensorRT-LLM 1.2.1 (read
from its nanobind sources) and is tested only against ``tests/support/fake_trtllm.py``, a fake of that
module held to a snapshot of those signatures (``tests/support/trtllm_api/bindings-1.2.1.json``;
``tests/engine/trtllm/test_api.py`` checks every call made here against it). The
post-processor's CUDA branch has never run. Expect to fix details the first time it meets a GPU.

How it maps the contract:

- ``add`` -> ``Executor.enqueue_request(Request(...))`` while fewer than ``capacity`` (the build's
  ``max_batch_size``) requests are live, else False (nothing enqueued): streaming, token ids only
  (no detokenisation), ``max_tokens`` (required by the binding) capped to the room left in the
  sequence, a ``client_id`` (Lyre's own number: see the constraint), end-of-speech as
  ``end_id`` and the other Orpheus stop ids as ``stop_words``, the sampling settings as a
  ``SamplingConfig`` with a per-request seed (an unseeded request gets a random seed: the
  executor would otherwise give every request seed 0 and identical prompts identical audio),
  and the scheduler's priority (new sessions before their first audio, continuations first)
  mapped onto the executor's 0..1 priority. Priority reorders only the executor's queue; the
  scheduler also keeps ``scheduler.reserved_slots`` free of look-ahead work for new sessions.
- one pump thread blocks in ``await_responses`` (it releases the GIL) and queues responses;
  ``step()`` turns what has arrived into :class:`TokenDelta` s (one per request per step).
- ``cancel`` -> ``cancel_request``; the request's ``cancelled`` delta comes at the next step and
  anything the executor still sends for it is dropped.
- the repetition penalty and ``constrain_audio`` run as the executor's batched logits
  post-processor (:class:`LogitsPostProcessor`, registered before the request is enqueued): the
  penalty over the request's last ``repetition_window`` generated tokens (the executor's own
  penalty, which has no window and covers the prompt, is never set), then, after start-of-speech,
  only the 4096 codes of the frame slot, and end-of-speech at frame boundaries, can be sampled.
  It never raises into the executor (which would fail every request); a request whose
  processing fails ends alone, with an error.
- ``stats()`` adds the executor's latest iteration statistics (iteration latency, KV blocks,
  queued and context requests) for ``/v1/stats`` and the Prometheus metrics.

The executor is shut down on every exit path: :meth:`TrtllmEngine.close` (the scheduler's
shutdown, a failed service start), and at interpreter exit for an engine nobody closed (an
executor left running can keep the process from exiting).

Differences from the PyTorch engine: ``record_logits`` is ignored, and the executor batches every admitted
request each iteration, so ``step(order)`` accepts the scheduler's order and ignores it
(``scheduler.max_batch_size`` and the batch policy do not apply; the engine's
``build.max_batch_size`` does).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from lyre.engine.base import EngineStats, FinishReason, GenerationRequest, TokenDelta, check_prompt
from lyre.engine.trtllm.config import TrtllmEngineConfig
from lyre.engine.trtllm.logits import LogitsPostProcessor
from lyre.engine.trtllm.requests import make_executor_config, make_request
from lyre.engine.trtllm.stats import IterationView, latest_iteration

log = logging.getLogger("lyre.engine")


# --------------------------------------------------------------------------------------------
# the engine


@dataclass
class _InFlight:
    request: GenerationRequest
    client_id: int  # Lyre's number for it, on the executor Request (keys the logits post-processor)
    exec_id: int
    generated: int = 0
    cancelled: bool = False
    failure: str | None = None  # its logits processing failed: deliver ``good`` tokens, then end with this
    good: int = 0


@dataclass
class _PumpFailure:
    error: BaseException


def load_bindings() -> ModuleType:
    """``tensorrt_llm.bindings.executor`` (imported only here: the library is optional)."""
    from tensorrt_llm.bindings import executor

    return executor


class TrtllmEngine:
    """TensorRT-LLM engine behind the TokenEngine contract. Not yet run on a GPU (see the module doc)."""

    def __init__(self, config: TrtllmEngineConfig, bindings: ModuleType | None = None):
        self.cfg = config
        self.tle = bindings if bindings is not None else load_bindings()
        self.capacity = config.max_batch_size
        self.post_processor = LogitsPostProcessor()
        tle = self.tle
        executor_config = make_executor_config(tle, config, self.post_processor)
        self.executor = tle.Executor(Path(config.engine_dir), tle.ModelType.DECODER_ONLY, executor_config)
        self._running = True
        self._closing = threading.Lock()  # close() may come from the engine thread and the atexit hook at once
        try:
            self._start(config)
        except BaseException:
            self._running = False
            self._shutdown_executor()
            raise

    def _start(self, config: TrtllmEngineConfig) -> None:
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._live: dict[str, _InFlight] = {}  # request id -> in flight
        self._by_exec: dict[int, _InFlight] = {}
        self._cancelled: list[_InFlight] = []
        self._failing: dict[str, _InFlight] = {}  # request id -> live request whose constraint failed
        self._failed: str | None = None
        self._client_ids = itertools.count(1)
        self._iter = IterationView()
        self.total_requests = self.total_tokens = 0
        self._pump = threading.Thread(target=self._pump_loop, name="lyre-trtllm-pump", daemon=True)
        self._pump.start()
        self._at_exit = _close_at_exit(self)
        atexit.register(self._at_exit)

    # --- the pump thread ------------------------------------------------------------------------

    def _pump_loop(self) -> None:
        wait = timedelta(milliseconds=self.cfg.pump_timeout_ms)
        while self._running:
            try:
                responses = self.executor.await_responses(timeout=wait)
            except Exception as e:  # the executor is gone: every request fails at the next step
                if self._running:
                    log.exception("TensorRT-LLM await_responses failed")
                    self._inbox.put(_PumpFailure(e))
                return
            for response in responses:
                self._inbox.put(response)

    # --- the contract ---------------------------------------------------------------------------

    def add(self, request: GenerationRequest) -> bool:
        """Enqueue ``request`` with the executor and return True; return False, enqueueing nothing,
        when ``capacity`` requests are already live. Raises ValueError for a request that can never run."""
        if self._failed is not None:
            raise ValueError(f"the TensorRT-LLM executor failed: {self._failed}")
        if not self._running:
            raise ValueError("the TensorRT-LLM engine is closed")
        check_prompt(request, self.cfg.vocab_size, self._live)
        ids = request.prompt_ids
        if len(ids) > self.cfg.max_input_len or len(ids) >= self.cfg.max_seq_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens; the engine was built for prompts up to {self.cfg.max_input_len} "
                f"(build.max_input_len) within {self.cfg.max_seq_len} tokens (build.max_seq_len)"
            )
        request.sampling.validate()
        if len(self._live) >= self.capacity:
            return False
        client_id = next(self._client_ids)
        executor_request = self.to_executor_request(request, client_id)
        if LogitsPostProcessor.wanted(request.sampling):  # before enqueueing: see LogitsPostProcessor
            self.post_processor.register(client_id, list(ids), request.sampling)
        try:
            exec_id = self.executor.enqueue_request(executor_request)
        except BaseException:
            self.post_processor.drop(client_id)
            self.post_processor.failed.pop(client_id, None)
            raise
        flight = _InFlight(request, client_id, exec_id)
        self._live[request.request_id] = flight
        self._by_exec[exec_id] = flight
        self.total_requests += 1
        return True

    def to_executor_request(self, request: GenerationRequest, client_id: int) -> Any:
        """The executor ``Request`` for ``request`` (pure translation; no executor call)."""
        return make_request(self.tle, request, client_id, self.cfg.max_seq_len)

    def cancel(self, request_id: str) -> None:
        """End a request: ``cancel_request`` now, its ``cancelled`` delta at the next step. Unknown ids are ignored."""
        flight = self._live.get(request_id)
        if flight is None or flight.cancelled:
            return
        flight.cancelled = True  # whatever the executor still sends for it is dropped
        self._cancelled.append(flight)
        self._abort(flight)

    def _abort(self, flight: _InFlight) -> None:
        """Stop ``flight`` inside the executor."""
        try:
            self.executor.cancel_request(flight.exec_id)
        except Exception:  # already finished inside the executor: nothing to cancel
            log.debug("cancel_request(%d) failed", flight.exec_id, exc_info=True)

    def kept_prefixes(self) -> list[str]:
        return []  # (the executor's block reuse keeps blocks by their tokens)

    def forget_prefix(self, name: str) -> None:
        """Nothing to drop: the executor's KV block reuse keys blocks by their tokens, and blocks of a
        deleted voice's prefix are evicted as they go unused."""

    def has_work(self) -> bool:
        return bool(self._live)

    def step(self, order: Sequence[str] | None = None) -> list[TokenDelta]:
        """Turn the responses that have arrived into deltas (waits ``step_wait_s`` for the first).
        ``order`` is accepted and ignored: the executor batches every admitted request by itself."""
        deltas: dict[str, TokenDelta] = {}
        if not self._running:  # closed under the engine thread (at interpreter exit): every request ends
            return [self._finish(f, "error", "the TensorRT-LLM engine was closed") for f in list(self._live.values())]
        for flight in self._cancelled:
            deltas[flight.request.request_id] = self._finish(flight, "cancelled")
        self._cancelled.clear()
        self._take_constraint_failures()
        for item in self._drain():
            if isinstance(item, _PumpFailure):
                self._failed = f"{type(item.error).__name__}: {item.error}"
                for flight in list(self._live.values()):
                    deltas[flight.request.request_id] = self._finish(flight, "error", self._failed)
                continue
            self._on_response(item, deltas)
        for flight in list(self._failing.values()):  # every token sampled under the constraint is out: it ends
            if flight.generated >= flight.good:
                self._end_failed(flight, deltas)
        self._poll_iteration_stats()
        return list(deltas.values())

    def _take_constraint_failures(self) -> None:
        """Adopt the failures the constraint recorded since the last step (ids no longer live are
        dropped: they finished meanwhile)."""
        if not self.post_processor.failed:  # usually empty: no scan of the live requests
            return
        live = {f.client_id: f for f in self._live.values()}
        for client_id in list(self.post_processor.failed):
            if client_id in live:
                self._adopt_failure(live[client_id])
            else:
                self.post_processor.failed.pop(client_id, None)

    def _adopt_failure(self, flight: _InFlight) -> None:
        """``flight``'s constraint failed: it is stopped in the executor and ends once the tokens
        sampled before the failure (some may still be on their way) are delivered, and no others.
        Its constraint is dropped first, so the executor cannot record a later failure for it."""
        self.post_processor.drop(flight.client_id)
        why, good = self.post_processor.failed.pop(flight.client_id)
        if flight.failure is None:
            flight.failure, flight.good = why, good
            self._failing[flight.request.request_id] = flight
            self._abort(flight)
        else:
            flight.good = min(flight.good, good)

    def _end_failed(self, flight: _InFlight, deltas: dict[str, TokenDelta]) -> None:
        rid = flight.request.request_id
        tokens = deltas[rid].token_ids if rid in deltas else []
        deltas[rid] = self._finish(flight, "error", flight.failure, tokens)

    def _drain(self) -> list[Any]:
        items = []
        try:
            if self._live:
                items.append(self._inbox.get(timeout=self.cfg.step_wait_s))
            while True:
                items.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        return items

    def _on_response(self, response: Any, deltas: dict[str, TokenDelta]) -> None:
        flight = self._by_exec.get(response.request_id)
        if flight is not None and flight.failure is None and flight.client_id in self.post_processor.failed:
            self._adopt_failure(flight)  # failed after this step's check: this response may be unconstrained
        if flight is None or flight.cancelled:  # finished or cancelled already: late responses are dropped
            if flight is None and response.has_error():
                log.warning("TensorRT-LLM error for request %s: %s", response.request_id, response.error_msg)
            return
        rid = flight.request.request_id
        delta = deltas.setdefault(rid, TokenDelta(rid, []))
        if response.has_error():
            deltas[rid] = self._finish(flight, "error", flight.failure or response.error_msg, delta.token_ids)
            return
        result = response.result
        new = list(result.output_token_ids[0]) if result.output_token_ids else []
        limit = flight.good if flight.failure is not None else flight.request.sampling.max_tokens
        new = new[:max(limit - flight.generated, 0)]  # nothing sampled without the constraint goes out
        flight.generated += len(new)
        self.total_tokens += len(new)
        delta.token_ids.extend(new)
        if flight.failure is not None:
            if result.is_final or flight.generated >= flight.good:
                self._end_failed(flight, deltas)
        elif result.is_final:
            reasons = list(result.finish_reasons or [])
            deltas[rid] = self._finish(flight, self._reason(reasons[0] if reasons else None), None, delta.token_ids)

    def _reason(self, finish: Any) -> FinishReason:
        fr = self.tle.FinishReason
        if finish in (fr.END_ID, fr.STOP_WORDS):
            return "stop"
        if finish == fr.CANCELLED:
            return "cancelled"
        if finish == fr.TIMED_OUT:
            return "error"
        return "length"  # LENGTH, or NOT_FINISHED on a final response: the token budget ran out

    def _finish(self, flight: _InFlight, reason: FinishReason, error: str | None = None,
                tokens: list[int] | None = None) -> TokenDelta:
        self._live.pop(flight.request.request_id, None)
        self._failing.pop(flight.request.request_id, None)
        self._by_exec.pop(flight.exec_id, None)
        self.post_processor.drop(flight.client_id)
        self.post_processor.failed.pop(flight.client_id, None)
        if reason == "error" and error is None:
            error = "the executor timed out the request"
        return TokenDelta(flight.request.request_id, tokens or [], finished=True, finish_reason=reason, error=error)

    # --- statistics -----------------------------------------------------------------------------

    def _poll_iteration_stats(self) -> None:
        self._iter = latest_iteration(self.executor, self._iter)

    def stats(self) -> EngineStats:
        v = self._iter.values
        queued = min(int(v.get("queued_requests", 0)), len(self._live))  # inside the executor (KV memory short)
        active = len(self._live) - queued
        kv_bytes = int(v.get("kv_blocks_max", 0) * v.get("kv_tokens_per_block", 0) * self.cfg.kv_bytes_per_token)
        return EngineStats(
            capacity=self.capacity,
            active=active,
            waiting=queued,
            prefilling=min(int(v.get("context_requests", 0)), active),
            total_requests=self.total_requests,
            total_tokens=self.total_tokens,
            total_steps=self._iter.iteration,
            kv_cache_bytes=kv_bytes,
            backend="trtllm",
            extra=dict(v),
        )

    # --- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the pump and shut the executor down (in-flight requests end). Idempotent and safe from
        two threads at once (the executor is shut down once: a second shutdown is not safe)."""
        with self._closing:
            if not self._running:
                return
            self._running = False
            atexit.unregister(self._at_exit)
            self._pump.join()
            self._shutdown_executor()

    def _shutdown_executor(self) -> None:
        try:
            self.executor.shutdown()
        except Exception:  # noqa: BLE001 - closing: say it, and go on
            log.exception("TensorRT-LLM executor shutdown failed")


def _close_at_exit(engine: TrtllmEngine) -> Callable[[], None]:
    """An atexit hook that closes ``engine`` if it is still alive and open (it holds no reference to it)."""
    ref = weakref.ref(engine)

    def close() -> None:
        e = ref()
        if e is not None:
            log.info("closing the TensorRT-LLM executor at exit")
            e.close()

    return close
