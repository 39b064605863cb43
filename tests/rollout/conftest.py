"""Rollout tests that drive an LLM policy share the policies' tiny model fixture."""

from tests.policies.conftest import tiny_model_dir

__all__ = ["tiny_model_dir"]
