"""Defaults shared by the pool, the backends, ``turnpool serve`` and the trainers' leases."""

#: Seconds one env may spend on one turn when the caller names no ``step_timeout`` (the pool,
#: ``turnpool serve`` and the trainers' leases all default to it).
DEFAULT_STEP_TIMEOUT = 30.0
#: Seconds a backend may take to start all its workers before the pool gives up on it.
START_TIMEOUT = 120.0
#: The start method of process-based backends when the caller names none: safe when the
#: caller has threads (CUDA, tokenizers), unlike ``fork``.
DEFAULT_MP_CONTEXT = "spawn"
