"""The ``mplang`` command (`mplang.cli.main`, run by ``python -m mplang.cli`` too): one
module per command group beside it (`run`, `trace`, `apidoc`), and the live progress
display a terminal shows during ``mplang up`` and long ``mp.evaluate`` runs
(`progress`). Nothing is imported here: `mplang.api` loads the progress display
without the command line."""
