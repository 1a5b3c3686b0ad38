"""The release of a text-generation model, timed: a Qwen2-architecture model of about 25M
parameters (random weights, tests/tiny_models.py `build_qwen2`) released with the settings of
the shipped spec releases/smollm2-135m-instruct.yaml (its source replaced, max_new_tokens 96,
max_context 512, as the issue measured), in a fresh hf2triton home, in a process of its own:
the release's wall time, each step's, which candidate shipped, and the release process's peak
resident memory (ru_maxrss; Triton's own processes are not in it).

    .venv/bin/python benchmarks/generation_release.py [--model DIR] [--keep]

Writes benchmarks/results/generation-release-<UTC time>.json and prints it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def spec_for(model_dir: Path, work: Path) -> Path:
    """releases/smollm2-135m-instruct.yaml with the model, lengths and free ports of this run."""
    import yaml

    from hf2triton.util.net import free_port

    spec = yaml.safe_load((ROOT / "releases" / "smollm2-135m-instruct.yaml").read_text())
    spec["source"] = {"path": str(model_dir), "model_id": "bench/qwen2-25m"}
    spec["name"] = spec["registry"]["model_name"] = "bench-qwen2-25m"
    spec["text_generation"].update(max_new_tokens=96, max_context=512)
    spec["validation"]["sentences"] = str(ROOT / "releases" / "data" / "generation-prompts.txt")
    spec["deploy"].update(
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        openai={"port": free_port()},
    )
    spec.pop("watch", None)
    path = work / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def release(spec: Path, home: Path) -> dict:
    """One release in a child process: its summary, wall seconds and peak RSS."""
    code = f"""
import json, resource, sys, time
sys.path.insert(0, {str(ROOT)!r})
from hf2triton.flows.release import release_model
from hf2triton.spec import load_spec
from hf2triton.targets import triton_local
started = time.perf_counter()
try:
    summary = release_model(load_spec({str(spec)!r}))
finally:
    seconds = time.perf_counter() - started
    triton_local.stop_server()
print("RESULT " + json.dumps({{"seconds": round(seconds, 1), "variant": summary["variant"],
      "metrics": summary["metrics"], "peak_rss_mb":
      round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}}))
"""
    env = {**os.environ, "HF2TRITON_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    steps = [
        line
        for line in proc.stderr.splitlines()
        if "validate:" in line or "Finished in state" in line
    ]
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not found:
        raise SystemExit(f"the release failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return {**json.loads(found[0].removeprefix("RESULT ")), "log": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, help="a causal LM directory (default: the random 25M Qwen2)"
    )
    args = parser.parse_args()
    from hf2triton.util.cpu import cpu_features
    from tests.tiny_models import build_qwen2

    work = Path(tempfile.mkdtemp(prefix="generation-release-"))
    model_dir = args.model or build_qwen2(work / "qwen2-25m")
    started = time.perf_counter()
    result = release(spec_for(model_dir, work), work / "home")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    record = {
        "when": stamp,
        "commit": commit,
        "machine": platform.processor(),
        "cpu": cpu_features(),
        "model": str(args.model or "random Qwen2 25M"),
        "wall_seconds": round(time.perf_counter() - started, 1),
        **result,
        "children_peak_rss_mb": round(
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        ),
    }
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"generation-release-{stamp}.json").write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "log"}, indent=1))
    print("\n".join(result["log"]))


if __name__ == "__main__":
    main()
