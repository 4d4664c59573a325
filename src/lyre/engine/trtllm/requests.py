"""Lyre's requests in the executor's terms (pure translation, no executor call): the executor's
configuration, one ``Request`` per generation, the scheduler's priority on the executor's scale."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

from lyre.engine.base import GenerationRequest
from lyre.engine.trtllm.config import TrtllmEngineConfig
from lyre.engine.trtllm.logits import LogitsPostProcessor
from lyre.model import orpheus


def make_executor_config(tle: ModuleType, config: TrtllmEngineConfig, post_processor: LogitsPostProcessor) -> Any:
    """No eviction, chunked context, block reuse, the engine's batch and token limits, a KV cache no
    larger than every slot full (``kv_max_tokens``; the executor takes the smaller of that and
    ``free_gpu_memory_fraction`` of the memory free when it starts), and Lyre's logits processing
    as the batched logits post-processor."""
    return tle.ExecutorConfig(
        1,  # max_beam_width
        scheduler_config=tle.SchedulerConfig(tle.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT),
        kv_cache_config=tle.KvCacheConfig(
            enable_block_reuse=config.enable_block_reuse,
            max_tokens=config.kv_max_tokens or None,
            free_gpu_memory_fraction=config.free_gpu_memory_fraction,
        ),
        enable_chunked_context=config.enable_chunked_context,
        max_batch_size=config.max_batch_size,
        max_num_tokens=config.max_num_tokens,
        logits_post_processor_config=tle.LogitsPostProcessorConfig(processor_batched=post_processor),
    )


def make_request(tle: ModuleType, request: GenerationRequest, client_id: int, max_seq_len: int,
                 executor_penalty: float | None = None) -> Any:
    """The executor ``Request`` for ``request``: streaming token ids, ``max_tokens`` capped to the room
    left in the sequence, end-of-speech as ``end_id`` and the other stop ids as ``stop_words``, the
    sampling with a per-request seed (an unseeded request gets a random one: the executor would give
    every request seed 0), the scheduler's priority, and Lyre's logits post-processor by
    ``client_id`` for a constrained or penalised request. The executor's own repetition penalty stays
    off: it has no window and covers the prompt (a cloned voice's reference codes); the
    post-processor applies Lyre's, over the most recent generated tokens (``executor_penalty`` sets the
    executor's own: the acceptance run's control, never the server)."""
    p = request.sampling
    greedy = p.temperature == 0
    sampling = tle.SamplingConfig(
        1,  # beam_width
        top_k=1 if greedy else (p.top_k or None),
        top_p=None if greedy else p.top_p,
        temperature=None if greedy else p.temperature,
        seed=p.seed if p.seed is not None else random.getrandbits(63),
        min_tokens=p.min_tokens or None,
        repetition_penalty=executor_penalty,
    )
    end_id = orpheus.END_OF_SPEECH if orpheus.END_OF_SPEECH in p.stop_ids else p.stop_ids[0]
    stop_words = [[t] for t in p.stop_ids if t != end_id]
    return tle.Request(
        list(request.prompt_ids),
        min(p.max_tokens, max_seq_len - len(request.prompt_ids)),
        streaming=True,
        sampling_config=sampling,
        output_config=tle.OutputConfig(exclude_input_from_output=True),
        end_id=end_id,
        pad_id=orpheus.PAD,
        stop_words=stop_words or None,
        priority=executor_priority(request.priority),
        logits_post_processor_name=(tle.Request.BATCHED_POST_PROCESSOR_NAME if LogitsPostProcessor.wanted(p)
                                    else None),
        client_id=client_id,
    )


def executor_priority(priority: int) -> float:
    """Scheduler priority (-1 a batch item, 0 ongoing, 1 before first audio, 2 continuation) -> the executor's
    0..1 (0.5 default; a batch item's 0.25)."""
    return min(1.0, max(0.0, 0.5 + 0.25 * max(-1, priority)))
