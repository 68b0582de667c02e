"""One module per ``robofleet`` subcommand, each with ``main(argv) -> int`` (see ``robofleet.cli``)."""
