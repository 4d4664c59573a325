"""host_heap.keep_freed_memory: a step's large temporaries are served again without page faults."""

from __future__ import annotations

import subprocess
import sys

import pytest

# one process per setting (mallopt is process-wide): page faults of full-vocabulary sampling steps
# at 32 rows (the penalty and the draw allocate several 20 MB (batch, vocabulary) temporaries)
PROBE = """
import resource, sys, torch
from lyre.engine.torch.host_heap import keep_freed_memory
from lyre.engine.torch.sampling import SamplingBatch, apply_repetition_penalty, draw
if sys.argv[1] == "keep":
    assert keep_freed_memory()
b, v = 32, 156940
logits, history, penalty = torch.randn(b, v), torch.randint(0, v, (b, 64)), torch.full((b,), 1.1)
params = SamplingBatch([0.6] * b, [0] * b, [0.8] * b, [torch.Generator().manual_seed(i) for i in range(b)])
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    draw(apply_repetition_penalty(logits, history, penalty), params).cols.tolist()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[2:]))
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.slow  # (~7 s of steps to measure page faults)
def test_freed_step_memory_is_reused_instead_of_faulted_in_again():
    four_steps = 4 * 32 * 156940 * 4 // 4096  # pages of one (batch, vocabulary) tensor a step: ~19,600
    assert _faults("default") > four_steps  # glibc gives much of it back to the kernel every step (seen: 39k-98k)
    assert _faults("keep") < four_steps // 2  # kept on the heap: touched again without faults (seen: 0-4905)
