"""Make the confidence-table example: a verbalised-confidence evaluation of 400 questions, for ``tempcal fit``.

Each question's true chance of being answered right is ``sigmoid(z)``, ``z ~ N(0.4, 1.5^2)`` (seeded); the model
states the overconfident ``sigmoid(2 z)`` as a percentage (rounded to whole percents, as models state them, so
some say 0 or 100), and ``correct`` (true/false) is drawn from the true chance. Columns: ``id``, ``subject`` (three
subjects, for ``--group-by subject``), ``confidence`` (percent) and ``correct``. The same bytes on every rerun.

Run: ``python examples/make_confidence_table.py [OUTPUT]`` (default: confidence_table.csv next to this script).
"""

import argparse
import csv
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SUBJECTS = ("algebra", "biology", "history")
ROWS = 400
SEED = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", default=str(HERE / "confidence_table.csv"))
    output = Path(parser.parse_args().output)
    rng = np.random.default_rng(SEED)
    z = rng.normal(0.4, 1.5, ROWS)
    stated = np.round(100 / (1 + np.exp(-2 * z))).astype(int)
    correct = rng.uniform(size=ROWS) < 1 / (1 + np.exp(-z))
    with open(output, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["id", "subject", "confidence", "correct"])
        for i in range(ROWS):
            writer.writerow([f"q{i:03d}", SUBJECTS[i % 3], int(stated[i]), "true" if correct[i] else "false"])
    print(f"wrote {output}: {ROWS} rows, {int(correct.sum())} answered right")


if __name__ == "__main__":
    main()
