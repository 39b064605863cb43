"""RAGEN compatibility: its YAML config and its classes, as thin facades over `turnpool.rollout`.

RAGEN users keep their configs and the names they know (`EnvStateManager`,
`ParallelRolloutManager`, `MultiProcessEnvironmentContainer`, `create_projection_function`);
each is a small wrapper over the one implementation in `turnpool.pool` and `turnpool.rollout`.
`ParallelRolloutManager` runs the collector; `EnvStateManager` keeps RAGEN's own step contract
(actions parsed by RAGEN's context manager, RAGEN's rollout cache) over an `EnvPool`.
The seed documents' vocabulary ("seed 000/001/002") lives only here and in the docs. Only
`turnpool.cli` and this package import it.
"""
