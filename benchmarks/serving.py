"""Serving benchmark on real traffic, in one run on one machine, reported as ratios.

Traffic: `mixed` is what real clients send, texts drawn at random from the validation set and the
held-out sentences, every length (one-word queries to 256-token paragraphs); `median` is texts of
the validation set's median length, the easy case. For each mix:

- the in-process limit: the shipped model's serving core on the same texts, sorted by length in
  token-bounded sub-batches (and, for scale, in padded batches of 32 in arrival order);
- the default release served by Triton, closed-loop gRPC clients sending one text per request,
  at 1, 16 and 64 clients (HTTP at 64 too);
- the same release on today's main (a checkout of BASELINE_COMMIT, its own code and spec);
- a peer: infinity-emb (torch engine, batch size 32, same MiniLM) in an environment of its own
  (benchmarks/.venv-infinity, created on first use; a benchmark peer, not a dependency);
- translation: a Marian-sized translator (d_model 512, 6+6 layers, random weights, EOS
  suppressed so every output has the same length), served batched greedy decoding against
  PyTorch `generate` in-process at 1 and 16 requests.

    .venv/bin/python benchmarks/serving.py            # the full run, about 20 minutes
    .venv/bin/python benchmarks/serving.py --quick    # short points, for a try-out

Writes benchmarks/results/<UTC time>/{results.json, results.md, serving.png}, copies them to
benchmarks/results/latest.* and the chart to docs/serving.png. Everything runs on 127.0.0.1;
every server it starts, it stops.

Its parts live beside it: harness.py (traffic, releases, records), serving_measure.py (the
in-process limit and the served points), serving_peers.py (today's main, infinity-emb),
serving_translation.py and serving_report.py (ratios, markdown, chart).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness import (  # noqa: E402
    MODEL,
    VENV,
    describe_traffic,
    log,
    release,
    server_pid,
    stop_server,
    traffic,
    wait_for_quiet,
    write_spec,
)
from serving_measure import in_process, paired, served_points  # noqa: E402
from serving_peers import baseline_main, peer  # noqa: E402
from serving_report import chart, markdown, ratios  # noqa: E402
from serving_translation import translation  # noqa: E402

from hf2triton.util.net import free_ports  # noqa: E402

# --- the run -----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 s points")
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds a point")
    ap.add_argument("--no-main", action="store_true", help="skip today's main")
    ap.add_argument("--no-peer", action="store_true", help="skip infinity-emb")
    ap.add_argument("--no-translation", action="store_true")
    ap.add_argument(
        "--report",
        type=Path,
        help="only re-write the report and chart of a run directory (benchmarks/results/<time>/)",
    )
    a = ap.parse_args()
    out = ROOT / "benchmarks" / "results" / dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    if a.report:
        res = json.loads((a.report / "results.json").read_text())
        out = a.report
    else:
        out.mkdir(parents=True, exist_ok=True)
        res = run(a)
        (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "results.md").write_text(markdown(res))
    chart(res, out / "serving.png")
    for name in ("results.json", "results.md", "serving.png"):
        shutil.copyfile(
            out / name,
            out.parent / f"latest.{name.split('.', 1)[1]}"
            if name != "results.json"
            else out.parent / "latest.json",
        )
    (ROOT / "docs").mkdir(exist_ok=True)
    shutil.copyfile(out / "serving.png", ROOT / "docs" / "serving.png")
    print(markdown(res))


def averaged(before: dict, after: dict) -> dict:
    """The in-process limits measured before and after the served points, and their mean."""
    return {
        mix: {
            name: {
                **row,
                "texts_per_s": round((row["texts_per_s"] + after[mix][name]["texts_per_s"]) / 2, 1),
                "before": row["texts_per_s"],
                "after": after[mix][name]["texts_per_s"],
            }
            for name, row in rows.items()
        }
        for mix, rows in before.items()
    }


def measured(
    version_dir: Path, grpc: int, http: int, mixes: dict, seconds: float, pid: int | None
) -> dict[str, Any]:
    """The served points between two in-process limits, then the paired rounds."""
    # The limit is measured right before and right after the served points and averaged:
    # on a shared machine the rate drifts by 10% or more between minutes.
    log("in-process limit of the shipped model (before the served points)")
    before = {mix: in_process(version_dir, texts, seconds) for mix, texts in mixes.items()}
    log("served")
    served = served_points(
        f"127.0.0.1:{grpc}",
        f"127.0.0.1:{http}",
        mixes,
        {"mixed": [1, 16, 64], "median": [1, 16, 64]},
        seconds,
        pid,
        "served",
    )
    log("in-process limit of the shipped model (after the served points)")
    after = {mix: in_process(version_dir, texts, seconds) for mix, texts in mixes.items()}
    out = {"served": served, "in_process": averaged(before, after)}
    log("paired: served@64 and the in-process limit in turn, three times")
    out["paired"] = paired(version_dir, f"127.0.0.1:{grpc}", mixes["mixed"], seconds, pid)
    return out


def this_release(tmp: Path, mixes: dict, seconds: float) -> dict[str, Any]:
    """The default spec released into a private home and measured: `release`, `served`,
    `in_process` and `paired` of the record."""
    http, grpc, metrics, api = free_ports(4)
    ports = {"http_port": http, "grpc_port": grpc, "metrics_port": metrics, "openai": {"port": api}}
    spec = write_spec(tmp / "minilm.yaml", ROOT / "releases" / "minilm-embedder.yaml", ports)
    home, cli = tmp / "home", [str(VENV / "hf2triton")]
    log("this release: the default spec")
    summary, wall = release(cli, spec, home, ROOT)
    version_dir = home / "triton" / "models" / MODEL / summary["mlflow"]["version"]
    settings = json.loads((version_dir / "serving.json").read_text())
    out: dict[str, Any] = {
        "release": {
            "variant": summary["variant"],
            "wall_s": wall,
            "max_batch_tokens": settings.get("max_batch_tokens"),
            "metrics": summary["metrics"],
        }
    }
    try:
        out.update(measured(version_dir, grpc, http, mixes, seconds, server_pid(home)))
    finally:
        stop_server(cli, home, ROOT)
    return out


def the_others(a: argparse.Namespace, res: dict, tmp: Path, mixes: dict, seconds: float) -> None:
    """Today's main, the peer and translation, each unless skipped; one that fails is recorded
    as `<name>_error`, not fatal."""
    for name, flag, fn in (
        ("main", a.no_main, lambda: baseline_main(tmp, mixes, seconds)),
        ("peer", a.no_peer, lambda: peer(mixes, seconds)),
        ("translation", a.no_translation, lambda: translation(tmp, seconds)),
    ):
        if flag:
            continue
        try:
            res[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a part that fails is reported, not fatal
            log(f"{name} failed: {exc}")
            res[f"{name}_error"] = " ".join(str(exc).split())[:2000]


def run(a: argparse.Namespace) -> dict:
    from hf2triton.util.cpu import cpu_features, describe

    seconds = 5.0 if a.quick else a.seconds
    started = time.monotonic()
    quiet = wait_for_quiet()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    res: dict[str, Any] = {
        "meta": {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit,
            "cpu": describe(cpu_features()),
            "loadavg": quiet["loadavg"],
            "seconds_per_point": seconds,
        }
    }
    mixes = traffic()
    res["traffic"] = {k: describe_traffic(v) for k, v in mixes.items()}
    with tempfile.TemporaryDirectory(prefix="hf2triton-bench-") as tmp_name:
        tmp = Path(tmp_name)
        res.update(this_release(tmp, mixes, seconds))
        the_others(a, res, tmp, mixes, seconds)
    res["ratios"] = ratios(res)
    res["meta"]["wall_s"] = round(time.monotonic() - started)
    return res


if __name__ == "__main__":
    main()
