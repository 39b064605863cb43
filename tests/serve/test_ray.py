"""``turnpool serve`` with the pool on a real local Ray cluster bound to 127.0.0.1: sessions
get the same episodes as `turnpool.make`, an env that kills its actor fails only its own
session, and closing the server leaves no actor behind."""

from __future__ import annotations

import os

import pytest  # noqa: E402

import turnpool  # noqa: E402
from tests.faults import wait_gone  # noqa: E402
from tests.ray_cluster import local_ray  # noqa: E402
from tests.serve.conftest import client, expected_failure  # noqa: E402
from turnpool.serve import ServeSettings, TurnpoolServer  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


ray_runtime = pytest.fixture(scope="module", autouse=True)(local_ray)


def test_sessions_on_ray_actors() -> None:
    settings = ServeSettings(env="faulty", env_kwargs={"episode_len": 1000}, max_sessions=4,
                             backend="ray", num_workers=2, step_timeout=5.0)
    server = TurnpoolServer(settings)
    try:
        assert server.engine.pool.backend_name == "ray"
        pids = server.engine.pool.worker_pids()
        assert len(pids) == 2 and os.getpid() not in pids
        want = turnpool.make("faulty", episode_len=1000)
        first, _ = want.reset(seed=21)
        # clients connect on first use: good takes slot 0, bad slot 1, both on actor 0
        with client(server.url) as bad, client(server.url) as good:
            assert good.reset(seed=21).observation["text"] == first
            bad.reset(seed=3)
            with pytest.raises(RuntimeError) as err:
                bad.step({"action": "exit"})
            assert expected_failure("worker_lost") in str(err.value)
            for k in range(3):
                assert good.step({"action": f"a{k}"}).observation["text"] == \
                    want.step(f"a{k}")[0]
            assert bad.reset(seed=3).observation["text"]
        pids = server.engine.pool.worker_pids()
    finally:
        server.stop()
    assert wait_gone(pids, 30.0) == []
