#!/usr/bin/env python3
"""A/B of environment switches on `kiln bench`, alternating runs of one binary.

Runs `kiln bench ARGS` under setting A, then B, ROUNDS times (A B A B ...: drift of the
machine hits both alike), reads the time column of every table row each run prints
(`ms`, `ms per forward`: the column whose header starts with "ms"), and prints per row
the median and range over the rounds of each side and B / A. One decision per table:
a switch's default changes only when the ranges do not overlap.

  bench/ab.py --a "KILN_CUDA_PDL=1" --b "KILN_CUDA_PDL=all" --rounds 3 -- \\
      build/tools/kiln/kiln bench --backend cuda --weight-dtype bf16 \\
      --random-weights bench/configs/llama-3.2-1b.json -p 512 -n 4 -r 3

Settings are space-separated NAME=VALUE pairs added to the environment (empty: none).
Exits 1 when a run fails or prints no table row, naming the setting and the round.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys


def parse_env(setting):
    env = {}
    for pair in setting.split():
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"ab.py: '{pair}' in '{setting}' is not NAME=VALUE")
        env[name] = value
    return env


def table_times(text):
    """{row key: ms} for every markdown table row under a header with an `ms...` column."""
    out = {}
    ms_col = None
    key_cols = 0
    for line in text.splitlines():
        if not line.startswith("|"):
            ms_col = None if not line.strip() else ms_col
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(re.fullmatch(r":?-+:?", c) for c in cells if c):
            continue  # the separator row
        heads = [c.lower() for c in cells]
        ms = [i for i, h in enumerate(heads) if h.startswith("ms")]
        if ms and not re.match(r"^[\d.]+", cells[ms[0]]):
            ms_col = ms[0]
            # The row's key: the columns before the first rate or time column.
            key_cols = next((i for i, h in enumerate(heads) if "/s" in h or h.startswith("ms")), ms_col)
            continue
        if ms_col is None or ms_col >= len(cells):
            continue
        m = re.match(r"^([\d.]+)", cells[ms_col])
        if not m:
            continue
        out[" ".join(cells[:key_cols])] = float(m.group(1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="setting A: NAME=VALUE pairs")
    ap.add_argument("--b", required=True, help="setting B: NAME=VALUE pairs")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each setting (default 3)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the kiln bench command")
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command after --")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    sides = {"A": (args.a, parse_env(args.a)), "B": (args.b, parse_env(args.b))}
    times = {"A": {}, "B": {}}
    for r in range(args.rounds):
        for side in ("A", "B"):
            setting, extra = sides[side]
            run = subprocess.run(cmd, env={**os.environ, **extra}, capture_output=True, text=True)
            if run.returncode != 0:
                sys.stderr.write(run.stdout + run.stderr)
                sys.exit(f"ab.py: {side} ('{setting}') round {r + 1} exited with {run.returncode}")
            rows = table_times(run.stdout)
            if not rows:
                sys.stderr.write(run.stdout)
                sys.exit(f"ab.py: {side} ('{setting}') round {r + 1} printed no table row with an ms column")
            for key, ms in rows.items():
                times[side].setdefault(key, []).append(ms)
    print(f"A: {args.a or '(none)'}\nB: {args.b or '(none)'}\nrounds: {args.rounds}, alternating\n")
    print("| row | A ms, median (min-max) | B ms, median (min-max) | B / A |")
    print("|---|---|---|---|")
    for key, a in times["A"].items():
        b = times["B"].get(key)
        if not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        apart = max(a) < min(b) or max(b) < min(a)
        ratio = f"{mb / ma:.3f}" if ma > 0 else "-"
        print(f"| {key} | {ma:g} ({min(a):g}-{max(a):g}) | {mb:g} ({min(b):g}-{max(b):g}) | "
              f"{ratio}{'' if apart else ' (ranges overlap)'} |")


if __name__ == "__main__":
    main()
