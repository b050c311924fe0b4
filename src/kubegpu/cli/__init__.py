"""The ``kubegpu`` command line: one subcommand per role."""
