"""The benchmarks as charts for the docs, from the JSON records they write:

- the served-runtimes benchmark (benchmarks/served_runtimes.py) as a bar chart: texts/s of each
  release, served and in-process, and infinity-emb, one panel per run (medians of the rounds,
  as its ratios are);
- the text-generation benchmark (benchmarks/generation.py, `--generation RECORD`): generated
  tokens/s and time to first token p50 against concurrent streams, one line per way;
- what a release costs by model size (benchmarks/generation_release.py, `--release-costs
  RECORD ...`): the release's wall time and its peak memory (summed anonymous and resident)
  against the model's fp32 weights, with the goals of issue 46 (60 minutes at 1.7B; 2 GB + 2x
  the fp32 weights), the newest run of each shape.

    .venv/bin/python benchmarks/chart.py [RESULT.json ...] [--output docs/served-runtimes.svg]
    .venv/bin/python benchmarks/chart.py --generation RECORD.json --output docs/generation.svg
    .venv/bin/python benchmarks/chart.py --release-costs RECORD.json ... \
        --output docs/release-costs.svg

Without RESULT files it draws every benchmarks/results/runtimes-*.json. The SVG is written
deterministically (no date, fixed ids), so the same records give the same file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "docs" / "served-runtimes.svg"
LABELS = {"minilm-embedder": "default release", "minilm-ort-fp32": "ONNX Runtime fp32"}
COLOURS = {"served": "#1f6fb4", "in-process": "#9cc3e6", "infinity": "#d9822b"}


def figures(record: dict) -> dict:
    """Per release: its shipped variant and the median served and in-process texts/s; and
    infinity-emb's texts/s where it was measured."""
    releases = {}
    for name, info in record["releases"].items():
        rounds = [r[name] for r in record["rounds"] if name in r]
        releases[name] = {
            "variant": info["variant"],
            "served": statistics.median(r["rps"] for r in rounds),
            "in-process": statistics.median(r["in_process"] for r in rounds),
        }
    infinity = record.get("infinity", {}).get("rps")
    return {
        "date": record["date"],
        "commit": record["commit"],
        "releases": releases,
        "infinity": infinity,
        "command": record["command"],
        "clients": record["clients"],
    }


def draw_panel(ax, run: dict, top: float) -> None:
    """One run's bars: served and in-process per release, and infinity-emb where measured."""
    names = list(run["releases"])
    x = range(len(names))
    served = [run["releases"][n]["served"] for n in names]
    limit = [run["releases"][n]["in-process"] for n in names]
    bars = ax.bar(
        [i - 0.2 for i in x],
        served,
        0.4,
        color=COLOURS["served"],
        label="served (Triton, 64 gRPC clients)",
    )
    ax.bar([i + 0.2 for i in x], limit, 0.4, color=COLOURS["in-process"], label="in-process limit")
    ax.bar_label(bars, fmt="%.0f", padding=2)
    ticks = [f"{LABELS.get(n, n)}\n{run['releases'][n]['variant']}" for n in names]
    if run["infinity"]:
        inf = ax.bar(
            [len(names)],
            [run["infinity"]],
            0.4,
            color=COLOURS["infinity"],
            label="infinity-emb 0.0.78 (torch)",
        )
        ax.bar_label(inf, fmt="%.0f", padding=2)
        ticks.append("infinity-emb")
    ax.set_xticks(range(len(ticks)), ticks, fontsize=7)
    ax.set_ylim(0, top * 1.15)
    ax.set_title(f"{run['date'][:16].replace('T', ' ')} UTC, commit {run['commit']}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def draw(records: list[dict], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams.update(
        {"svg.hashsalt": "hf2triton", "svg.fonttype": "none", "font.size": 9}
    )
    runs = [figures(r) for r in records]
    fig, axes = plt.subplots(
        1, len(runs), figsize=(4.6 * len(runs), 3.6), sharey=True, squeeze=False
    )
    top = max(
        max(max(f["served"], f["in-process"]) for f in run["releases"].values()) for run in runs
    )
    for ax, run in zip(axes[0], runs):
        draw_panel(ax, run, top)
    axes[0][0].set_ylabel("texts/s (median of rounds)")
    handles, labels = [], []
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False)
    fig.suptitle("all-MiniLM-L6-v2, every-length traffic, 2-core AMD EPYC", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    save(fig, output)


def save(fig, output: Path) -> None:
    import matplotlib.pyplot as plt

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    fig.savefig(tmp, format=output.suffix.lstrip(".") or "svg", metadata={"Date": None})
    tmp.replace(output)
    plt.close(fig)


def draw_generation(record: dict, output: Path) -> None:
    """Tokens/s and TTFT p50 against streams, one line per way, from one generation record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams.update(
        {"svg.hashsalt": "hf2triton", "svg.fonttype": "none", "font.size": 9}
    )
    fig, (rate, ttft) = plt.subplots(1, 2, figsize=(9.2, 3.8))
    for way, per in record["results"].items():
        levels = sorted(per, key=int)
        if len(levels) < 2:  # one point (PyTorch one at a time): a marker, no line
            rate.plot(
                [int(x) for x in levels], [per[x]["tokens_per_s"] for x in levels], "o", label=way
            )
            ttft.plot(
                [int(x) for x in levels], [per[x]["ttft_p50_ms"] for x in levels], "o", label=way
            )
            continue
        rate.plot(
            [int(x) for x in levels],
            [per[x]["tokens_per_s"] for x in levels],
            marker="o",
            label=way,
        )
        ttft.plot(
            [int(x) for x in levels], [per[x]["ttft_p50_ms"] for x in levels], marker="o", label=way
        )
        last = levels[-1]
        rate.annotate(
            f"{per[last]['tokens_per_s']:.0f}",
            (int(last), per[last]["tokens_per_s"]),
            textcoords="offset points",
            xytext=(4, 0),
            fontsize=7,
        )
    for ax, label in ((rate, "generated tokens/s"), (ttft, "time to first token, p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(record["levels"], [str(x) for x in record["levels"]])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ttft.set_yscale("log")
    handles, labels = rate.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(
        f"{record['model']}, every-length traffic, 2-core AMD EPYC; "
        f"{record['when'][:8]}, commit {record['commit']}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    save(fig, output)


def release_runs(records: list[dict]) -> list[dict]:
    """The newest pruned run of each shape that recorded its anonymous memory, smallest first."""
    newest: dict[str, dict] = {}
    for record in sorted(records, key=lambda r: r["when"]):
        for run in record["runs"]:
            if run.get("prune", True) and run.get("peak_anon_mb"):
                newest[run["shape"]] = {**run, "when": record["when"], "commit": record["commit"]}
    return sorted(newest.values(), key=lambda r: r["fp32_mb"])


def draw_release_costs(records: list[dict], output: Path) -> None:
    """Release time and peak memory against the fp32 weights' size, one point per shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams.update(
        {"svg.hashsalt": "hf2triton", "svg.fonttype": "none", "font.size": 9}
    )
    runs = release_runs(records)
    if not runs:
        raise SystemExit("chart: no run in these records measured its anonymous memory")
    gb = [r["fp32_mb"] / 1024 for r in runs]
    fig, (time_ax, mem_ax) = plt.subplots(1, 2, figsize=(9.2, 3.8))
    time_ax.plot(gb, [r["seconds"] / 60 for r in runs], "o", color=COLOURS["served"])
    time_ax.axhline(60, color="#999999", linestyle="--", linewidth=1)
    time_ax.annotate("goal at 1.7B: 60 min", (gb[0], 60), xytext=(0, 3),
                     textcoords="offset points", fontsize=7)  # fmt: skip
    time_ax.set_ylabel("release wall time (min)")
    mem_ax.plot(gb, [r["peak_anon_mb"] / 1024 for r in runs], "o", label="summed anonymous",
                color=COLOURS["served"])  # fmt: skip
    mem_ax.plot(gb, [r["peak_rss_mb"] / 1024 for r in runs], "s", label="summed resident",
                color=COLOURS["in-process"])  # fmt: skip
    line = [0.0, max(gb) * 1.05]
    mem_ax.plot(line, [2 + 2 * x for x in line], "--", color="#999999", linewidth=1,
                label="goal: 2 GB + 2x fp32")  # fmt: skip
    mem_ax.set_ylabel("peak memory of the release's processes (GB)")
    mem_ax.legend(frameon=False, fontsize=7)
    for ax, ys in ((time_ax, [r["seconds"] / 60 for r in runs]),
                   (mem_ax, [r["peak_anon_mb"] / 1024 for r in runs])):  # fmt: skip
        for r, x, y in zip(runs, gb, ys):
            ax.annotate(r["shape"], (x, y), xytext=(4, -3), textcoords="offset points", fontsize=7)
        ax.set_xlabel("fp32 weights (GB)")
        ax.grid(alpha=0.3)
    dates = sorted({r["when"][:8] for r in runs})
    fig.suptitle(
        f"What a release costs, random weights of real shapes, 2-core AMD EPYC "
        f"({dates[0]}-{dates[-1]})",
        fontsize=10,
    )
    fig.tight_layout()
    save(fig, output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "results",
        nargs="*",
        type=Path,
        help="runtimes-*.json records (default: all in benchmarks/results)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help=f"the chart, .svg or .png (default: {DEFAULT_OUTPUT.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--generation",
        type=Path,
        metavar="RECORD",
        help="draw this generation-*.json record instead",
    )
    parser.add_argument(
        "--release-costs",
        type=Path,
        nargs="+",
        metavar="RECORD",
        help="draw these generation-release-*.json records instead",
    )
    args = parser.parse_args(argv)
    if args.release_costs:
        draw_release_costs([json.loads(p.read_text()) for p in args.release_costs], args.output)
        print(f"wrote {args.output}", file=sys.stderr)
        return 0
    if args.generation:
        draw_generation(json.loads(args.generation.read_text()), args.output)
        print(f"wrote {args.output}", file=sys.stderr)
        return 0
    paths = args.results or sorted((ROOT / "benchmarks" / "results").glob("runtimes-*.json"))
    if not paths:
        print(
            "chart: no runtimes-*.json records: run benchmarks/served_runtimes.py first",
            file=sys.stderr,
        )
        return 2
    records = [json.loads(p.read_text()) for p in paths]
    draw(sorted(records, key=lambda r: r["date"]), args.output)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
