"""Sample workflows shipped with the engine: the demo's order process and the benchmark's
chain3. They use only the public ``engine`` API, exactly as user code would."""
