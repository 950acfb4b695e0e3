"""``python -m mplang.cli``: the ``mplang`` command."""

from mplang.cli.main import main

raise SystemExit(main())
