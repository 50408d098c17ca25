"""Commands of the CLI that stand on their own (``sim/cli.py`` registers them): ``kvsim check``,
``kvsim schema``, and what every command counts as bad input."""
