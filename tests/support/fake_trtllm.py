"""FakeExecutorBindings: a FAKE of ``tensorrt_llm.bindings.executor`` (TensorRT-LLM 1.2) for CPU tests.

It stands in for what cannot run here (a GPU and the TensorRT-LLM library). Its signatures are
the real nanobind ones, checked against a snapshot of them (``tests/support/trtllm_api/bindings-1.2.1.json``,
by ``tests/engine/trtllm/test_api.py``): the same parameter names, order, keyword-only markers and
defaults, and the checks the C++ side makes (ints where ``SizeType32``, floats where
``FloatType``, a non-negative seed, temperature >= 0, 0 < top_p <= 1, no range on priority, which
cannot be read back), so a misspelt or mistyped argument fails here as it would there. Like the
real one it passes the batched post-processor only the requests that name it, with their
``client_ids``, logits as (1, beam, vocab) float32 tensors (on the CPU here: the CUDA branch is
untested), fails every running request if the post-processor raises, and leaves the optional
``kv_cache_stats`` out of some iterations. The executor is an in-process stand-in: ``await_responses`` runs one "iteration" in
which up to ``max_batch_size`` requests (highest priority first, never evicted once running, as
GUARANTEED_NO_EVICT) each get one token from a seeded random "model", after the batched logits
post-processor has run over the logits exactly as the real executor calls it, and the executor's
own repetition penalty (over the prompt and every generated token, no window) after it.

A GPU takes milliseconds per iteration; this fake takes almost none, so left free-running it would
finish requests before a test could cancel them. :func:`lockstep` ties it to the engine instead:
one executor iteration per engine ``step()``, whatever the machine's speed.
"""

from __future__ import annotations

import enum
import inspect
import itertools
import os
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

from lyre.model import orpheus

VOCAB = orpheus.VOCAB_SIZE


def _int(name: str, v: Any, lo: int | None = None, hi: int | None = None, optional: bool = True) -> None:
    if v is None and optional:
        return
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{name}: expected int, got {type(v).__name__}")
    if lo is not None and v < lo or hi is not None and v > hi:
        raise ValueError(f"{name}={v} out of range")


def _float(name: str, v: Any) -> None:
    if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)):
        raise TypeError(f"{name}: expected float, got {type(v).__name__}")


class ModelType(enum.Enum):
    DECODER_ONLY = 0
    ENCODER_ONLY = 1
    ENCODER_DECODER = 2


class CapacitySchedulerPolicy(enum.Enum):
    MAX_UTILIZATION = 0
    GUARANTEED_NO_EVICT = 1
    STATIC_BATCH = 2


class BatchingType(enum.Enum):
    STATIC = 0
    INFLIGHT = 1


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


class SamplingConfig:
    def __init__(self, beam_width=1, *, top_k=None, top_p=None, top_p_min=None, top_p_reset_ids=None,
                 top_p_decay=None, seed=None, temperature=None, min_tokens=None, beam_search_diversity_rate=None,
                 repetition_penalty=None, presence_penalty=None, frequency_penalty=None, length_penalty=None,
                 early_stopping=None, no_repeat_ngram_size=None, num_return_sequences=None, min_p=None,
                 beam_width_array=None):
        _int("beam_width", beam_width, 1, optional=False)
        _int("top_k", top_k, 0)
        _int("seed", seed, 0, 2**64 - 1)
        _int("min_tokens", min_tokens, 0)
        for name in ("top_p", "temperature", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            _float(name, locals()[name])
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if temperature is not None and temperature < 0:
            raise ValueError("temperature must be >= 0")
        if repetition_penalty is not None and repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        self.beam_width, self.top_k, self.top_p, self.seed = beam_width, top_k, top_p, seed
        self.temperature, self.min_tokens, self.repetition_penalty = temperature, min_tokens, repetition_penalty


class OutputConfig:
    def __init__(self, return_log_probs=None, return_context_logits=None, return_generation_logits=None,
                 exclude_input_from_output=None, return_encoder_output=None, return_perf_metrics=None,
                 additional_model_outputs=None):  # None = false (std::optional<bool>)
        self.exclude_input_from_output = bool(exclude_input_from_output)
        self.return_generation_logits = bool(return_generation_logits)


class Request:
    BATCHED_POST_PROCESSOR_NAME = "batched"

    def __init__(self, input_token_ids, max_tokens, *, streaming=False, sampling_config=None, output_config=None,
                 end_id=None, pad_id=None, position_ids=None, bad_words=None, stop_words=None, embedding_bias=None,
                 external_draft_tokens_config=None, prompt_tuning_config=None, multimodal_input=None,
                 multimodal_embedding=None, mrope_config=None, lora_config=None, lookahead_config=None,
                 kv_cache_retention_config=None, logits_post_processor_name=None, logits_post_processor=None,
                 encoder_input_token_ids=None, client_id=None, return_all_generated_tokens=False, priority=0.5,
                 type=None, context_phase_params=None, encoder_input_features=None, encoder_output_length=None,
                 cross_attention_mask=None, num_return_sequences=1, eagle_config=None, skip_cross_attn_blocks=None,
                 guided_decoding_params=None, language_adapter_uid=None, allotted_time_ms=None, cache_salt_id=None):
        if not isinstance(input_token_ids, list) or not input_token_ids:
            raise TypeError("input_token_ids: expected a non-empty list of int")
        for t in input_token_ids:
            _int("input_token_ids[]", t, optional=False)
        _int("max_tokens", max_tokens, 1, optional=False)
        _int("end_id", end_id)
        _int("pad_id", pad_id)
        _float("priority", priority)  # no range: the executor only sorts its queue by it
        if logits_post_processor_name is not None and logits_post_processor is not None:
            raise ValueError("only one of logits_post_processor_name and logits_post_processor may be set")
        if stop_words is not None and not all(isinstance(w, list) and all(isinstance(t, int) for t in w)
                                              for w in stop_words):
            raise TypeError("stop_words: expected list[list[int]]")
        if sampling_config is not None and not isinstance(sampling_config, SamplingConfig):
            raise TypeError("sampling_config: expected SamplingConfig")
        if output_config is not None and not isinstance(output_config, OutputConfig):
            raise TypeError("output_config: expected OutputConfig")
        self.input_token_ids, self.max_tokens, self.streaming = list(input_token_ids), max_tokens, streaming
        self.sampling_config = sampling_config or SamplingConfig()
        self.output_config = output_config or OutputConfig()
        _int("client_id", client_id, 0, 2**64 - 1)
        _int("cache_salt_id", cache_salt_id, 0)
        self.end_id, self.pad_id, self.stop_words = end_id, pad_id, stop_words
        self._priority = priority  # the real Request has no priority property: see priority_of
        self.logits_post_processor_name, self.client_id = logits_post_processor_name, client_id


class SchedulerConfig:
    def __init__(self, capacity_scheduler_policy=CapacitySchedulerPolicy.GUARANTEED_NO_EVICT,
                 context_chunking_policy=None, dynamic_batch_config=None):
        if not isinstance(capacity_scheduler_policy, CapacitySchedulerPolicy):
            raise TypeError("capacity_scheduler_policy: expected CapacitySchedulerPolicy")
        self.capacity_scheduler_policy = capacity_scheduler_policy


class KvCacheConfig:
    def __init__(self, enable_block_reuse=True, max_tokens=None, max_attention_window=None, sink_token_length=None,
                 free_gpu_memory_fraction=None, host_cache_size=None, onboard_blocks=True, cross_kv_cache_fraction=None,
                 secondary_offload_min_priority=None, event_buffer_max_size=0, *, enable_partial_reuse=True,
                 copy_on_partial_reuse=True, use_uvm=False, attention_dp_events_gather_period_ms=5,
                 runtime_defaults=None, max_gpu_total_bytes=0):
        _float("free_gpu_memory_fraction", free_gpu_memory_fraction)
        _int("max_tokens", max_tokens, 1)
        self.enable_block_reuse, self.free_gpu_memory_fraction = enable_block_reuse, free_gpu_memory_fraction
        self.max_tokens = max_tokens


class LogitsPostProcessorConfig:
    def __init__(self, processor_map=None, processor_batched=None, replicate=True):
        if processor_batched is not None and not callable(processor_batched):
            raise TypeError("processor_batched: expected a callable")
        self.processor_map, self.processor_batched = processor_map, processor_batched


class ExecutorConfig:
    def __init__(self, max_beam_width=1, scheduler_config=None, kv_cache_config=None, enable_chunked_context=False,
                 normalize_log_probs=True, iter_stats_max_iterations=1000, request_stats_max_iterations=0,
                 batching_type=BatchingType.INFLIGHT, max_batch_size=None, max_num_tokens=None, parallel_config=None,
                 peft_cache_config=None, logits_post_processor_config=None, decoding_config=None,
                 use_gpu_direct_storage=False, gpu_weights_percent=1.0, max_queue_size=None,
                 extended_runtime_perf_knob_config=None, debug_config=None, recv_poll_period_ms=0,
                 max_seq_idle_microseconds=180000000, spec_dec_config=None, guided_decoding_config=None,
                 additional_model_outputs=None, cache_transceiver_config=None, gather_generation_logits=False,
                 mm_embedding_offloading=False, enable_trt_overlap=False,
                 fail_fast_on_attention_window_too_large=False):
        _int("max_beam_width", max_beam_width, 1, optional=False)
        _int("max_batch_size", max_batch_size, 1)
        _int("max_num_tokens", max_num_tokens, 1)
        for name, v, cls in (("scheduler_config", scheduler_config, SchedulerConfig),
                             ("kv_cache_config", kv_cache_config, KvCacheConfig),
                             ("logits_post_processor_config", logits_post_processor_config, LogitsPostProcessorConfig)):
            if v is not None and not isinstance(v, cls):
                raise TypeError(f"{name}: expected {cls.__name__}")
        self.max_beam_width = max_beam_width
        self.scheduler_config = scheduler_config or SchedulerConfig()
        self.kv_cache_config = kv_cache_config or KvCacheConfig()
        self.enable_chunked_context, self.max_batch_size, self.max_num_tokens = (
            enable_chunked_context, max_batch_size, max_num_tokens)
        self.logits_post_processor_config = logits_post_processor_config


@dataclass
class Result:
    is_final: bool = False
    output_token_ids: list[list[int]] = field(default_factory=list)
    finish_reasons: list[FinishReason] = field(default_factory=list)


class Response:
    def __init__(self, request_id: int, result: Result | str, client_id: int | None = None):
        # the real constructor is overloaded on the type: (request_id, error_msg: str, ...) or (..., result: Result, ...)
        self.request_id, self.client_id = request_id, client_id
        self._result = result if isinstance(result, Result) else None
        self._error = result if isinstance(result, str) else ""

    def has_error(self) -> bool:
        return self._result is None

    @property
    def error_msg(self) -> str:
        return self._error

    @property
    def result(self) -> Result:
        if self._result is None:
            raise RuntimeError("the response has an error")
        return self._result


@dataclass
class KvCacheStats:
    max_num_blocks: int = 1000
    free_num_blocks: int = 1000
    used_num_blocks: int = 0
    tokens_per_block: int = 32


@dataclass
class InflightBatchingStats:
    num_scheduled_requests: int = 0
    num_context_requests: int = 0
    num_gen_requests: int = 0
    num_paused_requests: int = 0
    num_ctx_tokens: int = 0


@dataclass
class IterationStats:
    iter: int = 0
    iter_latency_ms: float = 0.0
    num_active_requests: int = 0
    num_queued_requests: int = 0
    gpu_mem_usage: int = 0
    kv_cache_stats: KvCacheStats | None = field(default_factory=KvCacheStats)  # std::optional in C++
    inflight_batching_stats: InflightBatchingStats | None = field(default_factory=InflightBatchingStats)


@dataclass
class _Running:
    request: Request
    id: int
    order: int
    tokens: list[int]  # prompt + generated
    generated: int = 0
    cancelled: bool = False
    scheduled: bool = False


class Executor:
    """In-process stand-in for the executor (see the module doc). Test hooks: ``enqueued``,
    ``cancelled``, ``fail_next_await``, ``error_request(id, msg)``, ``post_processor_calls``."""

    def __init__(self, model_path, model_type, executor_config):
        if not isinstance(model_path, str | os.PathLike):
            raise TypeError("model_path: expected a path")
        if not os.path.isdir(model_path):
            raise RuntimeError(f"[TensorRT-LLM][ERROR] engine directory {model_path} not found")
        if not isinstance(model_type, ModelType) or not isinstance(executor_config, ExecutorConfig):
            raise TypeError("Executor(model_path, model_type: ModelType, executor_config: ExecutorConfig)")
        self.config = executor_config
        self._ids = itertools.count(1)
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._queue: dict[int, _Running] = {}
        self._errors: list[tuple[int, str]] = []
        self._stats: list[IterationStats] = []
        self._iteration = 0
        self._shut = False
        self.enqueued: list[Request] = []
        self.cancelled: list[int] = []
        self.fail_next_await: BaseException | None = None
        self.post_processor_calls = 0
        self.lockstep = False  # True: an iteration runs only for a tick()
        # True: a queued request's first token is sampled at once, from another thread, before
        # enqueue_request returns (stricter than the real executor, which can do it only after)
        self.eager = False
        self._early: list[Response] = []
        self._ticks = 0

    def enqueue_request(self, request: Request) -> int:
        if not isinstance(request, Request):
            raise TypeError("request: expected Request")
        with self._cond:
            if self._shut:
                raise RuntimeError("the executor is shut down")
            rid = next(self._ids)
            self.enqueued.append(request)
            running = self._queue[rid] = _Running(request, rid, next(self._order), list(request.input_token_ids))
            if self.eager:
                # The real executor's own thread may pick the request up and run an iteration
                # (post-processor included) as soon as enqueue_request returns, before the caller
                # has stored the id: do that, from another thread, even earlier.
                running.scheduled = True
                worker = threading.Thread(target=lambda: self._early.extend(self._run_batch([running])))
                worker.start()
                worker.join()
            self._cond.notify_all()
            return rid

    def cancel_request(self, id=None) -> None:  # noqa: A002 - the real parameter name
        _int("id", id, 0, optional=False)  # the default None cannot be used: the C++ parameter is an IdType
        with self._cond:
            self.cancelled.append(id)
            if id in self._queue:
                self._queue[id].cancelled = True
            self._cond.notify_all()

    def error_request(self, id: int, message: str) -> None:  # noqa: A002
        with self._cond:
            self._errors.append((id, message))
            self._cond.notify_all()

    def tick(self) -> None:
        """Allow one iteration (lockstep mode)."""
        with self._cond:
            self._ticks += 1
            self._cond.notify_all()

    def can_enqueue_requests(self) -> bool:
        return not self._shut

    def get_latest_iteration_stats(self) -> list[IterationStats]:
        with self._cond:
            stats, self._stats = self._stats, []
            return stats

    def shutdown(self) -> None:
        with self._cond:
            self._shut = True
            self._cond.notify_all()

    def await_responses(self, timeout=None) -> list[Response]:
        if timeout is not None and not isinstance(timeout, timedelta):
            raise TypeError("timeout: expected datetime.timedelta")
        with self._cond:
            if self.fail_next_await is not None:
                error, self.fail_next_await = self.fail_next_await, None
                raise error
            wait = timeout.total_seconds() if timeout is not None else None
            if self.lockstep:
                if not self._ticks and not self._errors and not self._shut:
                    self._cond.wait(wait)
            elif not self._queue and not self._errors and not self._shut:
                self._cond.wait(wait)
            if self.lockstep:  # (checked again: lockstep may have been switched on during the wait)
                if not self._ticks:
                    return self._iterate(run_model=False)
                self._ticks -= 1
            return self._iterate()

    # --- one iteration of the fake model -----------------------------------------------------

    def _iterate(self, run_model: bool = True) -> list[Response]:
        out, self._early = self._early, []
        out += [Response(rid, msg) for rid, msg in self._errors]
        for rid, _ in self._errors:
            self._queue.pop(rid, None)
        self._errors.clear()
        if not run_model:
            return out
        for r in [r for r in self._queue.values() if r.cancelled]:
            del self._queue[r.id]
            out.append(Response(r.id, Result(True, [[]], [FinishReason.CANCELLED]), r.request.client_id))
        if not self._queue:
            return out
        limit = self.config.max_batch_size or len(self._queue)
        running = [r for r in self._queue.values() if r.scheduled]
        waiting = sorted((r for r in self._queue.values() if not r.scheduled),
                         key=lambda r: (-r.request._priority, r.order))
        for r in waiting[:max(0, limit - len(running))]:
            r.scheduled = True
            running.append(r)
        queued = len(self._queue) - len(running)
        out += self._run_batch(running)
        self._iteration += 1
        self._stats.append(IterationStats(
            iter=self._iteration, iter_latency_ms=1.0, num_active_requests=len(running),
            num_queued_requests=queued,
            # optional in the real stats: absent on some iterations here so the engine copes without them
            kv_cache_stats=None if self._iteration % 3 == 0 else KvCacheStats(used_num_blocks=len(running),
                                                                             free_num_blocks=1000 - len(running)),
            inflight_batching_stats=InflightBatchingStats(num_scheduled_requests=len(running),
                                                          num_gen_requests=len(running))))
        return out

    def _run_batch(self, running: list[_Running]) -> list[Response]:
        """One token for each of ``running``: logits, the batched post-processor over the requests
        that name it (as the executor calls it), sampling."""
        logits = [self._logits(r) for r in running]
        batched = self.config.logits_post_processor_config
        chosen = [i for i, r in enumerate(running)
                  if r.request.logits_post_processor_name == Request.BATCHED_POST_PROCESSOR_NAME]
        if chosen and batched is not None and batched.processor_batched is not None:
            self.post_processor_calls += 1
            try:
                batched.processor_batched([running[i].id for i in chosen], [logits[i] for i in chosen],
                                          [[list(running[i].tokens)] for i in chosen], 0,
                                          [running[i].request.client_id for i in chosen])
            except Exception as e:  # as the executor: forwardAsync fails every active request
                for r in running:
                    self._queue.pop(r.id, None)
                return [Response(r.id, f"Encountered an error in forwardAsync function: {e}", r.request.client_id)
                        for r in running]
        return [self._advance(r, lg) for r, lg in zip(running, logits, strict=True)]

    def _logits(self, r: _Running) -> torch.Tensor:
        row = fake_logits(r.request.sampling_config.seed or 0, len(r.tokens))
        return row.view(1, 1, VOCAB)  # (1, beam, vocab) as the executor hands them out

    def _advance(self, r: _Running, logits: torch.Tensor) -> Response:
        req, sc = r.request, r.request.sampling_config
        row = logits[0, 0].clone()
        if sc.repetition_penalty is not None and sc.repetition_penalty != 1.0:
            # as the executor's penalty: every distinct token of the prompt and the generated ones, no window
            seen = torch.tensor(sorted(set(r.tokens)))
            v = row[seen]
            row[seen] = torch.where(v > 0, v / sc.repetition_penalty, v * sc.repetition_penalty)
        if sc.min_tokens and r.generated < sc.min_tokens and req.end_id is not None:
            row[req.end_id] = float("-inf")
        if sc.top_k == 1 or sc.temperature is None:
            token = int(row.argmax())
        else:
            g = torch.Generator().manual_seed((sc.seed or 0) + r.generated)
            token = int(torch.multinomial(torch.softmax(row / sc.temperature, -1), 1, generator=g))
        r.generated += 1
        if token == req.end_id:
            del self._queue[r.id]
            return Response(r.id, Result(True, [[]], [FinishReason.END_ID]), req.client_id)
        r.tokens.append(token)
        if req.stop_words and [token] in req.stop_words:
            del self._queue[r.id]
            return Response(r.id, Result(True, [[token]], [FinishReason.STOP_WORDS]), req.client_id)
        if r.generated >= req.max_tokens:
            del self._queue[r.id]
            return Response(r.id, Result(True, [[token]], [FinishReason.LENGTH]), req.client_id)
        return Response(r.id, Result(False, [[token]], [FinishReason.NOT_FINISHED]), req.client_id)


def fake_logits(seed: int, length: int) -> torch.Tensor:
    """Test hook: the fake model's (vocab,) logits for a request seeded ``seed`` with ``length`` tokens so far."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + length) % 2**63)
    return torch.randn(VOCAB, generator=g)


def priority_of(request: Request) -> float:
    """Test hook: the priority a Request was made with (the real class does not give it back)."""
    return request._priority


def lockstep(engine: Any) -> Any:
    """Make ``engine``'s fake executor run exactly one iteration per ``engine.step()``."""
    executor = engine.executor
    executor.lockstep = True
    step = engine.step

    def step_in_lockstep(order=None):
        executor.tick()
        return step(order)

    engine.step = step_in_lockstep
    return engine


# ``import fake_trtllm as tle`` then ``tle.Request(...)``: the module is the bindings namespace.
__all__ = [name for name, obj in dict(globals()).items()
           if inspect.isclass(obj) and obj.__module__ == __name__]
