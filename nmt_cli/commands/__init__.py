"""The `nmt` subcommands, a module each (bpe.py: learn-bpe and apply-bpe), and their shared
click helpers (model_options.py, outcome.py): click parses, builds a typed config, calls
the library."""
