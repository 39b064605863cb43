"""The one error type of ``turnpool serve``'s protocols (OpenEnv's wire protocol and MCP)."""

from __future__ import annotations

from typing import Any


class ProtocolError(Exception):
    """A client message the server refuses: ``code`` is an OpenEnv ``WSErrorCode`` value."""

    def __init__(self, code: str, message: str, status: int = 400,
                 **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.extra = extra

    def data(self) -> dict[str, Any]:
        return {"message": self.message, "code": self.code, **self.extra}
