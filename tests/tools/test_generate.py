"""``lyre generate``, the debugging command: its ``main(argv)`` in-process, and once as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lyre.model import orpheus
from lyre.tools.generate import main
from tests.support.paths import REPO_ROOT


@pytest.fixture
def generate(capsys):
    """``generate(*argv)`` -> (exit status, stdout, stderr) of ``lyre generate *argv``."""

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse's refusals
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_json_output_cycles_prompts_and_reports_each_request(generate, demo_dir):
    code, out, err = generate("--checkpoint", str(demo_dir / "llama"), "--json", "--prompt-ids", "1,2,3",
                              "--prompt-ids", "4, 5", "--requests", "3", "--stagger", "2", "--max-tokens", "8",
                              "--temperature", "0", "--no-constrain")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["request_id"] for r in rows] == ["r0", "r1", "r2"]
    assert [r["prompt_ids"] for r in rows] == [[1, 2, 3], [4, 5], [1, 2, 3]]
    assert all(len(r["token_ids"]) == 8 and r["finish_reason"] == "length" for r in rows)
    assert rows[0]["token_ids"] == rows[2]["token_ids"]  # greedy: same prompt, same tokens


def test_text_prompts_seeds_and_the_audio_constraint(generate, demo_dir, demo_tokenizer):
    args = ["--checkpoint", str(demo_dir / "llama"), "--json", "--text", "Hello world", "--voice", "tara",
            "--voice", "leo", "--text", "Bye now", "--max-tokens", "21", "--seed", "7"]
    first, second = generate(*args), generate(*args)
    assert first[0] == 0, first[2]
    assert first[1] == second[1]  # seeded: reproducible
    rows = [json.loads(line) for line in first[1].splitlines()]
    assert rows[0]["prompt_ids"] == orpheus.build_prompt_ids(demo_tokenizer, "Hello world", "tara")
    assert rows[1]["prompt_ids"] == orpheus.build_prompt_ids(demo_tokenizer, "Bye now", "leo")
    for r in rows:
        parser = orpheus.AudioTokenParser()
        assert len(parser.feed(r["token_ids"])) == 3 and parser.stats.invalid_tokens == 0
    assert rows[0]["token_ids"] != rows[1]["token_ids"]  # seeds 7 and 8


def test_human_output_as_a_user_runs_it(demo_dir):
    """The one ``lyre generate`` process of the suite: the installed command runs and exits 0."""
    out = subprocess.run([sys.executable, "-m", "lyre", "generate", "--checkpoint", str(demo_dir / "llama"),
                          "--requests", "2", "--max-tokens", "14", "--seed", "1"],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "r1: " in out.stdout and "2 audio frames" in out.stdout and "tokens/s" in out.stdout


def test_errors(generate, demo_dir):
    code, _, err = generate("--checkpoint", str(demo_dir / "llama"), "--prompt-ids", "1,x")
    assert code == 2 and "not a comma-separated list of token ids" in err
    code, _, err = generate("--checkpoint", str(demo_dir / "llama"), "--prompt-ids", "1,999999")
    assert code == 1 and "outside the model's vocabulary" in err
    code, _, err = generate("--checkpoint", str(demo_dir / "llama"), "--temperature", "-1")
    assert code == 1 and "'temperature' = -1.0 is out of range: must be >= 0.0" in err
    code, _, err = generate("--checkpoint", str(demo_dir / "llama"), "--requests", "0")
    assert code == 2 and "--requests must be >= 1" in err


def test_requests_beyond_the_slots_join_as_slots_come_free(generate, demo_dir):
    code, out, err = generate("--checkpoint", str(demo_dir / "llama"), "--json", "--prompt-ids", "1,2,3",
                              "--requests", "3", "--max-tokens", "5", "--temperature", "0", "--no-constrain",
                              "--set", "scheduler.max_concurrent_sessions=1", "--set", "scheduler.max_batch_size=1")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["request_id"] for r in rows] == ["r0", "r1", "r2"]
    assert all(r["token_ids"] == rows[0]["token_ids"] and len(r["token_ids"]) == 5 for r in rows)
