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

    ``jitter`` shortens each delay by up to that fraction of itself (``0.2``: a delay of
    10 s becomes one between 8 and 10 s), so that the instances a shared outage failed
    at the same moment do not retry in lockstep; ``0`` turns it off. The fraction drawn
    comes from the instance's seed (instance id, generation, task id and attempt), so a
    replay computes the same delay, and the recorded timer stays in force anyway.
    """

    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval: float = 100.0
    non_retryable_errors: tuple[str, ...] = ()
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.max_attempts < 0:
            raise ValueError("max_attempts must be >= 0 (0 means unlimited)")
        if self.initial_interval < 0 or self.max_interval < 0:
            raise ValueError("retry intervals must be >= 0 seconds")
        if self.backoff_coefficient < 1:
            raise ValueError("backoff_coefficient must be >= 1")
        if isinstance(self.non_retryable_errors, str):
            raise TypeError("non_retryable_errors must be a tuple of type names, not a str")
        if isinstance(self.jitter, bool):
            raise TypeError("jitter is a fraction between 0 and 1 (0 turns it off), not a bool")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1 (a fraction of each delay)")

    def should_retry(self, attempt: int, failure: FailureDetails) -> bool:
        """Whether attempt ``attempt`` (1-based), which failed with ``failure``, is retried."""
        if not failure.retryable or failure.type in self.non_retryable_errors:
            return False
        return self.max_attempts == 0 or attempt < self.max_attempts

    def delay_ms(self, attempt: int, draw: float = 0.0) -> int:
        """Backoff in milliseconds before the attempt that follows ``attempt``; ``draw``
        (in ``[0, 1)``, from the instance's seed) picks how much ``jitter`` takes off."""
        try:
            seconds = self.initial_interval * self.backoff_coefficient ** (attempt - 1)
        except OverflowError:
            seconds = self.max_interval
        return round(min(seconds, self.max_interval) * (1 - self.jitter * draw) * 1000)


NO_RETRY = RetryPolicy(max_attempts=1)
DEFAULT_RETRY = RetryPolicy()
