"""Retry policies for activities.

Retries are decided on the workflow side (not by the workers) so that the backoff is a
durable timer in history: a crashed worker or processor never loses or repeats a decision,
and replay makes exactly the same decision again.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.failure import FailureDetails


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how fast a failed activity attempt is retried.

    ``max_attempts`` counts the first attempt; ``0`` means no limit. The delay before attempt
    ``n + 1`` is ``initial_interval * backoff_coefficient ** (n - 1)`` seconds, capped at
    ``max_interval``. A failure whose type is listed in ``non_retryable_errors`` (or that is
    marked non-retryable, e.g. ``ApplicationError(non_retryable=True)``) is never retried.
    """

    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval: float = 100.0
    non_retryable_errors: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 0:
            raise ValueError("max_attempts must be >= 0 (0 means unlimited)")
        if self.initial_interval < 0 or self.max_interval < 0:
            raise ValueError("retry intervals must be >= 0 seconds")
        if self.backoff_coefficient < 1:
            raise ValueError("backoff_coefficient must be >= 1")
        if isinstance(self.non_retryable_errors, str):
            raise TypeError("non_retryable_errors must be a tuple of type names, not a str")

    def should_retry(self, attempt: int, failure: FailureDetails) -> bool:
        """Whether attempt ``attempt`` (1-based), which failed with ``failure``, is retried."""
        if not failure.retryable or failure.type in self.non_retryable_errors:
            return False
        return self.max_attempts == 0 or attempt < self.max_attempts

    def delay_ms(self, attempt: int) -> int:
        """Backoff in milliseconds before the attempt that follows ``attempt``."""
        try:
            seconds = self.initial_interval * self.backoff_coefficient ** (attempt - 1)
        except OverflowError:
            seconds = self.max_interval
        return round(min(seconds, self.max_interval) * 1000)


NO_RETRY = RetryPolicy(max_attempts=1)
DEFAULT_RETRY = RetryPolicy()
