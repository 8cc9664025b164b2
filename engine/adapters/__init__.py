"""Adapters: the only code that talks to Kafka, RocksDB and other processes."""
