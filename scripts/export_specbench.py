"""Export a run's answers in Spec-Bench's format, for Spec-Bench's own ``evaluation/speed.py``.

    python scripts/export_specbench.py results/runs/specbench/vicuna_7b/spec_bench/lookahead/default
    python scripts/export_specbench.py RUN_DIR --out answers/
    python evaluation/speed.py --file-path answers/<model>-<method>.jsonl --base-path answers/<model>-vanilla.jsonl \\
        --tokenizer-path <model>                                                 # in a Spec-Bench checkout

Writes the method's answer file and its baseline's (vanilla, timed beside the method) as Spec-Bench's
``evaluation/eval.py`` writes them; see :mod:`fafo.bench.specbench_export` for the format and what differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fafo.bench.specbench_export import export  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="a run directory (samples.csv + outputs.jsonl)")
    ap.add_argument("--out", help="output directory (default: RUN_DIR/specbench)")
    args = ap.parse_args(argv)
    try:
        done = export(args.run_dir, args.out)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"wrote {done['method']} and {done['baseline']} ({done['questions']} questions)")
    if done["skipped"]:
        print(f"note: {len(done['skipped'])} questions with a failed turn left out: "
              f"{', '.join(done['skipped'][:10])}", file=sys.stderr)
    if done["not_exact"]:
        print(f"note: {done['not_exact']} baseline answers carry the method's text (vanilla's was not stored; "
              "see fafo_note): speed.py re-tokenizes the baseline's text", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
