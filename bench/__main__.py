"""`python -m bench --size small|default`: run the benchmark, print the table, write the results.

make bench SIZE=small            # ~100 meters x 30 days, a few minutes (CI)
python -m bench --size default   # 1,000 meters x 365 days (35 M readings)
"""

import argparse
import dataclasses
import logging
import shlex
import sys
import warnings
from pathlib import Path

from bench.context import SIZES

HERE = Path(__file__).parent


SCENARIOS = ("backfill", "writers", "correction", "read", "surface", "scaling", "daemon")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="default")
    parser.add_argument("--out", type=Path, default=HERE / "results.json", help="results JSON")
    parser.add_argument(
        "--work", type=Path, default=HERE / ".work", help="scratch directory (removed at the end)"
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of {','.join(SCENARIOS)} (backfill always runs, but for "
        "surface alone)",
    )
    parser.add_argument("--no-daemon", action="store_true", help="skip the real-daemon run")
    parser.add_argument("--meters", type=int, help="override the size's meter count")
    parser.add_argument("--days", type=int, help="override the size's archive days")
    parser.add_argument("--late-counts", help="override the late-reading counts, e.g. 1,100")
    parser.add_argument("--scaling-days", help="override the scaling archives' days, e.g. 7,30")
    parser.add_argument("--repeats", type=int, help="one-reading corrections per archive")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    chosen = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    if args.no_daemon:
        chosen = tuple(s for s in chosen if s != "daemon")
    # Dagster's preview/beta notices and per-step logs would bury the progress lines.
    warnings.filterwarnings("ignore", module="dagster")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*(beta|preview).*")
    logging.basicConfig(level=logging.WARNING)
    from bench.run import run  # after the filters: importing it builds the definitions

    size = SIZES[args.size]
    overrides = {
        "meters": args.meters,
        "days": args.days,
        "late_counts": _ints(args.late_counts),
        "scaling_days": _ints(args.scaling_days),
        "repeats": args.repeats,
    }
    size = dataclasses.replace(size, **{k: v for k, v in overrides.items() if v is not None})
    if min(size.days, *size.scaling_days) < 5:
        # Late readings land before the ISO week still open at the end (3 days + 1 h).
        parser.error("archives need at least 5 days")
    if 1 not in size.late_counts:
        parser.error("--late-counts must include 1 (the goals are judged on one late reading)")
    command = shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    run(args.size, size, args.out.resolve(), args.work.resolve(), chosen, args.keep, command)
    return 0


def _ints(text: str | None) -> tuple[int, ...] | None:
    return None if not text else tuple(int(x) for x in text.split(",") if x.strip())


if __name__ == "__main__":
    sys.exit(main())
