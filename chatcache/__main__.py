"""`python -m chatcache`: the `chatcache` command (the cluster starts its replicas this way)."""

from .cli import main

raise SystemExit(main())
