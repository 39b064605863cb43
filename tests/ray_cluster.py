"""The one local Ray cluster every Ray test module uses: loopback only, 2 CPUs, no dashboard,
a small object store, no usage stats (tests/conftest.py sets Ray's environment before any test
module imports ``ray``; this module sets it too, for a direct import). Bind the fixture once
per module::

    ray_runtime = pytest.fixture(scope="module", autouse=True)(local_ray)
"""

from __future__ import annotations

import os
from collections.abc import Iterator

for _key, _value in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
                     "RAY_USAGE_STATS_ENABLED": "0"}.items():
    os.environ.setdefault(_key, _value)


def local_ray() -> Iterator[None]:
    """Start the module's cluster (shutting down one left by another module, whose settings
    may differ) and stop it after the module."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    # "local": its own runtime, never a cluster another test module started meanwhile
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20,
             log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
