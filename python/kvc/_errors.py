"""kvc's exception type (kept apart so the extension module can raise it)."""

from __future__ import annotations


class Error(RuntimeError):
    """An error kvc reported: its text, and its status code's name.

    ``code`` is one of ``invalid_argument``, ``not_found``, ``data_loss``,
    ``failed_precondition``, ``unavailable``, ``unimplemented`` or
    ``internal``.
    """

    def __init__(self, message: str, code: str = "internal") -> None:
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.args[0]}"
