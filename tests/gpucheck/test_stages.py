"""The acceptance run's comparison stages catch what they are there for: engines that part from
the PyTorch engine (parity), a penalty that covers the prompt (cloned), and a control that cannot
tell the penalties apart. The engines are built once (fakes: ``tests/support/gpucheck.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lyre.gpucheck import stages
from lyre.gpucheck.report import StageFailed
from tests.support import fake_trtllm as tle
from tests.support.gpucheck import H100, context, fake_kit
from tests.support.model_executor import ModelExecutor, bindings


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    ctx = context(tmp_path_factory.mktemp("gpucheck"), fake_kit())
    ctx.env = H100
    stages.stage_build(ctx)
    return ctx


def with_executor(ctx, executor):
    return replace(ctx, kit=replace(ctx.kit, bindings=lambda: bindings(executor)))


def test_the_parity_stage_fails_naming_the_first_token_where_the_engines_part(built):
    """The plain fake executor samples from seeded random logits, not the checkpoint's: the greedy
    tokens part at once, far from a near-tie."""
    with pytest.raises(StageFailed) as failed:
        stages.stage_parity(with_executor(built, tle.Executor))
    assert failed.value.summary.startswith("4 of 4 requests differ") and "token 0 is" in failed.value.summary
    assert "more than a 16-bit near-tie" in failed.value.summary


class WindowedPenaltyExecutor(ModelExecutor):
    """An executor whose own repetition penalty happens to be Lyre's (the last 64 generated tokens,
    not the prompt): the cloned stage's control then gives the PyTorch engine's tokens."""

    def _advance(self, r, logits):
        sc = r.request.sampling_config
        if not hasattr(r, "own_penalty"):  # (taken from the request once: the fake's own penalty then stays off)
            r.own_penalty, sc.repetition_penalty = sc.repetition_penalty, None
        recent = sorted(set(r.tokens[len(r.request.input_token_ids):][-64:]))
        if r.own_penalty and recent:
            row = logits[0, 0]
            v = row[recent]
            row[recent] = torch.where(v > 0, v / r.own_penalty, v * r.own_penalty)
        return super()._advance(r, logits)


@pytest.mark.slow  # (~9 s: the stage's own run)
def test_the_cloned_stage_fails_when_its_control_cannot_tell_the_penalties_apart(built):
    with pytest.raises(StageFailed, match="cannot tell the two penalties apart"):
        stages.stage_cloned(with_executor(built, WindowedPenaltyExecutor))


@pytest.mark.slow  # (~5 s)
def test_the_cloned_stage_fails_when_the_server_sets_the_executors_penalty_too(built, monkeypatch):
    """The defect the stage is there for: the executor's penalty (which covers the reference codes in
    the prompt) on top of Lyre's. The greedy tokens part from the PyTorch engine's."""
    import lyre.engine.trtllm.engine as trtllm_engine

    make = trtllm_engine.make_request
    monkeypatch.setattr(trtllm_engine, "make_request", lambda tle_, request, client_id, max_seq_len: make(
        tle_, request, client_id, max_seq_len, executor_penalty=request.sampling.repetition_penalty))
    with pytest.raises(StageFailed, match="requests differ"):
        stages.stage_cloned(built)
