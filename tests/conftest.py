"""Shared test fixtures. Keep this file small and generic."""

from __future__ import annotations

import fcntl
import os
import shutil
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding a test marked ``slow(seconds=...)`` first, the longest first, then the
    others by number of tests.

    ``make test`` hands whole files to two workers in this order (``--dist loadfile
    --no-loadscope-reorder``): a minute-long test that started last would run alone at the
    end while the other worker idles; started first, the many short files fill the other
    worker beside it. Within a file the order is unchanged.
    """
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def seconds(name: str) -> float:
        marks = [t.get_closest_marker("slow") for t in files[name]]
        return max((float(m.kwargs.get("seconds", 0)) for m in marks if m), default=0.0)

    order = sorted(files, key=lambda name: (-seconds(name), -len(files[name])))
    items[:] = [item for name in order for item in files[name]]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama chat model + byte-level BPE tokenizer, built offline and briefly fine-tuned
    so that greedy replies are ``<think>push box</think><answer>Up</answer>``.

    Built once per run: under xdist the workers' temporary folders share a parent, where the
    first worker to take the lock builds it and the others wait for it (the wait is bounded
    by the test's timeout, which covers fixture set-up). Tests only read the folder.
    """
    from turnpool.policies.tiny_llm import build_tiny_model

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    out = root / "tiny-llama-shared"
    with open(root / "tiny-llama-shared.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir():
            building = root / "tiny-llama-building"
            shutil.rmtree(building, ignore_errors=True)  # a build interrupted by a crash
            build_tiny_model(building, sft_steps=100, seed=0)
            building.rename(out)
    return out


@pytest.fixture(scope="module")
def shop_url() -> Iterator[str]:
    """A local WebShop server for the tests that run webshop envs on a pool."""
    from turnpool.webshop.server import ShopServer

    with ShopServer() as server:
        yield server.url
