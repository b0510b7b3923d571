"""``plasticlm report RUN_DIR``: a run folder as one self-contained HTML page (and Markdown),
in ``RUN_DIR/report/``, a marked folder of its own."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a run folder's tables, plots, config and "
                       "provenance as one HTML page",
                       description="Write RUN_DIR/report/index.html (self-contained: plots "
                       "embedded) and RUN_DIR/report/index.md with every table and plot the run "
                       "wrote, its config.json, the package versions, the commit and its times. "
                       "RUN_DIR/report/ holds plasticlm's marker: a folder of that name that "
                       "plasticlm did not write is refused, and no other file is touched. The "
                       "demo and every experiment write it themselves at the end.")
    p.add_argument("run_dir", help="a folder a command wrote, e.g. runs/demo")
    p.add_argument("--tensorboard", nargs="?", const="", default=None, metavar="LOGDIR",
                   help="also write every metrics.jsonl under RUN_DIR as TensorBoard scalars "
                   "(default LOGDIR: RUN_DIR/tensorboard; needs the tensorboard package)")
    p.set_defaults(func=_report)


def _report(args) -> int:
    from plasticlm.outputs import check_output
    from plasticlm.run_report import write_report

    if args.tensorboard:   # refused before the report is written
        check_output(args.tensorboard, "give another --tensorboard LOGDIR")
    page, _ = write_report(args.run_dir)
    print(f"report: {page}")
    if args.tensorboard is not None:
        from plasticlm.tensorboard_export import export_tensorboard

        logdir, n = export_tensorboard(args.run_dir, args.tensorboard or None)
        print(f"tensorboard: {n} scalars in {logdir} (tensorboard --logdir {logdir})")
    return 0
