"""serving.py's translation part: a Marian-sized translator (random weights, EOS suppressed)
served with batched greedy decoding against PyTorch `generate` in-process."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from harness import ROOT, VENV, log, release, server_pid, stop_server
from load import TritonGrpc
from serving_measure import point

from hf2triton.util.net import free_ports

NEW_TOKENS = 24


def marian_sized(out: Path) -> Path:
    """An M2M100 translator of Marian's size (d_model 512, 6+6 layers, 8 heads, FFN 2048, a
    58,101-row vocabulary) with random weights and the tiny test tokenizer. EOS is suppressed
    (min_length = max_length), so every output has NEW_TOKENS tokens: the throughput ratio
    compares the same work."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    from tests.tiny_models import build_tiny_m2m100

    build_tiny_m2m100(out)  # the tokenizer, and a tiny model replaced below
    tiny = M2M100Config.from_pretrained(out)
    config = M2M100Config(
        vocab_size=58101,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        max_position_embeddings=512,
        pad_token_id=tiny.pad_token_id,
        bos_token_id=tiny.bos_token_id,
        eos_token_id=tiny.eos_token_id,
        decoder_start_token_id=tiny.decoder_start_token_id,
        dropout=0.0,
    )
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(config).eval()
    model.generation_config.max_length = NEW_TOKENS + 1
    model.generation_config.min_length = NEW_TOKENS + 1
    model.generation_config.no_repeat_ngram_size = 0
    model.save_pretrained(out)
    return out


def translator_spec(model: Path, ports: list[int]) -> dict:
    """The translator's release spec: fp32, greedy, dynamic batches of up to 16."""
    http, grpc, metrics, api = ports
    return {
        "name": "bench-translator",
        "task": "translation",
        "source": {"path": str(model), "model_id": "bench/marian-sized"},
        "generation": {"target_lang": "sw", "max_new_tokens": NEW_TOKENS, "num_beams": 1},
        "quantization": {"method": "none"},
        "validation": {
            "sentences": str(ROOT / "releases" / "data" / "translation-validation-en.txt"),
            "smoke_sentences": 8,
        },
        "registry": {"model_name": "bench-translator"},
        "image": {"build": False},
        "deploy": {
            "http_port": http,
            "grpc_port": grpc,
            "metrics_port": metrics,
            "openai": {"port": api},
            "max_batch_size": 16,
            "preferred_batch_sizes": [8, 16],
            "max_queue_delay_us": 5000,
        },
    }


def pytorch_rates(model: Path, texts: list[str]) -> dict[str, float]:
    """PyTorch `generate` in-process, one sentence at a time: 16 in a row, and 4."""
    from hf2triton.kinds.translation import (
        GenerationSpec,
        TorchTranslator,
        resolve_translation_config,
    )

    cfg = resolve_translation_config(
        model, GenerationSpec(target_lang="sw", max_new_tokens=NEW_TOKENS, num_beams=1)
    )
    torch_model = TorchTranslator(model, cfg)
    torch_model.generate(texts[:1], batch_size=1)
    rates = {}
    for name, reps in (("pytorch_sequential_16", 16), ("pytorch_sequential_1", 4)):
        started = time.perf_counter()
        lengths = []
        for text in (texts * 4)[:reps]:
            lengths.append(len(torch_model.generate([text], batch_size=1)[0]))
        rates[name] = round(reps / (time.perf_counter() - started), 2)
        log(f"  {name}: {rates[name]:.2f} sentences/s ({set(lengths)} tokens each)")
    return rates


def translation(tmp: Path, seconds: float) -> dict:
    from hf2triton.kinds.base import read_lines

    model = marian_sized(tmp / "marian-sized")
    texts = read_lines(ROOT / "releases" / "data" / "translation-validation-en.txt", "t")
    ports = free_ports(4)
    grpc = ports[1]
    path = tmp / "translator.yaml"
    path.write_text(yaml.safe_dump(translator_spec(model, ports)))
    home = tmp / "translator-home"
    cli = [str(VENV / "hf2triton")]
    log("translation: releasing the Marian-sized translator (fp32, greedy)")
    summary, wall = release(cli, path, home, ROOT)
    try:
        served = [
            point(
                lambda n: TritonGrpc(f"127.0.0.1:{grpc}", "bench-translator", output="TRANSLATION"),
                texts,
                c,
                seconds,
                server_pid(home),
                "translation served",
            )
            for c in (1, 16)
        ]
    finally:
        stop_server(cli, home, ROOT)
    rates = pytorch_rates(model, texts)
    return {
        "model": "M2M100, d_model 512, 6+6 layers, vocab 58101, random weights",
        "new_tokens": NEW_TOKENS,
        "release_wall_s": wall,
        "served": served,
        **rates,
    }
