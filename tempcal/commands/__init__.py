"""CLI commands beyond ``fit``, one module each; importing a module registers its command on ``tempcal.cli.app``."""
