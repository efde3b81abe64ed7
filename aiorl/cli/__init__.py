"""The `aiorl` command (`aiorl.cli.main`) and its subcommands' parsers."""
