"""Bridges from other stream-processing libraries to the engine's topics.

Each module here imports its library only when it is itself imported, and none is on the
processor's exactly-once path: they let other applications start workflows, raise events
and read status and command outcomes as ordinary records of those topics.
"""
