"""The ways generation.py measures: the release served through Triton (HTTP, gRPC) and the API
beside it, the engine in-process (the limit), PyTorch `generate`, and llama.cpp's own server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from generation_streams import Records, chat_stream_stamps, closed_loop, figures


class Served:
    """The release through Triton (HTTP generate_stream, a gRPC stream) or the API beside it."""

    def __init__(self, protocol: str, ports: dict[str, Any], model: str, max_new: int):
        self.protocol, self.ports, self.model, self.max_new = protocol, ports, model, max_new

    def run(self, prompts: list[str], streams: int) -> dict[str, Any]:
        return asyncio.run(self._run(prompts, streams))

    async def _run(self, prompts: list[str], streams: int) -> dict[str, Any]:
        import aiohttp

        if self.protocol == "grpc":
            return await self._grpc(prompts, streams)
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=900)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            one = self._http if self.protocol == "http" else self._openai
            return await closed_loop(lambda p: one(session, p), prompts, streams)

    async def _http(self, session: Any, prompt: str) -> list[float]:
        url = f"http://127.0.0.1:{self.ports['http_port']}/v2/models/{self.model}/generate_stream"
        body = {"text_input": prompt, "max_tokens": self.max_new, "stream": True}
        times: list[float] = []
        async with session.post(url, json=body) as r:
            if r.status != 200:
                raise RuntimeError(await r.text())
            async for line in r.content:
                if line.startswith(b"data:"):
                    ids = json.loads(line[5:]).get("output_ids", [])
                    n = sum(1 for i in (ids if isinstance(ids, list) else [ids]) if i >= 0)
                    times += [time.perf_counter()] * n
        return times

    async def _openai(self, session: Any, prompt: str) -> list[float]:
        url = f"http://127.0.0.1:{self.ports['openai']['port']}/v1/chat/completions"
        messages = [{"role": "user", "content": prompt}]
        return await chat_stream_stamps(session, url, self.model, messages, self.max_new)

    async def _grpc(self, prompts: list[str], streams: int) -> dict[str, Any]:
        import tritonclient.grpc as grpcclient
        import tritonclient.grpc.aio as aio

        url = f"127.0.0.1:{self.ports['grpc_port']}"
        clients = [aio.InferenceServerClient(url) for _ in range(streams)]
        free = list(clients)

        async def one(prompt: str) -> list[float]:
            client = free.pop()
            inputs = []
            for name, value, kind in (
                ("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
                ("max_tokens", np.array([[self.max_new]], np.int32), "INT32"),
                ("stream", np.array([[True]]), "BOOL"),
            ):
                x = grpcclient.InferInput(name, list(value.shape), kind)
                x.set_data_from_numpy(value)
                inputs.append(x)

            async def requests() -> Any:
                yield {"model_name": self.model, "inputs": inputs}

            times: list[float] = []
            try:
                async for result, error in client.stream_infer(requests()):
                    if error:
                        raise RuntimeError(str(error))
                    ids = result.as_numpy("output_ids")
                    n = int((ids >= 0).sum()) if ids is not None else 0
                    times += [time.perf_counter()] * n
                    if result.get_response().parameters["triton_final_response"].bool_param:
                        break
            finally:
                free.append(client)
            return times

        try:
            return await closed_loop(one, prompts, streams)
        finally:
            for c in clients:
                await c.close()


class InProcess:
    """OpenVINO GenAI's pipeline built from the version's serving.json as the serving core builds
    it (GenAIModel.pipeline), driven directly: the limit of what the served engine can do."""

    def __init__(self, version_dir: Path, max_new: int):
        from hf2triton import serving
        from hf2triton.serving import genai, runtimes
        from hf2triton.serving.causal import ChatTokenizer

        cfg = serving.read_settings(str(version_dir))
        files = runtimes.open_model(str(version_dir / cfg["onnx"]), runtimes.settings_of(cfg))
        assert isinstance(files, runtimes.GenAIModelFiles), "not an OpenVINO GenAI release"
        self.pipe = genai.GenAIModel(files).pipeline(
            int(cfg["max_rows"]), int(cfg["step_tokens"]), int(cfg["max_context"])
        )
        self.tokenizer = ChatTokenizer(str(version_dir / cfg["tokenizer_file"]), cfg["tokenizer"])
        self.eos, self.max_new = [int(e) for e in cfg["eos_token_ids"]], max_new
        self.precision = files.settings.precision

    def run(self, prompts: list[str], streams: int) -> dict[str, Any]:
        import openvino as ov
        import openvino_genai as ovg

        todo, records = list(prompts)[::-1], []
        live: dict[int, tuple[Any, float, list[float]]] = {}
        ids = iter(range(1, 1 << 30))
        started = time.perf_counter()
        while todo or live:
            while todo and len(live) < streams:
                cfg = ovg.GenerationConfig()
                cfg.max_new_tokens, cfg.do_sample = self.max_new, False
                cfg.set_eos_token_id(self.eos[0])
                cfg.stop_token_ids = set(self.eos)
                tokens = ov.Tensor(np.asarray([self.tokenizer.encode(todo.pop())], np.int64))
                rid = next(ids)
                live[rid] = (self.pipe.add_request(rid, tokens, cfg), time.perf_counter(), [])
            self.pipe.step()
            now = time.perf_counter()
            for rid, (handle, sent, times) in list(live.items()):
                while handle.can_read():
                    for out in handle.read().values():
                        times += [now] * len(out.generated_ids)
                if handle.get_status() != ovg.GenerationStatus.RUNNING:
                    records.append((sent, times))
                    del live[rid]
        return figures(records, time.perf_counter() - started)


class Torch:
    """transformers `generate` on left-padded batches as wide as the streams."""

    def __init__(self, model_dir: Path, max_new: int):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch, self.max_new = torch, max_new
        self.tok = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
        self.tok.pad_token = self.tok.pad_token or self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()

    def run(self, prompts: list[str], streams: int) -> dict[str, Any]:
        records: Records = []
        started = time.perf_counter()
        for i in range(0, len(prompts), streams):
            batch = prompts[i : i + streams]
            enc = self.tok(batch, return_tensors="pt", padding=True)
            sent = time.perf_counter()
            with self.torch.inference_mode():
                out = self.model.generate(
                    **enc,
                    do_sample=False,
                    max_new_tokens=self.max_new,
                    pad_token_id=self.tok.pad_token_id,
                )
            done = time.perf_counter()
            made = (out[:, enc["input_ids"].shape[1] :] != self.tok.pad_token_id).sum(dim=1)
            for n in made.tolist():  # a batch's tokens spread over its time
                records.append((sent, list(np.linspace(sent, done, int(n) + 1)[1:])))
        return figures(records, time.perf_counter() - started)


# llama.cpp's converter, told that a byte-level BPE tokenizer it does not know by its hash (the
# benchmark's own, trained here) splits text as GPT-2's does, which is what its pre-tokenizer is.
CONVERT = """
import runpy, sys
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
for cls in vars(base).values():
    if isinstance(cls, type) and "get_vocab_base_pre" in vars(cls):
        cls.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


class LlamaServer:
    """llama.cpp's own server on the same model converted to GGUF at `precision` (f32, bf16, or
    int8 as Q8_0), started per level with as many parallel slots as streams, 2 threads, greedy,
    streamed."""

    def __init__(self, source: Path, model_dir: Path, work: Path, precision: str, max_new: int):
        self.binary, self.max_new = source / "build" / "bin" / "llama-server", max_new
        outtype = {"fp32": "f32", "bf16": "bf16", "int8": "q8_0"}.get(precision, "f32")
        self.gguf = work / f"model-{outtype}.gguf"
        subprocess.run(
            [
                sys.executable,
                "-c",
                CONVERT,
                str(source),
                str(model_dir),
                "--outtype",
                outtype,
                "--outfile",
                str(self.gguf),
            ],
            check=True,
            capture_output=True,
        )

    def run(self, prompts: list[str], streams: int) -> dict[str, Any]:
        from hf2triton.util.net import free_port
        from hf2triton.util.waiting import http_ok, wait_for

        port = free_port()
        proc = subprocess.Popen(
            [
                str(self.binary),
                "-m",
                str(self.gguf),
                "--port",
                str(port),
                "-t",
                "2",
                "--parallel",
                str(streams),
                "--cont-batching",
                "-c",
                str(512 * streams),
                "--no-webui",
                "-ngl",
                "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(
                lambda: http_ok(f"http://127.0.0.1:{port}/health"),
                120,
                "llama-server did not start",
                proc,
            )
            return asyncio.run(self._run(port, prompts, streams))
        finally:
            proc.terminate()
            proc.wait(30)

    async def _run(self, port: int, prompts: list[str], streams: int) -> dict[str, Any]:
        import aiohttp

        async with aiohttp.ClientSession(
            # llama-server closes a connection after a stream: no reuse
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=900),
        ) as session:

            async def one(prompt: str) -> list[float]:
                body = {
                    "prompt": prompt,
                    "n_predict": self.max_new,
                    "stream": True,
                    "temperature": 0.0,
                    "return_tokens": True,
                    "cache_prompt": False,
                }
                times: list[float] = []
                async with session.post(f"http://127.0.0.1:{port}/completion", json=body) as r:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            event = json.loads(line[6:])
                            n = len(event.get("tokens") or ([] if event.get("stop") else [0]))
                            times += [time.perf_counter()] * n
                return times

            return await closed_loop(one, prompts, streams)
