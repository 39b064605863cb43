"""Rollouts: a policy plays the envs of a `turnpool.pool.EnvPool` turn by turn.

settings (every settings type, no other turnpool import) · prompts (observation -> chat) ·
projection (text -> actions) · episode (episode state, plan/apply of a turn, the seed
schedule) · collector (the loop, its driver chosen once: lock-step, async or tree) ·
async_driver (generation overlapping env steps) · tree (groups played as trees) · seats
(multi-player games) · sampling (dynamic sampling) · scoring (RAGEN's reward normalization) ·
metrics (a batch's metrics) · trajectory (records and JSONL) · record / replay (every env
transition, kept and re-run).
Config files are read one layer up (`turnpool.ragen.config`); this package never imports a
backend.
"""
