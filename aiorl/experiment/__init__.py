"""An experiment as a user states it: a config loaded with its algorithm (`loading`), the checks
before a local run starts (`preflight`), roles started by hand (`by_hand`) and the config
reference (`reference`)."""
