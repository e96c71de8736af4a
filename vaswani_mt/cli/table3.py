"""Table 3 of the paper as runnable variants: train and score chosen rows at a chosen scale
(vaswani_mt.training.table3).

    python scripts/table3.py --rows base,A-h1,A-h4,A-h16,E-learned,D-drop0 --scale cpu
    python scripts/table3.py --rows A --scale paper --launcher "accelerate launch --multi_gpu --num_processes 8"
    python scripts/table3.py --rows all --scale cpu --list                 # what each row changes at that scale
    python scripts/table3.py --rows base,C-N2 --scale cpu --time_budget_minutes 2 --output_dir outputs/t3-short

--scale is `paper` (configs/wmt14_en_de_base.yaml), `cpu` (configs/table3_cpu.yaml) or a training config file;
every other option is a scripts/train.py option for all rows (the row's own options win). The rows are the files of
configs/table3/ (`A-h1`, `C-N2`, `E-learned`, ...; a group letter selects the whole group).
"""

import argparse
import logging
import sys

from vaswani_mt.cli import names_missing_extras, start_command


@names_missing_extras
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)  # fmt: skip
    parser.add_argument("--rows", default="all", help="comma-separated row names or group letters; default: all")
    parser.add_argument("--scale", default="cpu", help="paper, big, cpu, or a training config file (default: cpu)")
    parser.add_argument("--output_dir", default=None, help="one folder per row in here (default: outputs/table3-SCALE)")
    parser.add_argument("--rows_dir", default=None, help="the row files (default: configs/table3)")
    parser.add_argument(
        "--launcher",
        default=None,
        help='train each row as "LAUNCHER -m vaswani_mt.cli.train ..." (accelerate launch, torchrun)',
    )
    parser.add_argument("--retrain", action="store_true", help="train rows whose folder already holds a run")
    parser.add_argument("--list", action="store_true", help="print what each row changes at this scale and stop")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    start_command()  # rows trained here; a --launcher row runs vaswani_mt.cli.train, which calls it too
    from vaswani_mt.training.table3 import ROWS_DIR, describe_rows, markdown_table, run_table

    rows_dir = args.rows_dir or str(ROWS_DIR)
    try:
        if args.list:
            print(describe_rows(args.rows, args.scale, overrides, rows_dir))
            return
        output_dir = args.output_dir or f"outputs/table3-{args.scale if args.scale.isidentifier() else 'custom'}"
        rows = run_table(args.rows, args.scale, overrides, output_dir, rows_dir, args.launcher, args.retrain)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    print("\n" + markdown_table(rows))
    print(f"\n{output_dir}/table3.md, {output_dir}/table3.json")


if __name__ == "__main__":
    main()
