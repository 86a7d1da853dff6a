"""One module per `nmt` subcommand: click parses, builds a typed config, calls the library."""
