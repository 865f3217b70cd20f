"""Subcommands of the ``gdncheck`` command line, one module each."""
