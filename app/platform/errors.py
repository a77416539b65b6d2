"""Domain errors raised by services; the web layer maps them to HTTP answers in one place."""

from __future__ import annotations


class DomainError(Exception):
    status_code = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def detail(self) -> list[dict[str, object]]:
        item: dict[str, object] = {"message": self.message}
        if self.field:
            item["field"] = self.field
        return [item]


class NotFound(DomainError):
    """The object does not exist or the caller may not see it (the two are indistinguishable on purpose)."""

    status_code = 404


class Forbidden(DomainError):
    status_code = 403


class Conflict(DomainError):
    status_code = 409


class Invalid(DomainError):
    status_code = 422


class TooManyAttempts(DomainError):
    status_code = 429

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after
