"""Trained intents against nearest examples, on data the settings were not chosen on (issue 40).

Three measurements, each with the nearest-example classifier and the trained model
(`chatcache train`'s: sentence-transformers' trainer, a classification head, a temperature
fitted on held-out examples) on the same rows:
- BANKING77: its training file, a stratified 20% held out (seed 0); the model learns the rest.
- CLINC150: its train list (with `oos_train` as "none of these" for the trained model) ->
  its validation list and `oos_val`.
- The shipped `bank` bot: the BANKING77 rows it does not learn from, and CLINC150's
  out-of-scope queries and its other domains' validation queries as out of scope.

    python -m bench.trained_intents [--data ../shared/data] [--quick]

A stored model is reused when one matches (training is the long part: about 20 min for
BANKING77, 30 for CLINC150 and 8 for the bank bot on 2 quiet cores; see bench/README.md);
`--quick` trains 1 epoch instead of the settings' 3. Results go to
bench/out/trained_intents.json after each measurement, and the reliability diagrams of every
reader to bench/out/trained_intents.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.common import BenchRun, bench_arguments
from chatcache.evals.intents import evaluate, parse_arguments


def measurements(data: Path) -> dict[str, list[str]]:
    """Each measurement's `chatcache eval intents` options, without the reader's."""
    banking, clinc = data / "banking77" / "train.csv", data / "clinc150" / "data_full_train_val.json"
    return {
        "banking77": ["--train", str(banking)],
        "clinc150": ["--train", str(clinc), "--oos-share", str(round(1000 / 5500, 4))],  # its test part's mix
        "bank_bot": ["--bot", "bank", "--train", str(banking), "--oos", str(clinc)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    args = parser.parse_args()
    run = BenchRun("trained_intents", args, minutes=(70, 25))
    curves: dict[str, list[dict[str, Any]]] = {}
    for name, options in measurements(args.data).items():
        both = {}
        for reader, extra in (("nearest", []), ("trained", ["--trained", *(["--epochs", "1"] if args.quick else [])])):
            report = evaluate(parse_arguments([*options, *extra]))
            both[reader] = report
            curves[f"{name}, {reader}"] = report["reliability"]
            run.section(name, both)
    plot(curves, args.out / "trained_intents.png")
    run.finish(plot=str(args.out / "trained_intents.png"))


def plot(curves: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Every reader's reliability diagram in one PNG: the share right against the confidence."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 6))
    axis.plot([0, 1], [0, 1], linestyle=":", color="grey", label="calibrated")
    for label, table in curves.items():
        style = "-" if label.endswith("trained") else "--"
        axis.plot([row["confidence"] for row in table], [row["accuracy"] for row in table], style, marker="o", markersize=3, label=label)
    axis.axvline(0.95, color="red", linewidth=0.6, label="promotion (0.95)")
    axis.set(xlabel="confidence of the verdict", ylabel="share of in-scope verdicts right", xlim=(0, 1), ylim=(0, 1.02))
    axis.set_title("Intent readers' reliability: nearest examples (dashed) and trained (solid)")
    axis.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()
