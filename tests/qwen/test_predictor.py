"""The code predictor's frame loop (``lyre.engine.qwen3.predictor``): sampling decided on the device
from per-row tensors, as a CUDA graph needs, follows each row's own rule (greedy, top-k, nucleus);
the loop written for capture runs eagerly here, and a capture that cannot happen (no GPU) leaves the
loop eager with the same codes."""

from __future__ import annotations

import pytest
import torch

from lyre.engine.qwen3.engine import QwenEngine
from lyre.engine.qwen3.predictor import FrameLoop, shortlist
from lyre.engine.torch.cuda_graphs import GraphCaptureError
from lyre.engine.torch.engine import TorchEngineConfig
from lyre.engine.torch.row_sampling import sample_rows
from tests.support.qwen_reference import tiny_model


def draws(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, n: int = 2000) -> torch.Tensor:
    """The code each of ``n`` evenly spaced uniforms picks from one row of ``logits``."""
    rows = logits.expand(n, -1)
    u = (torch.arange(n) + 0.5) / n
    return sample_rows(rows, torch.full((n,), temperature), torch.full((n,), top_k), torch.full((n,), top_p), u)


def test_each_row_follows_its_own_rule():
    logits = torch.tensor([[2.0, 1.0, 0.5, 3.0, -1.0, 0.0]])
    probs = logits.softmax(-1)[0]
    assert set(draws(logits, 0.0, 50, 1.0).tolist()) == {3}  # greedy
    assert set(draws(logits, 1.0, 1, 1.0).tolist()) == {3}  # top-k 1
    top3 = draws(logits, 1.0, 3, 1.0)
    assert set(top3.tolist()) == {3, 0, 1}
    kept = probs[[3, 0, 1]] / probs[[3, 0, 1]].sum()  # the k best, renormalised
    got = torch.stack([(top3 == c).float().mean() for c in (3, 0, 1)])
    assert torch.allclose(got, kept, atol=2e-3)
    # the nucleus: a code is in it while the mass more likely than it is under top_p (3: 0.60, 0: 0.22)
    assert set(draws(logits, 1.0, 0, 0.5).tolist()) == {3}
    assert set(draws(logits, 1.0, 0, 0.7).tolist()) == {3, 0}
    everything = draws(logits, 1.0, 0, 1.0, n=20000)
    assert torch.allclose(torch.bincount(everything, minlength=6).float() / 20000, probs, atol=1e-3)
    # rows side by side: each its own rule, whatever its neighbours'
    batch = sample_rows(logits.expand(3, -1), torch.tensor([0.0, 1.0, 1.0]), torch.tensor([0, 1, 0]),
                        torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.99, 0.99, 0.99]))
    alone = sample_rows(logits, torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([0.99]))
    assert batch.tolist() == [3, 3, alone.item()] and alone.item() == 4  # (u = 0.99: the least likely code)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("predictor")
    tiny_model("custom_voice", seed=6).save_pretrained(path)
    return QwenEngine.from_checkpoint(path, TorchEngineConfig(slots=4, max_batch_size=4, max_seq_len=64))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the capture happens")
def test_a_loop_whose_graph_cannot_be_captured_stops_the_start_naming_its_bucket(engine):
    """Never a silent fall back to the eager loop (a fraction of the GPU's pace): the error names the
    first bucket and the way out. Here no GPU is there to capture on."""
    loop = FrameLoop(engine.talker, engine.sampler.kv, graphs=True)
    with pytest.raises(GraphCaptureError, match=r"the code predictor's frame over 1 rows \(width 64\).*"
                                                r"engine\.cuda_graphs: false"):
        loop.prepare(torch.device("cpu"))


def test_ranking_a_shortlist_picks_what_ranking_every_code_picks():
    g = torch.Generator().manual_seed(3)
    logits, u = torch.randn(32, 2048, generator=g), torch.rand(32, generator=g)
    t, p = torch.full((32,), 0.9), torch.full((32,), 0.95)
    k = torch.randint(1, 65, (32,), generator=g)
    assert torch.equal(sample_rows(logits, t, k, p, u, width=shortlist(k.tolist(), 2048)),
                       sample_rows(logits, t, k, p, u))
    assert shortlist([50, 64], 2048) == 64 and shortlist([50, 0], 2048) == shortlist([65], 2048) == 2048
