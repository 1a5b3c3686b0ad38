"""What users would run instead of Triton: a plain FastAPI app that embeds one text per request
with the PyTorch model (transformers) or the exported ONNX model (ONNX Runtime), the same pooling
as the release (hf2triton.embeddings), answering JSON. One uvicorn worker, no batching.

    .venv/bin/python benchmarks/baseline_app.py --backend torch --model-dir DIR --port 9000
    curl -s -XPOST 127.0.0.1:9000/embed -d '{"text": "hello"}' -H 'content-type: application/json'
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    from hf2triton.kinds.embedding import TorchEmbedder
    from hf2triton.serving.embedding import Embedder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Req(BaseModel):  # module level: FastAPI resolves the (string) annotation from here
    text: str


def build_app(backend: str, model_dir: str, onnx_path: str | None, endpoint: str):
    from fastapi import FastAPI

    from hf2triton.kinds.embedding import TorchEmbedder, resolve_embedding_config

    cfg = resolve_embedding_config(model_dir)
    embedder: TorchEmbedder | Embedder
    if backend == "torch":
        embedder = TorchEmbedder(model_dir, cfg)
    else:
        from hf2triton.serving.embedding import Embedder

        assert onnx_path is not None, "--backend onnx needs --onnx"
        embedder = Embedder(onnx_path, str(Path(model_dir) / "tokenizer.json"), cfg.to_dict())
    embedder.embed(["warm up"])

    app = FastAPI()

    if endpoint == "async":
        # The model runs on the event loop, one request at a time, using all intra-op threads.
        @app.post("/embed")
        async def embed(req: Req) -> dict:
            return {"embedding": embedder.embed([req.text])[0].tolist()}
    else:
        # A plain `def` endpoint: FastAPI runs it in its thread pool, requests overlap.
        @app.post("/embed")
        def embed_in_thread(req: Req) -> dict:
            return {"embedding": embedder.embed([req.text])[0].tolist()}

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["torch", "onnx"], required=True)
    p.add_argument("--model-dir", required=True, help="the Hugging Face model directory")
    p.add_argument("--onnx", help="model.onnx for --backend onnx")
    p.add_argument("--endpoint", choices=["async", "sync"], default="async")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import uvicorn

    uvicorn.run(
        build_app(a.backend, a.model_dir, a.onnx, a.endpoint),
        host=a.host,
        port=a.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
