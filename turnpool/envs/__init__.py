"""Text environments and their registry."""

from turnpool.envs.base import TextEnv
from turnpool.envs.registry import EnvSpec, make, register, registered, resolve

__all__ = ["EnvSpec", "TextEnv", "make", "register", "registered", "resolve"]
