"""Arguments shared by the CLI tests: a small FrozenLake rollout on the sequential backend."""

SMALL_LAKE = ["es_manager.train.env_groups=2", "es_manager.train.env_configs.n_groups=[2]",
              "es_manager.train.group_size=4", "es_manager.train.env_configs.tags=[FrozenLake]",
              "turnpool.backend=sequential"]
