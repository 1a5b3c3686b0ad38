"""Repository step: render the Triton model repository for a release from `model_repository/`
(config template and Python-backend model code) and the validated ONNX model.

Layout: `<out>/<model_name>/{config.pbtxt, warmup/, 1/{model.py, model.onnx, tokenizer.json,
serving.json}}`. The version directory is `1` here; deploy copies it in as the MLflow version.
"""

from __future__ import annotations

import json
import shutil
import string
import struct
import sys
from pathlib import Path
from typing import TypedDict

from prefect import task

from hf2triton.embeddings import EmbeddingConfig
from hf2triton.spec import DeploySpec
from hf2triton.workspace import cached_step, digest, sha256_file, source_digest, templates_dir
from tasks.common import NO_PREFECT_CACHE

TEMPLATE = "embedder"
WARMUP_BLOCK = string.Template(
    'model_warmup { name: "$name" batch_size: 1\n'
    '  inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 1 ] '
    'input_data_file: "$file" } } }'
)


class RepositoryResult(TypedDict):
    repository: str  # directory holding <model_name>/
    model_name: str
    files: dict[str, str]  # relative path -> sha256
    content_hash: str
    reused: bool


def encode_string_tensor(text: str) -> bytes:
    """One TYPE_STRING element as Triton reads it from a warmup file: u32 LE length, bytes."""
    data = text.encode("utf-8")
    return struct.pack("<I", len(data)) + data


def build_repository(
    model_name: str,
    onnx_path: str,
    tokenizer_dir: str,
    embedding: EmbeddingConfig,
    embedding_dim: int,
    deploy: DeploySpec,
    warmup_texts: list[str],
    work_root: str,
) -> RepositoryResult:
    """Render the Triton repository for one release."""
    src = templates_dir() / TEMPLATE
    tokenizer_json = Path(tokenizer_dir) / "tokenizer.json"
    batching = deploy.model_dump(include={
        "max_batch_size", "preferred_batch_sizes", "max_queue_delay_us", "instance_count",
        "intra_op_threads",
    })
    key = digest([
        model_name, sha256_file(onnx_path), sha256_file(tokenizer_json), embedding.to_dict(),
        embedding_dim, batching, warmup_texts,
        [sha256_file(p) for p in sorted(src.iterdir()) if p.is_file()],
        source_digest(sys.modules[__name__]),
    ])

    def build(out: Path) -> dict:
        model_dir = out / model_name
        version_dir = model_dir / "1"
        (model_dir / "warmup").mkdir(parents=True)
        version_dir.mkdir()
        shutil.copyfile(src / "model.py", version_dir / "model.py")
        shutil.copyfile(onnx_path, version_dir / "model.onnx")
        shutil.copyfile(tokenizer_json, version_dir / "tokenizer.json")
        serving = {**embedding.to_dict(), "intra_op_threads": deploy.intra_op_threads}
        (version_dir / "serving.json").write_text(json.dumps(serving, indent=1) + "\n")
        blocks = []
        for i, text in enumerate(warmup_texts):
            name = f"text_{i}.bin"
            (model_dir / "warmup" / name).write_bytes(encode_string_tensor(text))
            blocks.append(WARMUP_BLOCK.substitute(name=f"sample_{i}", file=name))
        config = string.Template((src / "config.pbtxt.template").read_text()).substitute(
            model_name=model_name,
            max_batch_size=deploy.max_batch_size,
            embedding_dim=embedding_dim,
            preferred_batch_sizes=", ".join(str(b) for b in deploy.preferred_batch_sizes),
            max_queue_delay_us=deploy.max_queue_delay_us,
            instance_count=deploy.instance_count,
            model_warmup="\n".join(blocks),
        )
        (model_dir / "config.pbtxt").write_text(config)
        return {}

    done = cached_step(work_root, "repository", key, build)
    files = {k: v for k, v in done.files.items()}
    return RepositoryResult(
        repository=str(done.path), model_name=model_name, files=files,
        content_hash=digest(files), reused=done.reused,
    )


repository = task(build_repository, name="build-repository", **NO_PREFECT_CACHE)
