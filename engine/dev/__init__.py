"""Tools for development and tests only (the local Apache Kafka broker launcher); nothing on
the production path imports this package."""
