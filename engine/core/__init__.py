"""The pure core: errors, payloads, the history and command model.

Nothing here performs I/O or imports anything outside the standard library, so that
workflow code (and the replay executor) can import it anywhere, including in an auditor's
notebook that has no Kafka at all.
"""
