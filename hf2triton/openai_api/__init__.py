"""An OpenAI-compatible HTTP API in front of a Triton server that serves hf2triton releases, so
the clients teams already have (the openai SDK, LangChain, LlamaIndex, LiteLLM, AIPerf) can use
a release: `/v1/models`, `/v1/embeddings` (embedders), `/v1/chat/completions` and
`/v1/completions` (text generators, streamed as server-sent events), `/v1/rerank` (rerankers,
in Cohere's, Jina's and text-embeddings-inference's shape) and `/predict` (classifiers, in
text-embeddings-inference's shape). It reaches Triton over gRPC, streaming for generation, so
what it returns is what the gate and the smoke test checked.

It runs beside tritonserver in the serving environment, as a package of its own (copied as
`hf2triton_openai`: FastAPI, uvicorn, tritonclient's asyncio gRPC and numpy only; relative
imports), like the serving core Triton's Python backend runs:

    python -m hf2triton_openai --triton 127.0.0.1:8001 --port 9000
"""

PACKAGE_DIR = "hf2triton_openai"  # its name where it runs apart from hf2triton
