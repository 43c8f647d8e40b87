#!/usr/bin/env python3
"""A/B of environment switches (or of command-line flags) on `kiln bench`, alternating runs.

Runs `kiln bench ARGS` under setting A, then B, ROUNDS times (A B A B ...: drift of the
machine hits both alike), reads the time column of every table row each run prints
(`ms`, `ms per forward`: the column whose header starts with "ms"), and prints per row
the median and range over the rounds of each side, B / A, and A / B paired round by round
(each round's two runs back to back: the ratio the drift disturbs least). One decision
per table: a switch's default changes only when the ranges do not overlap.

  bench/ab.py --a "KILN_CUDA_PDL=1" --b "KILN_CUDA_PDL=all" --rounds 3 -- \\
      build/tools/kiln/kiln bench --backend cuda --weight-dtype bf16 \\
      --random-weights bench/configs/llama-3.2-1b.json -p 512 -n 4 -r 3

  bench/ab.py --a "" --b "" --a-args="--weight-dtype bf16" --b-args="--quant fp8" -- \\
      build/tools/kiln/kiln bench --backend cuda \\
      --random-weights bench/configs/llama-3.1-8b.json -p 2048 -n 4 -r 3

Settings are space-separated NAME=VALUE pairs added to the environment (empty: none);
--a-args= / --b-args= (with "=": their values start with "--") are appended to the
command on that side, split into shell words.
Exits 1 when a run fails or prints no table row, naming the setting and the round.
"""
import argparse
import os
import re
import shlex
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
    ap.add_argument("--a-args", default="", help="arguments appended to the command for A")
    ap.add_argument("--b-args", default="", help="arguments appended to the command for B")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each setting (default 3)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the kiln bench command")
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command after --")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    sides = {"A": (args.a, parse_env(args.a), shlex.split(args.a_args)),
             "B": (args.b, parse_env(args.b), shlex.split(args.b_args))}
    times = {"A": {}, "B": {}}
    for r in range(args.rounds):
        for side in ("A", "B"):
            setting, extra, more = sides[side]
            setting = " ".join(x for x in (setting, " ".join(more)) if x)
            run = subprocess.run(cmd + more, env={**os.environ, **extra}, capture_output=True, text=True)
            if run.returncode != 0:
                sys.stderr.write(run.stdout + run.stderr)
                sys.exit(f"ab.py: {side} ('{setting}') round {r + 1} exited with {run.returncode}")
            rows = table_times(run.stdout)
            if not rows:
                sys.stderr.write(run.stdout)
                sys.exit(f"ab.py: {side} ('{setting}') round {r + 1} printed no table row with an ms column")
            for key, ms in rows.items():
                times[side].setdefault(key, []).append(ms)
    def side_text(env, more):
        return " ".join(x for x in (env, more) if x) or "(none)"
    print(f"A: {side_text(args.a, args.a_args)}\nB: {side_text(args.b, args.b_args)}\n"
          f"rounds: {args.rounds}, alternating\n")
    print("| row | A ms, median (min-max) | B ms, median (min-max) | B / A | A / B paired, median (min-max) |")
    print("|---|---|---|---|---|")
    for key, a in times["A"].items():
        b = times["B"].get(key)
        if not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        apart = max(a) < min(b) or max(b) < min(a)
        ratio = f"{mb / ma:.3f}" if ma > 0 else "-"
        paired = [x / y for x, y in zip(a, b) if y > 0]
        pair = (f"{statistics.median(paired):.3f} ({min(paired):.3f}-{max(paired):.3f})" if paired else "-")
        print(f"| {key} | {ma:g} ({min(a):g}-{max(a):g}) | {mb:g} ({min(b):g}-{max(b):g}) | "
              f"{ratio}{'' if apart else ' (ranges overlap)'} | {pair} |")


if __name__ == "__main__":
    main()
