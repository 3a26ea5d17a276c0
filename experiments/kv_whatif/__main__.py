"""python -m experiments.kv_whatif RUN_DIR [--out DIR] [--no-plot]: see experiments.kv_whatif."""

import argparse
import json

from experiments.kv_whatif import analyze


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.kv_whatif", description=__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("--out", default=None, help="where whatif.json / whatif_curve.csv / whatif.png go (the run)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    print(json.dumps(analyze(args.run_dir, args.out, plot=not args.no_plot), indent=2))


if __name__ == "__main__":
    main()
