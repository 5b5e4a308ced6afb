"""What the command line checks before reading anything (options, model detection, validation) needs no torch."""

from __future__ import annotations

import subprocess
import sys


def test_what_the_cli_checks_before_reading_stays_torch_and_numpy_free():
    """Options, model detection and validation are checked without slowing ``tempcal --help``."""
    code = ("import sys, tempcal.cli.options, tempcal.models.detect, tempcal.validation\n"
            "assert not {'torch', 'numpy'} & set(sys.modules), sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
