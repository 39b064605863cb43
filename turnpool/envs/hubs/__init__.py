"""Adapters for other libraries' envs, one module per library (``gem``, ``rg``, ``skyrl``,
``textarena``, ``verifiers``), each a `turnpool.envs.hubs.base.HubEnv`. The table that names
them (prefix, library, extra, adapter) is `turnpool.envs.hub_table`, which the registry reads;
nothing here is imported until a library env is built."""
