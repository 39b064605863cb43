"""The worker floor: everything that runs on the worker's side of the wire, on every backend.

``protocol.py`` (the wire: `Op`, the op table `OPS`, request records, reply payloads, the
codec), ``results.py`` (`TurnResult`, `ResetResult`, `StateResult`), ``failures.py`` (the
`Failure` classes), ``errors.py`` (backend exceptions, bounded error texts), ``build.py``
(`EnvBuild`, env placement), ``defaults.py`` (default deadlines), ``host.py`` (`EnvHost`, the
one place env code runs), ``deadline.py`` (in-process deadlines), ``handoff.py`` (a process
worker's request loop with hand-off) and ``transport.py`` (the serve loop, `encode`, the
progress slot and the parent watch of workers in other processes). This floor imports only
``envs`` and ``sandbox`` (for the sandbox's failure class); the backends stand on it and the
pool stands on the backends.
"""
