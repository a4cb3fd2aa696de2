"""Full-jitter exponential backoff and a per-tool circuit breaker."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from callgate_sdk.models import RetryPolicy


def backoff_delay(
    n: int,
    policy: RetryPolicy,
    rand: Callable[[float, float], float] = random.uniform,
) -> float:
    """Full-jitter exponential backoff for the ``n``-th retry (``n`` from 0), in seconds:
    ``uniform(0, min(maximum_interval, initial_interval * backoff_coefficient ** n))``
    (AWS Architecture Blog, "Exponential Backoff and Jitter")."""
    cap = min(
        policy.maximum_interval, policy.initial_interval * policy.backoff_coefficient ** max(n, 0)
    )
    return rand(0.0, cap)


class CircuitBreaker:
    """One tool's circuit breaker: closed → open after ``failure_threshold`` consecutive
    failures; open for ``cooldown`` seconds; then half-open: one trial call, which closes
    the circuit on success or opens it again on failure. Thread-safe."""

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.failure_threshold = failure_threshold
        self.cooldown = cooldown
        self.clock = clock
        self._state = self.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_running = False
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        with self._lock:
            if self._state == self.OPEN and self.clock() - self._opened_at >= self.cooldown:
                return self.HALF_OPEN
            return self._state

    def allow(self) -> bool:
        """True when a call may go out now (closed, or the single half-open trial)."""
        with self._lock:
            if self._state == self.CLOSED:
                return True
            if self._state == self.OPEN:
                if self.clock() - self._opened_at < self.cooldown:
                    return False
                self._state = self.HALF_OPEN
                self._trial_running = False
            if self._trial_running:
                return False
            self._trial_running = True
            return True

    def record_success(self) -> None:
        with self._lock:
            self._state, self._failures, self._trial_running = self.CLOSED, 0, False

    def record_failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._state == self.HALF_OPEN or self._failures >= self.failure_threshold:
                self._state, self._opened_at, self._trial_running = self.OPEN, self.clock(), False

    def retry_after(self) -> float:
        """Seconds until the breaker lets a trial through (0 when it would now)."""
        with self._lock:
            if self._state != self.OPEN:
                return 0.0
            return max(0.0, self.cooldown - (self.clock() - self._opened_at))
