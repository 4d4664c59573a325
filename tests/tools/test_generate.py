"""``python -m lyre.tools.generate``: the debugging command, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

from lyre.model import checkpoint, orpheus
from tests.support.paths import REPO_ROOT


def generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lyre", "generate", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=300)


def test_json_output_cycles_prompts_and_reports_each_request(demo_dir):
    out = generate("--checkpoint", str(demo_dir / "llama"), "--json", "--prompt-ids", "1,2,3", "--prompt-ids",
                   "4, 5", "--requests", "3", "--stagger", "2", "--max-tokens", "8", "--temperature", "0",
                   "--no-constrain")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["request_id"] for r in rows] == ["r0", "r1", "r2"]
    assert [r["prompt_ids"] for r in rows] == [[1, 2, 3], [4, 5], [1, 2, 3]]
    assert all(len(r["token_ids"]) == 8 and r["finish_reason"] == "length" for r in rows)
    assert rows[0]["token_ids"] == rows[2]["token_ids"]  # greedy: same prompt, same tokens


def test_text_prompts_seeds_and_the_audio_constraint(demo_dir):
    args = ["--checkpoint", str(demo_dir / "llama"), "--json", "--text", "Hello world", "--voice", "tara",
            "--voice", "leo", "--text", "Bye now", "--max-tokens", "21", "--seed", "7"]
    first, second = generate(*args), generate(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout  # seeded: reproducible
    rows = [json.loads(line) for line in first.stdout.splitlines()]
    tok = checkpoint.load_tokenizer(demo_dir / "llama")
    assert rows[0]["prompt_ids"] == orpheus.build_prompt_ids(tok, "Hello world", "tara")
    assert rows[1]["prompt_ids"] == orpheus.build_prompt_ids(tok, "Bye now", "leo")
    for r in rows:
        parser = orpheus.AudioTokenParser()
        assert len(parser.feed(r["token_ids"])) == 3 and parser.stats.invalid_tokens == 0
    assert rows[0]["token_ids"] != rows[1]["token_ids"]  # seeds 7 and 8


def test_human_output_and_errors(demo_dir):
    out = generate("--checkpoint", str(demo_dir / "llama"), "--requests", "2", "--max-tokens", "14", "--seed", "1")
    assert out.returncode == 0, out.stderr
    assert "r1: " in out.stdout and "2 audio frames" in out.stdout and "tokens/s" in out.stdout
    bad = generate("--checkpoint", str(demo_dir / "llama"), "--prompt-ids", "1,x")
    assert bad.returncode == 2 and "not a comma-separated list of token ids" in bad.stderr
    bad = generate("--checkpoint", str(demo_dir / "llama"), "--prompt-ids", "1,999999")
    assert bad.returncode == 1 and "outside the model's vocabulary" in bad.stderr
    bad = generate("--checkpoint", str(demo_dir / "llama"), "--temperature", "-1")
    assert bad.returncode == 1 and "'temperature' = -1.0 is out of range: must be >= 0.0" in bad.stderr


def test_requests_beyond_the_slots_join_as_slots_come_free(demo_dir):
    out = generate("--checkpoint", str(demo_dir / "llama"), "--json", "--prompt-ids", "1,2,3", "--requests", "3",
                   "--max-tokens", "5", "--temperature", "0", "--no-constrain",
                   "--set", "scheduler.max_concurrent_sessions=1", "--set", "scheduler.max_batch_size=1")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["request_id"] for r in rows] == ["r0", "r1", "r2"]
    assert all(r["token_ids"] == rows[0]["token_ids"] and len(r["token_ids"]) == 5 for r in rows)
