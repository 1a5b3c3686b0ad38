"""Prints the `device` tool's `run` calls that carry a pack (benchmarks/gpu/pack.py) to a lent GPU
machine and check it there, in order: one part a call, the last one also running the check.
The machine stays warm only 30 s after a call, so each call must be the very next action after
the one before returns; the parts and files written under /tmp there are lost once it goes back.

    python3 benchmarks/gpu/calls.py [--pack benchmarks/gpu/pack] [--json]

It also adds up what each call carries (the working tree travels with every call) against the
tool's 64 MiB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CARRY_LIMIT = 64 * 2**20
CHECK = "benchmarks/gpu/check.py"
# A part's call: its sha256 checked and it moved aside, seconds. The last: join, unpack, two
# tritonservers, four load points, ONNX Runtime's own rates, about 3 minutes on an H100.
RECEIVE_TIMEOUT_S = 120
CHECK_TIMEOUT_S = 480


def working_tree_bytes() -> int:
    """What travels with every call besides `carry`: tracked files and untracked ones git does
    not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum((ROOT / f).stat().st_size for f in listed.split("\0") if f and (ROOT / f).is_file())


def calls(pack: Path) -> list[dict[str, Any]]:
    manifest = json.loads((pack / "manifest.json").read_text())
    rel = pack.resolve().relative_to(ROOT)
    out = []
    names = manifest["join"]
    for i, name in enumerate(names):
        command = f"python3 {CHECK} receive {rel / name}"
        last = i == len(names) - 1
        if last:
            command += f" && PYTHONUNBUFFERED=1 python3 {CHECK} run"
        out.append(
            {
                "command": command,
                "carry": [str(rel / "manifest.json"), str(rel / name)],
                "timeout_s": CHECK_TIMEOUT_S if last else RECEIVE_TIMEOUT_S,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pack", type=Path, default=ROOT / "benchmarks" / "gpu" / "pack")
    p.add_argument("--json", action="store_true", help="the calls as one JSON list")
    args = p.parse_args(argv)
    if not (args.pack / "manifest.json").is_file():
        print(f"no pack at {args.pack}: run benchmarks/gpu/pack.py first", file=sys.stderr)
        return 1
    todo = calls(args.pack)
    tree = working_tree_bytes()
    manifest = json.loads((args.pack / "manifest.json").read_text())
    largest = max(q["bytes"] for q in manifest["parts"])
    heaviest = tree + largest + (args.pack / "manifest.json").stat().st_size
    if args.json:
        print(json.dumps(todo, indent=1))
    else:
        print(
            f"# {len(todo)} device calls for {manifest['model_name']} "
            f"({manifest['bundle']['bytes'] / 1e6:.0f} MB in {len(todo)} parts); make each the "
            "very next action after the one before returns (warm 30 s)"
        )
        for i, call in enumerate(todo, 1):
            print(f"{i}. run {json.dumps(call)}")
        print("then give_back; the result is the last call's output and $OUT/gpu-check.json")
    mib = heaviest / 2**20
    print(f"# the heaviest call carries {mib:.1f} MiB of 64 (working tree {tree / 2**20:.1f} MiB)")
    if heaviest > CARRY_LIMIT:
        print(
            "# over the device tool's 64 MiB: pack again with a smaller --part-mb", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
