"""The workflow client's logic, free of Kafka: build commands, read statuses, wait.

``workflow_client.WorkflowClient`` builds and sends each command and keeps the live status
view; ``outcomes`` turns the processor's answer to a command into a value or a typed
error; ``listing`` filters and pages instances; ``bulk`` runs one command over many
instances; ``schedule_client`` manages schedules; ``versions`` counts instances per
workflow version. The public classes are :mod:`engine.client`; the Kafka side is
:mod:`engine.adapters.kafka.client`.
"""
