"""Packs what a bare GPU machine (no network, its own python3.12 with PyTorch's CUDA libraries)
needs to serve and measure a GPU release (issue 37): a GPU spec rendered here with
`hf2triton render`, a trimmed tritonserver, numpy<2 and onnxruntime-gpu wheels, the validation
texts and PyTorch's embeddings of them, all in one tar split into parts small enough for one
`device` call each, with a manifest of every part's sha256 and the order to join them.
benchmarks/gpu/check.py unpacks and measures it there; benchmarks/gpu/README.md says how.

    .venv/bin/python benchmarks/gpu/pack.py [--spec releases/minilm-embedder.yaml]
        [--output benchmarks/gpu/pack] [--part-mb 60] [--texts N]

The spec is rendered as its GPU variant (deploy.device gpu, gpu_gate cpu-numerics, the GPU's
default instance count). Downloads and the slow compressions are cached under .cache/gpu-kit.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from hf2triton.util.workspace import sha256_file  # noqa: E402

CACHE = ROOT / ".cache" / "gpu-kit"
DEFAULT_SPEC = ROOT / "releases" / "minilm-embedder.yaml"
DEFAULT_OUTPUT = ROOT / "benchmarks" / "gpu" / "pack"
MB = 1_000_000
# The device tool carries at most 64 MiB a call, the working tree (about 4 MiB) included.
MAX_PART_MB = 62
# What the GPU machine's python3.12 runs the models with: onnxruntime-gpu 1.31.1 is the build for
# CUDA 13 (the machine's PyTorch brings CUDA 13's libraries); the Python backend stub crashes on
# BYTES tensors with numpy 2.
ORT_GPU = "onnxruntime-gpu==1.31.1"
NUMPY = "numpy==1.26.4"
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
]
MANIFEST_FORMAT = 1


STARTED = time.monotonic()


def log(msg: str) -> None:
    print(f"pack: {time.monotonic() - STARTED:6.1f}s {msg}", file=sys.stderr, flush=True)


@contextmanager
def written(path: Path) -> Iterator[Path]:
    """A temporary name beside `path`, renamed to it when the block ends without error: a cached
    file is either whole or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def xz_compress(src: IO[bytes], dst: Path, preset: int) -> None:
    """xz of a stream into `dst`: with the xz program's threads where there is one (the big
    library takes minutes on one core), else Python's lzma. Python's lzma reads both."""
    xz = shutil.which("xz")
    with open(dst, "wb") as out:
        if xz:
            proc = subprocess.Popen(
                [xz, "-T0", f"-{preset}", "-c"], stdin=subprocess.PIPE, stdout=out
            )
            assert proc.stdin is not None
            shutil.copyfileobj(src, proc.stdin, 1 << 20)
            proc.stdin.close()
            if proc.wait() != 0:
                raise RuntimeError(f"xz failed (exit {proc.returncode}) compressing into {dst}")
            return
        comp = lzma.LZMACompressor(preset=preset)
        for block in iter(lambda: src.read(1 << 20), b""):
            out.write(comp.compress(block))
        out.write(comp.flush())


# ---- the GPU spec and its render ------------------------------------------------------------


def gpu_variant(spec_path: Path, out: Path) -> Path:
    """`spec_path` as a GPU release, written to `out`: deploy.device gpu, gpu_gate cpu-numerics
    (the gate checks the GPU graph's numerics on this CPU), instance_count left to the GPU
    default. Relative paths in it are made absolute, as the spec's loader resolves them."""
    from hf2triton.spec.release import load_spec

    raw = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    loaded = load_spec(spec_path)
    if loaded.task != "feature-extraction":
        raise SystemExit(
            f"pack: the GPU check measures embedding releases (task feature-extraction); "
            f"{spec_path} is {loaded.task!r}"
        )
    resolved = loaded.model_dump(mode="json", by_alias=True)

    def absolute(node: Any, seen: Any) -> Any:
        if isinstance(node, dict) and isinstance(seen, dict):
            return {k: absolute(v, seen.get(k)) for k, v in node.items()}
        if (
            isinstance(node, str)
            and isinstance(seen, str)
            and seen != node
            and os.path.isabs(seen)
            and seen.endswith(os.path.normpath(node).lstrip("./"))
        ):
            return seen
        return node

    spec = absolute(raw, resolved)
    deploy = spec.setdefault("deploy", {})
    deploy.update(device="gpu", gpu_gate="cpu-numerics")
    deploy.pop("instance_count", None)
    out.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return out


def render(spec: Path, out: Path, home: Path) -> dict[str, Any]:
    """`hf2triton render SPEC --output OUT` with HF2TRITON_HOME `home`; its JSON line."""
    cli = Path(sys.executable).parent / "hf2triton"
    env = {**os.environ, "HF2TRITON_HOME": str(home)}
    log(f"rendering {spec.name} (hf2triton render, home {home}) ...")
    proc = subprocess.run(
        [str(cli), "render", str(spec), "--output", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"pack: hf2triton render failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    line: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if line.get("device") != "gpu":
        raise SystemExit(f"pack: the render is not a GPU one ({line.get('device')}): {line}")
    return line


def plain_fp32_export(home: Path, release: str) -> Path | None:
    """The fp32 graph the render exported (the release's export step, in its home), newest first:
    the graph the shipped fp16 one is measured against."""
    done = sorted(
        (home / "work" / release / "export").glob("*/hf2triton-done.json"),
        key=lambda p: p.stat().st_mtime,
    )
    graphs = [p.parent / "model.onnx" for p in done if (p.parent / "model.onnx").is_file()]
    return graphs[-1] if graphs else None


def fp32_for_the_trip(graph: Path, out: Path) -> dict[str, Any]:
    """The plain fp32 graph at half its size: its float initializers go to weights16.bin as fp16
    and the graph names them as external data in weights.bin (fp32), which check.py writes back
    from weights16.bin. Same graph, same fp32 compute, weights rounded through fp16: it is for
    timing the shipped graph against, not for its numbers."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph), load_external_data=True)
    offset, moved = 0, 0
    with open(out / "weights16.bin", "wb") as f:
        for t in model.graph.initializer:
            if t.data_type != onnx.TensorProto.FLOAT or int(np.prod(t.dims)) < 1024:
                continue
            f.write(numpy_helper.to_array(t).astype(np.float16).tobytes())
            length = int(np.prod(t.dims)) * 4
            t.ClearField("raw_data")
            t.ClearField("float_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            del t.external_data[:]
            for key, value in (("location", "weights.bin"), ("offset", offset), ("length", length)):
                entry = t.external_data.add()
                entry.key, entry.value = key, str(value)
            offset += length
            moved += 1
    onnx.save(model, str(out / "model.onnx"))
    return {"initializers": moved, "weights_bytes": offset, "source_sha256": sha256_file(graph)}


# ---- tritonserver, trimmed ------------------------------------------------------------------


def pytriton_site() -> Path:
    """The site-packages of the serving environment holding the nvidia-pytriton wheel."""
    from hf2triton.targets.triton_local import serving_env

    found = sorted(serving_env().glob("lib/python3*/site-packages/pytriton/tritonserver"))
    if not found:
        raise SystemExit(
            f"pack: no nvidia-pytriton in the serving environment {serving_env()}: run "
            "`bash infra/setup.sh`"
        )
    return found[0].parents[1]


def trimmed_triton(python: str, preset: int) -> tuple[Path, dict[str, Any]]:
    """tritonserver from the pytriton wheel as triton.tar.xz, cached: bin/, the Python backend
    with the one stub of the GPU machine's Python, the bundled libraries (the 3.13 stub's own
    libpython dropped). The layout keeps the wheel's relative RPATHs working."""
    site = pytriton_site()
    server = site / "pytriton" / "tritonserver"
    stub = server / "python_backend_stubs" / python / "triton_python_backend_stub"
    if not stub.is_file():
        have = sorted(p.parent.name for p in server.glob("python_backend_stubs/*/*_stub"))
        raise SystemExit(f"pack: this tritonserver has no stub for Python {python} ({have})")
    dist = sorted(site.glob("nvidia_pytriton-*.dist-info"))
    version = dist[0].name.removesuffix(".dist-info").split("-")[1] if dist else "unknown"
    cached = CACHE / f"triton-{version}-py{python}-xz{preset}.tar.xz"
    info = {"pytriton": version, "stub_python": python}
    if cached.is_file():
        return cached, info
    log(f"trimming tritonserver (nvidia-pytriton {version}, stub {python}) ...")

    def keep(entry: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = Path(entry.name).name
        if name == "__pycache__" or (name.startswith("libpython3-") and python != "3.13"):
            return None
        return entry

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        tar.add(site / "nvidia_pytriton.libs", "triton/nvidia_pytriton.libs", filter=keep)
        for part in ("bin", "backends", "caches"):
            tar.add(server / part, f"triton/pytriton/tritonserver/{part}", filter=keep)
        # Triton wants the stub beside the backend library; the wheel keeps the stubs apart.
        tar.add(stub, "triton/pytriton/tritonserver/backends/python/triton_python_backend_stub")
    raw.seek(0)
    with written(cached) as tmp:
        xz_compress(raw, tmp, preset)
    return cached, info


# ---- the wheels -----------------------------------------------------------------------------


def downloaded(requirement: str, python: str) -> Path:
    """The cp3X manylinux wheel of `requirement` (name==version), from .cache/gpu-kit/wheels or
    downloaded there with pip (no dependencies: the GPU machine's site-packages has them)."""
    name, version = requirement.split("==")
    folder = CACHE / "wheels"
    tag = "cp" + python.replace(".", "")
    pattern = f"{name.replace('-', '_')}-{version}-{tag}-{tag}-*.whl"
    found = sorted(folder.glob(pattern))
    if found:
        return found[0]
    log(f"downloading {requirement} for Python {python} ...")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python, "--implementation", "cp", "-d", str(folder), requirement]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd, check=True)
    found = sorted(folder.glob(pattern))
    if not found:
        raise SystemExit(f"pack: pip downloaded no {pattern} into {folder}")
    return found[0]


def split_wheel(wheel: Path, preset: int, into: Path | None = None) -> dict[str, Any]:
    """The wheel without its largest file (onnxruntime-gpu's CUDA provider library: most of the
    wheel, better compressed by xz than by the wheel's deflate), and that file as .xz on its own;
    check.py puts it back at `path`. Cached by the wheel's sha256 unless `into` is given."""
    digest = sha256_file(wheel)
    folder = into or CACHE / "split" / f"{digest[:16]}-xz{preset}"
    info_file = folder / "split.json"
    if info_file.is_file():
        cached: dict[str, Any] = json.loads(info_file.read_text())
        return cached
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zin:
        largest = max(zin.infolist(), key=lambda i: i.file_size)
        log(f"splitting {wheel.name}: {largest.filename} ({largest.file_size / MB:.0f} MB) apart")
        rest = folder / wheel.name
        with written(rest) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            for item in zin.infolist():
                if item.filename != largest.filename:
                    zout.writestr(item, zin.read(item.filename))
        h = hashlib.sha256()
        with zin.open(largest) as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                h.update(block)
        lib = folder / (Path(largest.filename).name + ".xz")
        with zin.open(largest) as src, written(lib) as tmp:
            xz_compress(src, tmp, preset)
    info = {
        "wheel": wheel.name,
        "wheel_sha256": digest,
        "rest": str(rest),
        "lib": str(lib),
        "path": largest.filename,
        "bytes": largest.file_size,
        "sha256": h.hexdigest(),
    }
    with written(info_file) as tmp:
        tmp.write_text(json.dumps(info, indent=1))
    return info


# ---- texts and the PyTorch reference --------------------------------------------------------


def every_length(texts: list[str], n: int | None) -> list[str]:
    """`n` texts spread evenly over the lengths (the shortest and the longest kept), in their
    file order; all of them without `n`."""
    if n is None or n >= len(texts):
        return texts
    by_length = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
    picked = {by_length[round(k * (len(texts) - 1) / max(n - 1, 1))] for k in range(n)}
    return [texts[i] for i in sorted(picked)]


def reference(spec_path: Path, n: int | None) -> tuple[list[str], Any, dict[str, Any]]:
    """The spec's validation texts and PyTorch's embeddings of them on this CPU, pooled,
    normalised and truncated as the release resolves them from the model's own files (what its
    serving.json will say: `pack` checks that it does)."""
    from hf2triton.kinds.base import read_lines
    from hf2triton.kinds.embedding import EmbeddingConfig, TorchEmbedder
    from hf2triton.spec.choose import kind_for
    from hf2triton.spec.release import load_spec

    spec = load_spec(spec_path)
    texts = every_length(read_lines(spec.validation.sentences, "validation.sentences"), n)
    model_dir, _ = spec.source.locate()
    cfg = kind_for(spec).resolve(str(model_dir))
    assert isinstance(cfg, EmbeddingConfig)
    log(f"PyTorch reference of {len(texts)} texts ({model_dir}) ...")
    embeddings = TorchEmbedder(model_dir, cfg).embed(texts).astype(np.float32)
    return texts, embeddings, cfg.to_dict()


# ---- the bundle, in parts -------------------------------------------------------------------


class PartWriter(io.RawIOBase):
    """A write-only stream cut into files of at most `limit` bytes (part-00, part-01, ...),
    hashing each part and the whole as it goes."""

    def __init__(self, folder: Path, limit: int):
        self.folder, self.limit = folder, limit
        self.parts: list[dict[str, Any]] = []
        self.whole = hashlib.sha256()
        self.size = 0
        self._file: IO[bytes] | None = None
        self._hash = hashlib.sha256()
        self._used = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            if self._file is None or self._used == self.limit:
                self._next()
            assert self._file is not None
            take = min(self.limit - self._used, len(view) - done)
            chunk = view[done : done + take]
            self._file.write(chunk)
            self._hash.update(chunk)
            self.whole.update(chunk)
            self._used += take
            done += take
        self.size += done
        return done

    def _next(self) -> None:
        self._finish()
        name = f"part-{len(self.parts):02d}"
        self.parts.append({"name": name})
        self._file = open(self.folder / name, "wb")
        self._hash, self._used = hashlib.sha256(), 0

    def _finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self.parts[-1].update(bytes=self._used, sha256=self._hash.hexdigest())
            self._file = None

    def close(self) -> None:
        self._finish()
        super().close()


def write_parts(members: dict[str, Path], folder: Path, limit: int) -> dict[str, Any]:
    """One uncompressed tar of `members` (arcname: file; each already compressed as suits it)
    written as parts of at most `limit` bytes into `folder`."""
    writer = PartWriter(folder, limit)
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for arcname, path in members.items():
            tar.add(path, arcname)
    writer.close()
    return {"bytes": writer.size, "sha256": writer.whole.hexdigest(), "parts": writer.parts}


def tar_gz(out: Path, entries: dict[str, Path]) -> Path:
    """A tar.gz of folders and files (graph weights barely compress: gzip is as good as xz here,
    and many times faster)."""
    with tarfile.open(out, "w:gz", compresslevel=6) as tar:
        for arcname, path in entries.items():
            tar.add(path, arcname, filter=lambda e: None if "__pycache__" in e.name else e)
    return out


def describe(members: dict[str, Path]) -> dict[str, Any]:
    return {
        name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for name, p in members.items()
    }


def replace_folder(build: Callable[[Path], None], output: Path) -> None:
    """`build` fills a folder beside `output` that then replaces it: a failed pack never leaves
    half a pack, and an earlier pack is replaced whole."""
    if output.exists() and any(output.iterdir()) and not (output / "manifest.json").is_file():
        raise SystemExit(f"pack: {output} is neither empty nor an earlier pack: choose --output")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        build(tmp)
        old = output.with_name(f".{output.name}.{os.getpid()}.old")
        if output.exists():
            os.rename(output, old)
        os.rename(tmp, output)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def rendered_with_reference(
    args: argparse.Namespace, work: Path, home: Path
) -> tuple[dict[str, Any], list[str], Any]:
    """The spec's GPU variant rendered into work/rendered, and PyTorch's reference computed
    meanwhile; checked to be made as the render serves (pooling, normalisation, truncation)."""
    spec = gpu_variant(Path(args.spec).resolve(), work / "gpu-spec.yaml")
    with ThreadPoolExecutor(1) as pool:
        referenced = pool.submit(reference, spec, args.texts)
        line = render(spec, work / "rendered", home)
        log(f"rendered: {line['candidate']}, {line['instance_count']} instances")
        texts, embeddings, cfg = referenced.result()
    # The release's name (its work folder in the home), which the stdout line leaves out.
    line["release"] = json.loads((work / "rendered" / "render.json").read_text())["release"]
    version_dir = work / "rendered" / "model_repository" / line["model_name"] / "1"
    settings = json.loads((version_dir / "serving.json").read_text())
    served = {k: settings.get(k) for k in cfg}
    if served != cfg:
        raise SystemExit(f"pack: the render serves {served}, the reference was made for {cfg}")
    return line, texts, embeddings


def bundle_members(
    args: argparse.Namespace, work: Path, home: Path, line: dict[str, Any]
) -> tuple[dict[str, Path], dict[str, Any]]:
    """Every file of the bundle (its name in the bundle: the file), each compressed as suits
    it, and what the manifest says of them."""
    triton, triton_info = trimmed_triton(args.python, args.xz_preset)
    numpy_wheel = Path(args.numpy_wheel) if args.numpy_wheel else downloaded(NUMPY, args.python)
    ort_wheel = Path(args.ort_wheel) if args.ort_wheel else downloaded(ORT_GPU, args.python)
    split = split_wheel(ort_wheel, args.xz_preset, work / "split" if args.ort_wheel else None)
    rendered = work / "rendered"
    members: dict[str, Path] = {
        "triton.tar.xz": triton,
        f"wheels/{numpy_wheel.name}": numpy_wheel,
        f"wheels/{ort_wheel.name}": Path(split["rest"]),
        "ort-lib.xz": Path(split["lib"]),
        "repository.tar.gz": tar_gz(
            work / "repository.tar.gz",
            {
                "model_repository": rendered / "model_repository",
                "render.json": rendered / "render.json",
            },
        ),
        "texts.json": work / "texts.json",
        "reference.f32": work / "reference.f32",
    }
    fp32: dict[str, Any] | None = None
    export = None if args.no_fp32 else plain_fp32_export(home, line["release"])
    if export is not None:
        (work / "fp32").mkdir()
        fp32 = fp32_for_the_trip(export, work / "fp32")
        members["plain-fp32.tar.gz"] = tar_gz(
            work / "plain-fp32.tar.gz",
            {n: work / "fp32" / n for n in ("model.onnx", "weights16.bin")},
        )
    elif not args.no_fp32:
        log("no plain fp32 export found in the render's home: the fp16/fp32 ratio is left out")
    return members, {
        "triton": triton_info,
        "wheels": [numpy_wheel.name, ort_wheel.name],
        "split_library": {k: split[k] for k in ("wheel", "path", "bytes", "sha256")},
        "plain_fp32": fp32,
        "members": describe(members),
    }


RENDER_FIELDS = ("model_name", "device", "candidate", "runtime", "metrics", "instance_count")


def pack(args: argparse.Namespace) -> dict[str, Any]:
    """Render, pack and write the parts and manifest.json into args.output; the manifest."""
    started = time.monotonic()
    if not 0 < args.part_mb <= MAX_PART_MB:
        raise SystemExit(f"pack: --part-mb {args.part_mb}: give 1 to {MAX_PART_MB}")
    home = Path(args.home).resolve()
    with tempfile.TemporaryDirectory(prefix="gpu-kit-") as scratch:
        work = Path(scratch)
        line, texts, embeddings = rendered_with_reference(args, work, home)
        (work / "texts.json").write_text(json.dumps(texts, ensure_ascii=False))
        # Raw little-endian float32 rows: check.py reads them without numpy.
        (work / "reference.f32").write_bytes(embeddings.astype("<f4").tobytes())
        members, described = bundle_members(args, work, home, line)
        manifest: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": args.python,
            "render": {k: line.get(k) for k in (*RENDER_FIELDS, "release_key")},
            "model_name": line["model_name"],
            "instance_count": int(line["instance_count"]),
            "texts": len(texts),
            "embedding_dim": int(embeddings.shape[1]),
            **described,
            "part_limit_bytes": args.part_mb * MB,
        }

        def build(folder: Path) -> None:
            log(f"writing parts of at most {args.part_mb} MB into {args.output} ...")
            manifest["bundle"] = write_parts(members, folder, args.part_mb * MB)
            manifest["parts"] = manifest["bundle"].pop("parts")
            manifest["join"] = [p["name"] for p in manifest["parts"]]
            (folder / "manifest.json").write_text(
                json.dumps(manifest, indent=1, ensure_ascii=False)
            )

        replace_folder(build, Path(args.output).resolve())
    manifest["seconds"] = round(time.monotonic() - started, 1)
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default=str(DEFAULT_SPEC), help="release spec (made a GPU variant)")
    p.add_argument("--output", default=str(DEFAULT_OUTPUT), help="the pack's folder (replaced)")
    p.add_argument("--home", default=str(CACHE / "home"), help="HF2TRITON_HOME of the render")
    p.add_argument("--part-mb", type=int, default=60, help="largest part, in MB (10^6 bytes)")
    p.add_argument("--texts", type=int, help="this many validation texts, spread over lengths")
    p.add_argument("--python", default="3.12", help="the GPU machine's Python (stub and wheels)")
    p.add_argument("--ort-wheel", help="this onnxruntime wheel instead of onnxruntime-gpu")
    p.add_argument("--numpy-wheel", help="this numpy wheel instead of numpy 1.26.4's")
    p.add_argument("--xz-preset", type=int, default=6, help="xz level of tritonserver and the lib")
    p.add_argument("--no-fp32", action="store_true", help="leave the plain fp32 graph out")
    args = p.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python):
        p.error(f"--python {args.python!r}: give a version such as 3.12")
    manifest = pack(args)
    summary = {
        "output": str(Path(args.output).resolve()),
        "parts": [(q["name"], q["bytes"]) for q in manifest["parts"]],
        "bytes": manifest["bundle"]["bytes"],
        "model_name": manifest["model_name"],
        "candidate": manifest["render"]["candidate"],
        "instance_count": manifest["instance_count"],
        "texts": manifest["texts"],
        "seconds": manifest["seconds"],
        "next": "python benchmarks/gpu/calls.py  (the device calls, in order)",
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
