"""serving.py's report: the ratios against their targets, the markdown summary and the chart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from serving_measure import at
from serving_peers import BASELINE_COMMIT

TARGETS = {
    "served_over_in_process": 0.9,
    "served_over_main": 2.5,
    "p99_ms_at_16": 500.0,
    "translation_served_over_pytorch": 2.0,
    "served_over_infinity": 2.5,
}


def ratios(res: dict) -> dict[str, float | None]:
    ours, limit = res["served"], res["in_process"]
    out: dict[str, float | None] = {}
    for mix in ("mixed", "median"):
        r64 = at(ours[mix], 64)
        for n in (32, 64, 512):
            out[f"{mix}: served@64 / in-process sorted, {n} at a time"] = (
                r64["rps"] / limit[mix][f"sorted_{n}"]["texts_per_s"]
            )
        main = res.get("main", {}).get("served", {}).get(mix)
        out[f"{mix}: served@64 / today's main@64"] = (
            r64["rps"] / at(main, 64)["rps"] if main else None
        )
        inf = (res.get("peer") or {}).get("served", {}).get(mix)
        out[f"{mix}: served@64 / infinity-emb@64"] = (
            r64["rps"] / at(inf, 64)["rps"] if inf else None
        )
    if res.get("paired"):
        for k in ("sorted_32", "sorted_64"):
            out[
                f"mixed: served@64 / in-process {k.replace('_', ', ')} at a time, in "
                f"alternation (median of {len(res['paired']['rounds'])})"
            ] = res["paired"][f"median_over_{k}"]
    tr = res.get("translation")
    if tr:
        out["translation: served@16 / PyTorch generate, 16 sequential"] = (
            at(tr["served"], 16)["rps"] / tr["pytorch_sequential_16"]
        )
        out["translation: served@1 / PyTorch generate, 1 at a time"] = (
            at(tr["served"], 1)["rps"] / tr["pytorch_sequential_1"]
        )
    return {k: (round(v, 2) if v is not None else None) for k, v in out.items()}


def ratio_lines(rat: dict) -> list[str]:
    """The ratios' table, each beside its target where it has one."""
    lines = ["| ratio | value | target |", "| --- | --- | --- |"]
    target = {
        "in-process sorted, 32 at a time, in alternation": "served_over_in_process",
        "today's main": "served_over_main",
        "infinity": "served_over_infinity",
        "16 sequential": "translation_served_over_pytorch",
    }
    for name, value in rat.items():
        t = next(
            (
                TARGETS[v]
                for k, v in target.items()
                if k in name and "mixed" in name or k in name and "translation" in name
            ),
            None,
        )
        lines.append(
            f"| {name} | {'n/a' if value is None else f'{value:.2f}x'} | "
            f"{'>= ' + str(t) + 'x' if t else ''} |"
        )
    return lines


def figure_lines(res: dict) -> list[str]:
    """The served points' table (this release, today's main, infinity-emb) and the in-process
    limits'."""
    lines = [
        "| served (gRPC unless marked) | traffic | clients | req/s | p50 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for label, block in (
        ("this release", res["served"]),
        (f"today's main ({BASELINE_COMMIT})", res.get("main", {}).get("served")),
        ("infinity-emb", (res.get("peer") or {}).get("served")),
    ):
        for mix, rows in (block or {}).items():
            for r in rows:
                lines.append(
                    f"| {label}{' (HTTP)' if r.get('protocol') == 'http' else ''} | "
                    f"{mix} | {r['clients']} | {r['rps']:.1f} | {r['p50_ms']:.0f} | "
                    f"{r['p99_ms']:.0f} |"
                )
    lines += [
        "",
        "| in-process (the shipped model's serving core) | traffic | texts/s |",
        "| --- | --- | --- |",
    ]
    for mix, rows in res["in_process"].items():
        for name, r in rows.items():
            lines.append(
                f"| {name} (budget {r['max_batch_tokens'] or 'none'}) | {mix} | "
                f"{r['texts_per_s']:.0f} |"
            )
    return lines


def markdown(res: dict) -> str:
    m, rat = res["meta"], res["ratios"]
    lines = [
        f"# Serving benchmark, {m['date']}",
        "",
        f"{m['cpu']}; commit {m['commit']}; load average before {m['loadavg'][0]}; "
        f"{m['wall_s']:.0f} s in all. Shipped variant: {res['release']['variant']} "
        f"(sub-batches of at most {res['release']['max_batch_tokens']} tokens).",
        "",
    ]
    for mix, desc in res["traffic"].items():
        lines.append(
            f"- `{mix}` traffic: median {desc['median_tokens']:.0f} tokens, p90 "
            f"{desc['p90_tokens']:.0f}, {desc['share_over_128']:.1%} over 128, up to "
            f"{desc['max_tokens']}"
        )
    lines += ["", *ratio_lines(rat), "", *figure_lines(res)]
    tr = res.get("translation")
    if tr:
        lines += [
            "",
            f"Translation ({tr['model']}, {tr['new_tokens']} tokens an output): "
            f"PyTorch generate {tr['pytorch_sequential_1']:.2f} sentences/s one at a time, "
            f"{tr['pytorch_sequential_16']:.2f}/s for 16 in a row; served "
            + ", ".join(
                f"{r['rps']:.2f} req/s at {r['clients']} client(s) (p99 {r['p99_ms']:.0f} ms)"
                for r in tr["served"]
            )
            + ".",
        ]
    for key in ("main_error", "peer_error", "translation_error"):
        if res.get(key):
            lines.append(f"\n{key}: {res[key]}")
    return "\n".join(lines) + "\n"


def chart(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(10, 3.6))
    groups = [
        ("in-process, 64 at a time", lambda mix: res["in_process"][mix]["sorted_64"]["texts_per_s"])
    ]
    groups.append(("this release @64", lambda mix: at(res["served"][mix], 64)["rps"]))
    if res.get("main"):
        groups.append(
            (f"main {BASELINE_COMMIT} @64", lambda mix: at(res["main"]["served"][mix], 64)["rps"])
        )
    if res.get("peer"):
        groups.append(("infinity-emb @64", lambda mix: at(res["peer"]["served"][mix], 64)["rps"]))
    mixes = ["mixed", "median"]
    width = 0.8 / len(groups)
    for i, (name, value) in enumerate(groups):
        xs = np.arange(len(mixes)) + i * width
        ax_t.bar(xs, [value(m) for m in mixes], width, label=name)
    ax_t.set_xticks(np.arange(len(mixes)) + 0.4 - width / 2, ["every length", "median length"])
    ax_t.set(ylabel="texts/s (one per request)", title="Throughput, MiniLM on 2 cores")
    ax_t.legend(fontsize=7)
    series = [("this release", res["served"]["mixed"])]
    if res.get("main"):
        series.append((f"main {BASELINE_COMMIT}", res["main"]["served"]["mixed"]))
    if res.get("peer"):
        series.append(("infinity-emb", res["peer"]["served"]["mixed"]))
    for name, rows in series:
        pts = [r for r in rows if r.get("protocol", "grpc") == "grpc"]
        ax_l.plot([r["clients"] for r in pts], [r["p99_ms"] for r in pts], marker="o", label=name)
    ax_l.axhline(
        TARGETS["p99_ms_at_16"], color="red", linestyle="--", linewidth=0.8, label="target at 16"
    )
    ax_l.set(
        xscale="log",
        yscale="log",
        xlabel="concurrent clients",
        ylabel="p99 ms",
        title="p99 latency, every-length traffic",
    )
    ax_l.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
