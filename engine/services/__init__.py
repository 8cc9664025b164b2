"""Services: the processor, the activity worker, the client and replay/audit.

Services talk to Kafka and RocksDB only through the small ports they define; the adapters
implement those ports and the CLI wires them together.
"""
