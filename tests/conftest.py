"""Shared test fixtures. Keep this file small and generic."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

# Nothing in the tests may reach a model hub; local directories load fine offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Ray reads these when it is imported; every Ray test module also binds tests.ray_cluster
for _key, _value in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
                     "RAY_USAGE_STATS_ENABLED": "0"}.items():
    os.environ.setdefault(_key, _value)
# A suite started in the background by a non-interactive shell inherits SIGINT ignored, and so
# would every CLI it starts: the Ctrl-C tests would then wait on a child that cannot hear them.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama chat model + byte-level BPE tokenizer, built offline and briefly fine-tuned
    so that greedy replies are ``<think>push box</think><answer>Up</answer>``."""
    from turnpool.policies.tiny_llm import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), sft_steps=100, seed=0)


@pytest.fixture(scope="module")
def shop_url() -> Iterator[str]:
    """A local WebShop server for the tests that run webshop envs on a pool."""
    from turnpool.webshop.server import ShopServer

    with ShopServer() as server:
        yield server.url
