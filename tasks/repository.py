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

from hf2triton import seq2seq
from hf2triton.classification import ClassificationConfig
from hf2triton.embeddings import EmbeddingConfig
from hf2triton.spec import DeploySpec
from hf2triton.translation import TOKENIZER_DIR, TranslationConfig
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


def _task_files(onnx_path: str, export_dir: str,
                cfg: ClassificationConfig | TranslationConfig) -> tuple[str, dict[str, Path]]:
    """The template for a task and the files (name in the version directory -> source)."""
    if isinstance(cfg, ClassificationConfig):
        return "classifier", {"model.onnx": Path(onnx_path),
                              "tokenizer.json": Path(export_dir) / "tokenizer.json"}
    files = {"seq2seq.py": Path(seq2seq.__file__)}
    for name in seq2seq.ONNX_FILES.values():
        src = Path(onnx_path) / name
        for p in [src, *(q for q in src.parent.iterdir()
                         if q.name.startswith(name) and q.name != name)]:
            files[p.name] = p  # the ONNX file and its external data, if any
    tokenizer_dir = Path(export_dir) / TOKENIZER_DIR
    for p in sorted(tokenizer_dir.iterdir()):
        if p.is_file() and p.name != "plan.json":
            files[p.name] = p
    return "translator", files


def _task_serving(export_dir: str, cfg: ClassificationConfig | TranslationConfig,
                  deploy: DeploySpec) -> dict:
    if isinstance(cfg, ClassificationConfig):
        return {**cfg.to_dict(), "intra_op_threads": deploy.intra_op_threads}
    plan = json.loads((Path(export_dir) / TOKENIZER_DIR / "plan.json").read_text())
    return {
        "tokenizer": plan, "files": dict(seq2seq.ONNX_FILES),
        "max_input_length": cfg.max_input_length, "decode": cfg.decode,
        "target_langs": cfg.target_langs, "max_new_tokens_limit": cfg.max_new_tokens_limit,
        "intra_op_threads": deploy.intra_op_threads,
    }


def build_task_repository(
    model_name: str,
    onnx_path: str,
    export_dir: str,
    cfg: ClassificationConfig | TranslationConfig,
    deploy: DeploySpec,
    warmup_texts: list[str],
    work_root: str,
) -> RepositoryResult:
    """Render the Triton repository of a text-classification or translation release:
    `model_repository/classifier` or `model_repository/translator` with the validated ONNX
    file(s), the tokenizer files and serving.json (labels, or tokenizer plan and decoding)."""
    template, files = _task_files(onnx_path, export_dir, cfg)
    src = templates_dir() / template
    serving = _task_serving(export_dir, cfg, deploy)
    batching = deploy.model_dump(include={
        "max_batch_size", "preferred_batch_sizes", "max_queue_delay_us", "instance_count",
    })
    key = digest([
        model_name, template, {n: sha256_file(p) for n, p in files.items()}, serving, batching,
        warmup_texts, [sha256_file(p) for p in sorted(src.iterdir()) if p.is_file()],
        source_digest(sys.modules[__name__]),
    ])

    def build(out: Path) -> dict:
        model_dir = out / model_name
        version_dir = model_dir / "1"
        (model_dir / "warmup").mkdir(parents=True)
        version_dir.mkdir()
        shutil.copyfile(src / "model.py", version_dir / "model.py")
        for name, path in files.items():
            shutil.copyfile(path, version_dir / name)
        (version_dir / "serving.json").write_text(json.dumps(serving, indent=1) + "\n")
        blocks = []
        for i, text in enumerate(warmup_texts):
            name = f"text_{i}.bin"
            (model_dir / "warmup" / name).write_bytes(encode_string_tensor(text))
            blocks.append(WARMUP_BLOCK.substitute(name=f"sample_{i}", file=name))
        config = string.Template((src / "config.pbtxt.template").read_text()).substitute(
            model_name=model_name,
            max_batch_size=deploy.max_batch_size,
            num_labels=len(cfg.labels) if isinstance(cfg, ClassificationConfig) else 0,
            preferred_batch_sizes=", ".join(str(b) for b in deploy.preferred_batch_sizes),
            max_queue_delay_us=deploy.max_queue_delay_us,
            instance_count=deploy.instance_count,
            model_warmup="\n".join(blocks),
        )
        (model_dir / "config.pbtxt").write_text(config)
        return {}

    done = cached_step(work_root, "repository", key, build)
    files_done = dict(done.files)
    return RepositoryResult(
        repository=str(done.path), model_name=model_name, files=files_done,
        content_hash=digest(files_done), reused=done.reused,
    )


task_repository = task(build_task_repository, name="build-repository", **NO_PREFECT_CACHE)
