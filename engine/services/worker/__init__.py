"""The activity worker's logic, free of Kafka: which tasks to run, how, and what to commit.

``worker.Worker`` decides what to produce and which offsets are safe to commit;
``runner.ActivityRunner`` runs one attempt (``threads`` for plain and async activities,
``processes`` for ``process=True`` ones, ``timeouts`` for the clocks, ``attempts`` for one
attempt's bookkeeping); ``offsets`` tracks the lowest unsettled task per partition;
``queue_limits`` holds the per-queue concurrency limits and ``attempt_spans`` the tracing
spans of attempts. The Kafka loop that drives it is :mod:`engine.adapters.kafka.worker`.
"""
