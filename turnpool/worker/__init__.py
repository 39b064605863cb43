"""The worker floor: everything that runs on the worker's side of the wire, on every backend.

``protocol.py`` (the messages: `Op`, requests, replies, `TurnResult`, failure classes, the
default deadlines), ``host.py`` (`EnvHost`, the one place env code runs), ``deadline.py``
(in-process deadlines) and ``transport.py`` (the serve loop, `encode`, the progress slot and
the parent watch of workers in other processes). This floor imports only ``envs``; the
backends stand on it and the pool stands on the backends.
"""
