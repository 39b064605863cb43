"""Sessions (and branches) spread over the nodes of a Ray cluster: a real two-node local cluster
(``ray.cluster_utils.Cluster``: two raylets on 127.0.0.1), a pool whose actors the ``SPREAD``
default puts on both nodes, and a ``turnpool serve`` over it whose sessions land on both,
each playing exactly the episode `turnpool.make` plays."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

import tests.ray_cluster  # noqa: F401  (Ray's environment for tests)
import turnpool
from tests.serve.conftest import client
from tests.traces import branch_pool, branch_trace
from turnpool.pool import EnvPool
from turnpool.serve import ServeSettings, TurnpoolServer

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20, "include_dashboard": False}


@pytest.fixture(scope="module", autouse=True)
def two_nodes() -> Iterator[list[str]]:
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "node_ip_address":
                                                            "127.0.0.1"})
    try:
        cluster.add_node(**{**NODE, "node_ip_address": "127.0.0.1"})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        assert len(nodes) == 2
        yield nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_the_pool_spreads_its_actors_over_the_nodes(two_nodes: list[str]) -> None:
    with EnvPool("sokoban", env_num=8, group_n=1, seed=5, backend="ray", num_workers=4) as pool:
        nodes = pool.backend.worker_nodes()
        assert set(nodes) == set(two_nodes)
        assert sorted(Counter(nodes).values()) == [2, 2]
        obs, _ = pool.reset(seed=5)
    want = [turnpool.make("sokoban").reset(seed=5 + i)[0] for i in range(8)]
    assert obs == want


def test_branches_across_nodes_continue_as_their_source(two_nodes: list[str],
                                                        shop_url: str) -> None:
    """Each env type's four members straddle actors on both nodes; forks and restores
    between them continue as their source, and as in-process."""
    with branch_pool(shop_url, backend="sequential") as pool:
        want = branch_trace(pool)
    with branch_pool(shop_url, backend="ray", num_workers=4) as pool:
        assert set(pool.backend.worker_nodes()) == set(two_nodes)
        assert any(len({pool.owner_of(i + k) for k in range(4)}) > 1
                   for i in range(0, pool.num_envs, 4))
        assert branch_trace(pool) == want


def test_served_sessions_land_on_both_nodes(two_nodes: list[str]) -> None:
    settings = ServeSettings(env="sokoban", max_sessions=4, backend="ray", num_workers=2,
                             step_timeout=10.0)
    with TurnpoolServer(settings) as server:
        assert set(server.engine.pool.backend.worker_nodes()) == set(two_nodes)
        want = turnpool.make("sokoban")
        with client(server.url) as a, client(server.url) as b:
            for env, seed in ((a, 11), (b, 12)):
                first, _ = want.reset(seed=seed)
                assert env.reset(seed=seed).observation["text"] == first
                for action in ("Up", "Left"):
                    assert env.step({"action": action}).observation["text"] == \
                        want.step(action)[0]
            workers = httpx.get(server.url + "/api/status", timeout=30).json()["workers"]
            assert {w["node"] for w in workers if w["sessions"] == 1} == set(two_nodes)


_OWN_RUNTIME = """
import json
from turnpool.pool import EnvPool
with EnvPool("frozen_lake", env_num=2, group_n=2, seed=3, backend="ray", num_workers=2) as pool:
    print(json.dumps([pool.reset(), pool.step([1, 2, 3, 4])]))
"""


def test_a_pool_without_an_address_starts_its_own_runtime_beside_a_cluster(
        two_nodes: list[str]) -> None:
    """This cluster is the machine's latest (what Ray joins when given no address, and then
    refuses the pool's own settings): a pool given no ``ray_address`` in another process
    starts a runtime of its own and plays what the sequential backend plays."""
    proc = subprocess.run([sys.executable, "-c", _OWN_RUNTIME], capture_output=True, text=True,
                          timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with EnvPool("frozen_lake", env_num=2, group_n=2, seed=3, backend="sequential") as ref:
        want = [ref.reset(), ref.step([1, 2, 3, 4])]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == json.loads(json.dumps(want))
