"""What every engine process is configured with: settings and the topic names and spec.

Plain data and logic (TOML and environment parsing, a pure topic diff), below the services
that use it and free of Kafka."""
