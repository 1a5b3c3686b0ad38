"""Serves and measures a GPU release packed by benchmarks/gpu/pack.py, on the GPU machine itself
(no network; its python3 with PyTorch's CUDA libraries): verifies and joins the parts, sets up
a serving environment, starts tritonserver on the rendered repository at 1 instance and at the
rendered count, and prints one JSON object of what it measured (also $OUT/gpu-check.json).

    python3 benchmarks/gpu/check.py receive PART [PART...]   # verify, move to /tmp/gpu-kit
    python3 benchmarks/gpu/check.py run [--parts /tmp/gpu-kit] [--simulate-cpu]

`run --simulate-cpu` runs the same path on a CPU host (CPU provider, KIND_CPU, fewer clients and
seconds), so that everything but the GPU is tested in CI. Standard library only (what runs in
the serving environment imports numpy, onnxruntime and tokenizers there): this file and its
modules beside it (check_*.py, of the `gpu` package: named so as to hide no installed module,
the script's folder being first on its path) run under the machine's own Python, whatever that
holds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# This script's modules are the `gpu` package it sits in: benchmarks/ goes last on the path, so
# that no name there (serving, load, ...) hides an installed module.
sys.path.append(str(Path(__file__).resolve().parents[1]))
from gpu.check_clients import clients_main, closed_loop, cosines, served_embeddings  # noqa: E402
from gpu.check_env import probe, run_env, serving_env, set_instances, simulate_on_cpu  # noqa: E402
from gpu.check_kit import Refused, log  # noqa: E402
from gpu.check_meter import GpuMeter  # noqa: E402
from gpu.check_ort import ort_main  # noqa: E402
from gpu.check_parts import join_and_unpack, receive, untar  # noqa: E402
from gpu.check_probe import ServerCpu, profile, stub_pids  # noqa: E402
from gpu.check_report import Report, goals, save_out  # noqa: E402
from gpu.check_server import Triton  # noqa: E402

DEFAULT_PARTS = Path("/tmp/gpu-kit")


@dataclass
class Unpacked:
    """What the check serves and measures, once unpacked and set up."""

    work: Path
    bundle: Path
    model: str
    instance_count: int
    model_dir: Path
    triton: Path
    venv: Path
    env: dict[str, str]
    settings: dict[str, Any]
    texts_file: Path
    texts: list[str]


def unpacked(args: argparse.Namespace, report: Report) -> Unpacked:
    """The parts joined and unpacked into args.work, the serving environment made; what the
    render shipped recorded."""
    work = Path(args.work)
    data = report.data
    data.update(simulate_cpu=args.simulate_cpu, machine=probe())
    manifest = join_and_unpack(Path(args.parts), work)
    bundle = work / "bundle"
    model = manifest["model_name"]
    data.update(
        model=model,
        candidate=manifest["render"]["candidate"],
        instance_count=manifest["instance_count"],
        texts=manifest["texts"],
        pack_created=manifest["created"],
    )
    with report.stage("unpack"):
        untar(bundle / "triton.tar.xz", work)
        untar(bundle / "repository.tar.gz", work / "render")
        if (bundle / "plain-fp32.tar.gz").is_file():
            untar(bundle / "plain-fp32.tar.gz", work / "fp32")
    triton = work / "triton"
    model_dir = work / "render" / "model_repository" / model
    if args.simulate_cpu:
        simulate_on_cpu(model_dir)
    venv = serving_env(work, manifest)
    settings = json.loads((model_dir / "1" / "serving.json").read_text())
    data["runtime"] = settings.get("runtime")
    texts_file = bundle / "texts.json"
    return Unpacked(
        work=work,
        bundle=bundle,
        model=model,
        instance_count=manifest["instance_count"],
        model_dir=model_dir,
        triton=triton,
        venv=venv,
        env=run_env(venv, triton),
        settings=settings,
        texts_file=texts_file,
        texts=json.loads(texts_file.read_text(encoding="utf-8")),
    )


def ort_rates(args: argparse.Namespace, u: Unpacked, data: dict[str, Any]) -> None:
    """ONNX Runtime's own rates on the shipped graph (and the plain fp32 one), in the serving
    environment (this script's `_ort`); the provider the shipped graph runs on, checked."""
    simulate = args.simulate_cpu
    graphs = [f"shipped={u.model_dir / '1' / u.settings['onnx']}"]
    if (u.work / "fp32" / "model.onnx").is_file():
        graphs.append(f"plain_fp32={u.work / 'fp32' / 'model.onnx'}")
    cmd = [
        str(u.venv / "bin" / "python"),
        __file__,
        "_ort",
        f"--texts={u.texts_file}",
        f"--tokenizer={u.model_dir / '1' / u.settings['tokenizer']}",
        f"--max-length={u.settings['max_length']}",
        "--batch=64",
        f"--max-batch-tokens={u.settings.get('max_batch_tokens') or 0}",
        f"--serving-core={u.model_dir / '1'}",
        f"--seconds={args.ort_seconds}",
        f"--provider={'cpu' if simulate else 'cuda'}",
        *[f"--graph={g}" for g in graphs],
    ]
    done = subprocess.run(cmd, env=u.env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"ONNX Runtime in-process failed:\n{done.stderr[-3000:]}")
    data["ort"] = json.loads(done.stdout.strip().splitlines()[-1])
    data["provider"] = data["ort"]["graphs"]["shipped"]["provider"]
    want = "CPUExecutionProvider" if simulate else "CUDAExecutionProvider"
    data["provider_ok"] = data["provider"] == want
    if not data["provider_ok"]:  # ONNX Runtime says why only in its warnings
        raise RuntimeError(
            f"the shipped graph runs on {data['provider']}, not {want}; ONNX Runtime "
            f"said:\n{done.stderr[-2500:]}"
        )


def served_at(
    args: argparse.Namespace,
    u: Unpacked,
    count: int,
    meter: GpuMeter | None,
    data: dict[str, Any],
    variant: str | None = None,
) -> None:
    """tritonserver at `count` instances: a closed loop at each client count; at the rendered
    count, every text once more for the cosines with PyTorch's. A `variant` (NAME=VALUE in the
    server's environment) serves at the most clients only, its points marked with it."""
    set_instances(u.model_dir, count)
    env = dict(u.env)
    if variant:
        name, _, value = variant.partition("=")
        env[name] = value
    log_file = u.work / (f"triton-{count}-variant.log" if variant else f"triton-{count}.log")
    server = Triton(u.triton, u.work / "render" / "model_repository", u.model, env, log_file)
    try:
        ready_s = server.wait_ready(args.ready_timeout)
        for clients in [max(args.clients)] if variant else args.clients:
            profiled = (
                bool(args.py_spy)
                and not variant
                and count == u.instance_count
                and clients == min(args.clients)  # a native profile slows the point it samples
            )
            probe = Probed(server.proc.pid, args, u.work / f"profile-{count}.txt", profiled)
            point = closed_loop(
                server.port, u.model, u.texts_file, clients, args.seconds, args.warm, meter, probe
            )
            row = {"instances": count, "ready_s": round(ready_s, 1), **point}
            data["served"].append({**row, "variant": variant} if variant else row)
            log(f"{count} instance(s) {variant or ''}, {clients} clients: {point['texts_per_s']}")
        if count == u.instance_count and not variant:
            data["cosine"] = cosines(
                served_embeddings(server.port, u.model, u.texts),
                u.bundle / "reference.f32",
                u.texts,
            )
    finally:
        server.stop()
        save_out(log_file)


class Probed:
    """A load point's server side: each process's CPU over the window, and (`profiled`, with
    py-spy carried) one stub's profile over most of it."""

    def __init__(self, sid: int, args: argparse.Namespace, out: Path, profiled: bool):
        self.cpu, self.args, self.out, self.profiled = ServerCpu(sid), args, out, profiled
        self.sid = sid
        self.thread: threading.Thread | None = None
        self.found: dict[str, Any] = {}

    def start(self) -> None:
        self.cpu.start()
        stubs = stub_pids(self.sid)
        if self.profiled and stubs:
            seconds = max(1.0, self.args.seconds - 1)

            def run() -> None:
                try:
                    self.found = profile(Path(self.args.py_spy), stubs[0], seconds, self.out)
                except Exception as exc:  # the point's figures stand without it
                    self.found = {"error": repr(exc)}
                save_out(self.out)

            self.thread = threading.Thread(target=run, daemon=True)
            self.thread.start()

    def stop(self) -> dict[str, Any]:
        result = self.cpu.stop()
        if self.thread is not None:
            self.thread.join(timeout=90)
            result["profile"] = self.found
        return result


def run_check(args: argparse.Namespace, report: Report) -> None:
    data = report.data
    u = unpacked(args, report)
    with report.stage("ort"):
        ort_rates(args, u, data)
    meter = None if args.simulate_cpu else GpuMeter()
    data["gpu_meter"] = None if meter is None else meter.source
    data["served"] = []
    # The rendered count first (its cosines and the goals), then the others of the sweep.
    for count in dict.fromkeys([u.instance_count, *sorted(args.counts)]):
        with report.stage(f"served at {count} instance(s)"):
            served_at(args, u, count, meter, data)
    for variant in args.variant_env or []:
        with report.stage(f"served at {u.instance_count} instance(s), {variant}"):
            served_at(args, u, u.instance_count, meter, data, variant)
    data["goals"] = goals(data, args.simulate_cpu)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("receive", help="verify parts against the manifest, move them to --into")
    r.add_argument("parts", nargs="+", type=Path)
    r.add_argument("--into", type=Path, default=DEFAULT_PARTS)
    r.add_argument("--manifest", type=Path)
    c = sub.add_parser("run", help="join, unpack, serve and measure; one JSON object")
    c.add_argument("--parts", default=str(DEFAULT_PARTS), help="the folder of the parts")
    c.add_argument("--work", default="/tmp/gpu-kit-work", help="where it unpacks (replaced)")
    c.add_argument("--simulate-cpu", action="store_true", help="the same path on a CPU host")
    c.add_argument("--clients", help="closed-loop client counts (default 64,128; 4,8 simulated)")
    c.add_argument(
        "--counts", help="instance counts served besides the rendered one (default 1,2,8,16; 1)"
    )
    c.add_argument("--seconds", type=float, help="each load point (default 8; 1 simulated)")
    c.add_argument("--warm", type=float, help="traffic before each point counts (default 2; 0.3)")
    c.add_argument("--ort-seconds", type=float, help="each in-process rate (default 5; 0.5)")
    c.add_argument(
        "--variant-env",
        action="append",
        help="NAME=VALUE: the rendered count served once more with it in tritonserver's env",
    )
    c.add_argument(
        "--py-spy", help="py-spy's binary: profile a stub at the rendered count, fewest clients"
    )
    c.add_argument("--ready-timeout", type=float, default=120, help="a server's load, seconds")
    w = sub.add_parser("_clients")  # one process of closed_loop's clients
    for flag in ("--port", "--threads"):
        w.add_argument(flag, type=int, required=True)
    for flag in ("--start-at", "--seconds"):
        w.add_argument(flag, type=float, required=True)
    w.add_argument("--model", required=True)
    w.add_argument("--texts", required=True)
    o = sub.add_parser("_ort")  # ort_main, in the serving environment
    o.add_argument("--graph", action="append", required=True, help="label=path")
    for flag in ("--texts", "--tokenizer", "--provider"):
        o.add_argument(flag, required=True)
    for flag in ("--max-length", "--batch"):
        o.add_argument(flag, type=int, required=True)
    o.add_argument("--max-batch-tokens", type=int, default=0)
    o.add_argument("--serving-core", required=True, help="the version folder: hf2triton_serving")
    o.add_argument("--seconds", type=float, required=True)
    return p


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`run`'s load settings: those given, else the GPU's (or, simulated, a CPU's) defaults."""
    sim = args.simulate_cpu
    args.clients = [int(x) for x in (args.clients or ("4,8" if sim else "64,128")).split(",")]
    args.counts = [int(x) for x in (args.counts or ("1" if sim else "1,2,8,16")).split(",")]
    args.seconds = args.seconds or (1.0 if sim else 8.0)
    args.warm = args.warm if args.warm is not None else (0.3 if sim else 2.0)
    args.ort_seconds = args.ort_seconds or (0.5 if sim else 5.0)
    return args


def checked(args: argparse.Namespace) -> int:
    """`run`: the check, its JSON object printed (and written under $OUT); 2 when refused."""
    report = Report()
    try:
        run_check(args, report)
    except Refused as exc:
        print(f"check: refused: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # what was measured before it still comes back
        report.data["ok"] = False
        report.data["errors"].append({"stage": "setup", "error": traceback.format_exc()[-3000:]})
        log(f"failed: {exc!r}")
    data = report.data
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu-check.json").write_text(
            json.dumps(data, indent=1, ensure_ascii=False)
        )
    print(json.dumps(data, ensure_ascii=False))
    return 0 if data["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "_clients":
        return clients_main(args)
    if args.command == "_ort":
        return ort_main(args)
    try:
        if args.command == "receive":
            print(json.dumps(receive(args.parts, args.into, args.manifest)))
            return 0
        with_defaults(args)
    except Refused as exc:
        print(f"check: refused: {exc}", file=sys.stderr)
        return 2
    return checked(args)


if __name__ == "__main__":
    sys.exit(main())
