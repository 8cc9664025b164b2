"""The Kafka adapters: every module here talks to the broker through confluent-kafka.

``config`` builds client configurations, ``admin`` creates and checks topics, ``io`` is the
transactional read-process-write loop the ``processor`` and ``worker`` loops share;
``client`` carries commands and outcomes for the client, ``history`` reads the history
topic, ``restore`` rebuilds state stores, ``triggers`` runs Kafka-to-workflow triggers, and
the rest (``deadline``, ``delivery``, ``groups``, ``isolation``, ``logs``, ``recovery``)
are the small pieces they share.
"""
