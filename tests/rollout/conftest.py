"""The tiny offline model for the rollout test that drives an OpenAI-compatible server.

Overrides the root ``tiny_model_dir`` fixture only because that one still imports the model
builder from its old home (``turnpool.testing``); once tests/conftest.py imports
`turnpool.policies.tiny_llm`, this file and tests/policies/conftest.py can go.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from turnpool.policies.tiny_llm import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), sft_steps=100, seed=0)
