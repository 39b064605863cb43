"""Conformance of the renderer contract on real vocabularies and 8 chat template families:
random multi-turn episodes (observations with unicode and markup-like text, replies with and
without <think>, tool calls, replies cut at their length limit) must train on exactly what the
model saw and sampled (`turnpool.bench.tokens.play_episode` checks it; `turnpool bench
tokens` runs the same at 10,000 episodes per template and prints the numbers)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from turnpool.bench.tokens import FAMILIES, VOCABS, ChatTokenizer, load_vocab, play_episode

EPISODES = 125  # per family and vocabulary: 4 vocabularies -> 500 episodes per family


@pytest.fixture(scope="module", params=VOCABS)
def vocab(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_random_episodes_are_token_exact(family: str, vocab: str) -> None:
    tok: ChatTokenizer = load_vocab(vocab, FAMILIES[family])
    rng = np.random.default_rng([20, sorted(FAMILIES).index(family), VOCABS.index(vocab)])
    turns = drifted = 0
    for _ in range(EPISODES):
        res = play_episode(tok, rng, int(rng.integers(1, 9)))
        assert res.mismatched == 0 and res.bad_turns == 0 and res.decode_ok, res
        turns += res.turns
        drifted += res.drifted
    assert turns > 2 * EPISODES  # mostly multi-turn
    # the alternative the renderer replaces does drift on the same episodes
    assert drifted > 0


def test_history_rewriting_templates_drift_when_re_rendered() -> None:
    """Qwen3 drops earlier thoughts: re-rendering the chat each turn changes history, the
    renderer's sequence does not."""
    tok = load_vocab("qwen", FAMILIES["qwen3"])
    rng = np.random.default_rng(1)
    results = [play_episode(tok, rng, 6) for _ in range(50)]
    assert all(r.mismatched == 0 for r in results)
    assert sum(r.drifted for r in results) > 25


def test_bench_tokens_reports_per_template(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from turnpool.bench.tokens import command

    out = tmp_path / "tokens.json"
    res = CliRunner().invoke(command, ["--episodes", "30", "--templates", "qwen3,mistral",
                                       "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text(encoding="utf-8"))
    rows = {r["family"]: r for r in report["results"]}
    assert set(rows) == {"qwen3", "mistral"}
    for r in rows.values():
        assert r["episodes"] == 30 and r["mismatched_tokens"] == 0 and r["bad_turns"] == 0
        assert r["drifted_episodes"] > 0
        assert {"render_us_turn1", "render_us_turn64", "full_us_turn1",
                "full_us_turn64"} <= set(r)
    assert "qwen3" in res.output and "drifted tokens" in res.output
