"""``python -m engine``: the same command line as the ``turnstile`` script."""

from engine.cli.main import main

raise SystemExit(main())
