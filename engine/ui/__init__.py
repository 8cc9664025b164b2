"""The web dashboard (``turnstile ui``): instances, their timelines, replicas and lag, dead
letters, and the operator's actions. Needs the ``ui`` extra (Starlette, uvicorn)."""
