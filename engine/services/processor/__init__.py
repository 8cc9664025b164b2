"""The processor's turn logic: a closed, sans-I/O state machine per partition.

``partition.PartitionProcessor`` is the state machine; ``batch.Batch`` collects what one
batch decided; ``inputs`` validates records; ``handlers`` (one per inbound record kind) and
``outcome`` (one per outbound action) write into the batch; ``tables`` and ``keys`` lay out
the store; ``protocol`` names the steps every loop runs. Nothing here does I/O.
"""
