"""Serving runtimes (hf2triton/serving/runtimes/) through the serving core, for every kind:
OpenVINO on CPU answers as ONNX Runtime does, its precision is pinned and read back, bad settings
and a runtime that cannot run here fail with clear errors, and a real tritonserver runs the
runtime its serving.json names. Tiny real models (tests/tiny_models.py) exported as the release
exports them."""

from __future__ import annotations

import json
import shutil
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from hf2triton import serving
from hf2triton.kinds import Data
from hf2triton.serving import runtimes
from hf2triton.spec import kind_for, parse_spec
from tests.tiny_models import (
    CORPUS,
    SEQ2SEQ_CORPUS,
    build_tiny_bert,
    build_tiny_classifier,
    build_tiny_cross_encoder,
    build_tiny_llama,
    build_tiny_m2m100,
    build_tiny_marian,
    rerank_pairs,
)

TEXTS = list(dict.fromkeys(CORPUS)) + ["a", "", "word " * 100, "ok thanks", "prices 12.5%"]
ORT_FP32 = {"name": "onnxruntime", "device": "cpu", "precision": "fp32"}
OV_F32 = {"name": "openvino", "device": "cpu", "precision": "f32"}
# (spec task, fixture builder, spec sections) of each kind
KINDS = {
    "embedding": ("feature-extraction", build_tiny_bert, {}),
    "classification": ("text-classification", build_tiny_classifier, {}),
    "reranking": ("text-ranking", build_tiny_cross_encoder, {}),
    "translation": ("translation", build_tiny_m2m100, {"generation": {"target_lang": "sw"}}),
    # Marian's decoder ends in an Add of an all-zero bias, which OpenVINO folds away when it
    # compiles, leaving `logits` a second name: its outputs must still come back as `logits`.
    "translation-marian": ("translation", build_tiny_marian, {}),
    "translation-marian-untied": (
        "translation",
        lambda out: build_tiny_marian(out, tied=False),
        {},
    ),
}
# Graph-level only (their served answers are compared in test_generation_core.py).
GRAPH_KINDS = {**KINDS, "text_generation": ("text-generation", build_tiny_llama, {})}


def _groups() -> list[tuple[str, list[str]]]:
    groups: dict[str, list[str]] = {}
    for query, passage in rerank_pairs():
        groups.setdefault(query, []).append(passage)
    return list(groups.items())


def _items(kind: str) -> list:
    if kind == "reranking":
        return _groups()
    if kind == "text_generation":
        return ["Once upon a time", "The quick brown fox"]
    return list(dict.fromkeys(SEQ2SEQ_CORPUS)) if kind.startswith("translation") else TEXTS


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Per kind, built on first use: (kind, cfg, onnx path, export dir)."""
    from hf2triton.release.export import export_model
    from hf2triton.spec import ExportSpec

    done = {}

    def get(name: str):
        if name not in done:
            task, build, sections = GRAPH_KINDS[name]
            root = tmp_path_factory.mktemp(name)
            model_dir = build(root / "model")
            kind = kind_for(
                parse_spec(
                    {
                        "name": f"tiny-{name}",
                        "task": task,
                        "source": {"path": str(model_dir)},
                        "registry": {"model_name": f"tiny-{name}"},
                        "validation": {"sentences": str(root / "unused.txt")},
                        **sections,
                    }
                )
            )
            cfg = kind.resolve(str(model_dir))
            out = export_model(
                kind,
                {"model_dir": str(model_dir), "content_hash": name},
                ExportSpec(opset=18, atol=1e-3),
                cfg,
                Data(_items(name)),
                str(root / "work"),
            )
            done[name] = (kind, cfg, out["onnx_path"], out["export_dir"])
        return done[name]

    return get


def load(exported, kind_name: str, runtime: dict | None, **extra):
    """The serving core's model of a kind on `runtime`, loaded as the gate loads a candidate."""
    kind, cfg, onnx_path, export_dir = exported(kind_name)
    settings = {**kind.serving_json(cfg, export_dir, max_batch_tokens=256), **extra}
    if runtime is not None:
        settings["runtime"] = runtime
    return kind.open_candidate(onnx_path, export_dir, settings)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def answers(model, kind_name: str) -> np.ndarray | list:
    """What a user of each kind reads: embeddings, label scores, relevance scores, texts."""
    items = _items(kind_name)
    if kind_name == "embedding":
        return model.embed(items)
    if kind_name == "classification":
        return model.probs(items)
    if kind_name == "reranking":
        return [np.asarray(s) for s in model.rerank(items)]
    return model.translate(items, num_beams=1)


@pytest.mark.parametrize("kind_name", list(KINDS))
def test_openvino_f32_answers_as_onnxruntime_fp32(exported, kind_name):
    ort_model = load(exported, kind_name, ORT_FP32)
    ov_model = load(exported, kind_name, OV_F32)
    want, got = answers(ort_model, kind_name), answers(ov_model, kind_name)
    if kind_name.startswith("translation"):
        assert got == want  # greedy search picks the same token at every step
        assert len(set(want)) > 3
    elif kind_name == "reranking":
        for g, w in zip(got, want):
            assert np.argsort(-g).tolist() == np.argsort(-w).tolist()
        assert cosine_rows(np.concatenate(got)[None], np.concatenate(want)[None]).min() >= 0.9999
        assert np.abs(np.concatenate(got) - np.concatenate(want)).max() < 1e-3
    else:
        assert got.shape == want.shape
        assert cosine_rows(got, want).min() >= 0.9999
        if kind_name == "classification":
            assert (got.argmax(1) == want.argmax(1)).all()
    # Each model ran where its settings said.
    sessions = (
        ov_model.model.sessions.values()
        if kind_name.startswith("translation")
        else [ov_model.text.session]
    )
    assert {s.in_use for s in sessions} == {"OpenVINO CPU f32"}


def graph_feeds(path: str) -> dict[str, np.ndarray]:
    """Inputs for one exported graph, shaped from its own declared inputs: 2 rows of 5 tokens
    (1 after a cache of 3), a source of 4 tokens, random states, seeded."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    inputs = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs()
    cached = any(i.name.startswith("past_key_values.") for i in inputs)
    rows, tokens, past, source = 2, 1 if cached else 5, 3, 4
    seq2seq = any(i.name.startswith("encoder_") for i in inputs) or "encoder" in path
    feeds = {}
    for i in inputs:
        ints = "int" in i.type
        if i.name.startswith("past_key_values."):
            shape = (rows, i.shape[1], source if ".encoder." in i.name else past, i.shape[3])
        elif i.name == "encoder_hidden_states":
            shape = (rows, source, i.shape[2])
        elif i.name == "encoder_attention_mask" or (seq2seq and i.name == "attention_mask"):
            shape = (rows, source)
        elif i.name == "attention_mask":
            shape = (rows, past * cached + tokens)
        else:
            shape = (rows, source if seq2seq and not cached and "encoder" in path else tokens)
        if i.name == "position_ids":
            value = np.tile(np.arange(past * cached, past * cached + tokens), (rows, 1))
        elif "mask" in i.name:
            value = np.ones(shape)
        elif i.name == "token_type_ids":
            value = np.zeros(shape)
        elif ints:
            value = rng.integers(3, 30, shape)
        else:
            value = rng.standard_normal(shape)
        feeds[i.name] = value.astype(np.int64 if ints else np.float32)
    return feeds


def graph_files(export_dir: str) -> list[Path]:
    return sorted(p for p in Path(export_dir).glob("*.onnx") if "merged" not in p.name)


@pytest.mark.parametrize("kind_name", list(GRAPH_KINDS))
def test_every_runtime_hands_back_each_graphs_outputs_under_their_onnx_names(exported, kind_name):
    """Each exported graph of each kind (both translators' encoder and decoders, tied and untied
    embeddings), opened by every runtime and precision this machine offers: the outputs come
    back by the ONNX file's names, in its order, and at fp32 with ONNX Runtime's values."""
    kind, cfg, onnx_path, export_dir = exported(kind_name)
    from hf2triton.runtimes import PLUGINS
    from hf2triton.runtimes.base import PLAIN

    offered = runtimes.runtime_info()
    # Every runtime that runs an ONNX graph (not OpenVINO GenAI: it serves a whole model).
    tried = [
        (name, precision)
        for name, devices in offered.items()
        for precision in devices.get("cpu", {}).get("precisions", [])
        if PLUGINS.load(name).runs({"graph": PLAIN}, precision)
        and (name != "onnxruntime" or precision == "fp32")
    ]
    assert ("openvino", "fp32") in tried
    for path in graph_files(export_dir):
        feeds = graph_feeds(str(path))
        reference = runtimes.open_model(str(path), runtimes.RuntimeSettings())
        names = list(reference.outputs)
        want = dict(zip(names, reference.run(None, feeds)))
        for name, precision in tried:
            session = runtimes.open_model(
                str(path), runtimes.RuntimeSettings(name, "cpu", precision)
            )
            assert list(session.outputs) == names, (path.name, name, precision)
            try:
                got = dict(zip(names, session.run(None, feeds)))
            except RuntimeError as exc:
                # OpenVINO 2026.4's CPU plugin cannot run M2M100's decoder_with_past in bf16
                # ("SetLoadStoreScalar expects static shapes"): the gate refuses such a
                # candidate with that error (tests/release/test_gate.py). At fp32 everything runs.
                assert precision != "fp32", f"{path.name} on {name} fp32: {exc}"
                continue
            picked = dict(zip(names[::-1], session.run(names[::-1], feeds)))
            for output in names:
                assert got[output].shape == want[output].shape, (path.name, output)
                assert np.isfinite(got[output]).all()
                assert np.array_equal(picked[output], got[output])  # asked by name, any order
                if precision == "fp32":
                    np.testing.assert_allclose(
                        got[output],
                        want[output],
                        atol=1e-3,
                        rtol=1e-3,
                        err_msg=f"{path.name} {output} on {name}",
                    )


def test_openvino_reads_its_own_ir_as_well_as_onnx(exported, tmp_path):
    import openvino as ov

    kind, cfg, onnx_path, export_dir = exported("embedding")
    ov.save_model(ov.Core().read_model(onnx_path), str(tmp_path / "model.xml"))
    settings = {**kind.serving_json(cfg, export_dir, max_batch_tokens=256), "runtime": OV_F32}
    from_ir = kind.open_candidate(str(tmp_path / "model.xml"), export_dir, settings)
    want = load(exported, "embedding", ORT_FP32).embed(TEXTS)
    assert cosine_rows(from_ir.embed(TEXTS), want).min() >= 0.9999


def test_a_session_shared_between_threads_answers_each(exported):
    """The gate and Triton call one at a time; a caller with threads (a benchmark's app) may not."""
    from concurrent.futures import ThreadPoolExecutor

    model = load(exported, "embedding", OV_F32)
    want = model.embed(TEXTS)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: model.embed([t])[0], TEXTS))
    assert cosine_rows(np.stack(got), want).min() >= 0.9999


def test_precision_is_pinned_and_read_back(exported):
    """OpenVINO's CPU plugin picks bf16 by itself where the CPU has it: f32 asked is f32 run, and
    bf16 runs only where the CPU offers it, else it is refused with the reason."""
    f32 = load(exported, "embedding", OV_F32).text.session
    assert f32.compiled.get_property("INFERENCE_PRECISION_HINT").to_string() == "f32"
    offered = runtimes.runtime_info()["openvino"]["cpu"]
    bf16_settings = {**OV_F32, "precision": "bf16"}
    if "bf16" in offered["precisions"]:
        model = load(exported, "embedding", bf16_settings)
        session = model.text.session
        assert session.compiled.get_property("INFERENCE_PRECISION_HINT").to_string() == "bf16"
        assert session.in_use == "OpenVINO CPU bf16"
        want = load(exported, "embedding", ORT_FP32).embed(TEXTS)
        assert cosine_rows(model.embed(TEXTS), want).min() > 0.99
    else:
        with pytest.raises(runtimes.RuntimeUnavailable, match="does not offer bf16"):
            load(exported, "embedding", bf16_settings)
    # Threads, streams and the performance hint reach the compiled model as given (OpenVINO
    # gives each stream a thread at least: 2 streams need 2 threads).
    tuned = load(
        exported, "embedding", {**OV_F32, "threads": 2, "streams": 2, "hint": "THROUGHPUT"}
    ).text.session
    assert int(tuned.compiled.get_property("INFERENCE_NUM_THREADS")) == 2
    assert int(tuned.compiled.get_property("NUM_STREAMS")) == 2
    assert str(tuned.compiled.get_property("PERFORMANCE_HINT")).endswith("THROUGHPUT")


def test_two_streams_answer_as_one(exported):
    """Sub-batches run side by side on two streams come back to their own rows."""
    one = load(exported, "embedding", {**OV_F32, "streams": 1, "hint": "LATENCY"}).embed(
        TEXTS[::-1]
    )
    two_model = load(
        exported, "embedding", {**OV_F32, "streams": 2, "hint": "THROUGHPUT"}, max_batch_tokens=32
    )
    assert two_model.text.session.jobs == 2
    assert cosine_rows(two_model.embed(TEXTS[::-1]), one).min() >= 0.9999


def test_a_row_cap_splits_sub_batches_without_changing_answers(exported):
    """A runtime whose engines take at most N rows (TensorRT's max_rows) gets sub-batches of at
    most N rows; every text keeps its own answer."""
    want = load(exported, "embedding", ORT_FP32).embed(TEXTS)
    capped = load(exported, "embedding", ORT_FP32)
    capped.text.session.max_rows = 3  # as OnnxRuntimeTensorrt.open sets it
    seen = []
    run_many = capped.text.session.run_many
    capped.text.session.run_many = lambda outs, feeds: (
        seen.extend(len(f["input_ids"]) for f in feeds) or run_many(outs, feeds)
    )
    assert cosine_rows(capped.embed(TEXTS), want).min() > 0.999999
    assert max(seen) == 3 and sum(seen) == len(TEXTS)


def test_serving_json_without_a_runtime_runs_onnxruntime_cpu_fp32(exported):
    """Versions released before runtimes were plug-ins (the champion comparison loads them)."""
    model = load(exported, "embedding", None, intra_op_threads=1)
    session = model.text.session
    assert session.in_use == "CPUExecutionProvider"
    assert session.settings.to_dict() == {**ORT_FP32, "threads": 1}
    want = load(exported, "embedding", ORT_FP32).embed(TEXTS)
    assert cosine_rows(model.embed(TEXTS), want).min() > 0.999999


@pytest.mark.parametrize(
    "runtime, message",
    [
        (
            {"name": "tensorflow", "precision": "fp32"},
            "runtime 'tensorflow' is unknown: use one of onnxruntime, onnxruntime-cuda, "
            "onnxruntime-tensorrt, openvino",
        ),
        (
            {"name": "openvino", "precision": "int4"},
            "runtime openvino: precision 'int4' is not offered (it runs fp32, bf16, fp16)",
        ),
        (
            {"name": "onnxruntime-tensorrt", "precision": "fp32"},
            "runtime onnxruntime-tensorrt: precision 'fp32' is not offered (it runs fp16)",
        ),
        ({"name": "openvino"}, "serving.json runtime openvino names no precision: pin one of"),
        ({"precision": "fp32"}, 'names no runtime: add "name", one of onnxruntime, '),
        (
            {"name": "onnxruntime", "precision": "fp32", "streams": 2},
            "runtime onnxruntime has no setting streams (its settings: threads)",
        ),
        (
            {"name": "openvino", "precision": "fp32", "hint": "FASTEST"},
            "runtime openvino: hint 'FASTEST' is not one of LATENCY, THROUGHPUT",
        ),
        (
            {"name": "openvino", "precision": "fp32", "device": "gpu"},
            "runtime openvino: device 'gpu' is not one of cpu",
        ),
    ],
)
def test_bad_runtime_settings_are_refused_naming_the_setting(exported, runtime, message):
    with pytest.raises(ValueError) as err:
        load(exported, "embedding", runtime)
    assert message in str(err.value)


@pytest.mark.parametrize("kind_name", ["embedding", "translation"])
def test_cuda_runtime_never_runs_silently_on_the_cpu(exported, kind_name):
    import onnxruntime as ort

    runtime = {"name": "onnxruntime-cuda", "device": "cuda", "precision": "fp32"}
    if "CUDAExecutionProvider" in ort.get_available_providers():  # a GPU machine
        model = load(exported, kind_name, runtime)
        sessions = (
            model.model.sessions.values() if kind_name == "translation" else [model.text.session]
        )
        assert {s.in_use for s in sessions} == {"CUDAExecutionProvider"}
        return
    with pytest.raises(runtimes.RuntimeUnavailable) as err:
        load(exported, kind_name, runtime)
    assert "CUDAExecutionProvider is not in use" in str(err.value)
    assert "fell back to CPUExecutionProvider" in str(err.value)


def test_tensorrt_needs_a_writable_engine_cache(exported, tmp_path):
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    runtime = {
        "name": "onnxruntime-tensorrt",
        "device": "cuda",
        "precision": "fp16",
        "cache_dir": str(not_a_dir / "engines"),
    }
    with pytest.raises(runtimes.RuntimeUnavailable, match="engine cache .* is not writable"):
        load(exported, "embedding", runtime)
    # With a writable cache, a machine without TensorRT says so instead of running on the CPU.
    runtime["cache_dir"] = str(tmp_path / "engines")
    with pytest.raises(
        runtimes.RuntimeUnavailable, match="TensorrtExecutionProvider is not in use"
    ):
        load(exported, "embedding", runtime)
    # What TensorRT would be given (unverified here: TensorRT cannot be installed): fp16, the
    # engine cache, and one profile over the graph's own inputs, rows capped at max_rows.
    trt = runtimes.RUNTIMES["onnxruntime-tensorrt"]
    settings = runtimes.settings_of({"runtime": {**runtime, "max_rows": 16}})
    onnx_path = exported("embedding")[2]
    wanted = {
        n: ((1, 1), (1 << 16, 64))
        for n in ("input_ids", "attention_mask", "token_type_ids", "pixel_values")
    }
    shapes = trt.engine_shapes(onnx_path, settings, wanted)
    assert shapes == {
        n: ((1, 1), (16, 64)) for n in ("input_ids", "attention_mask", "token_type_ids")
    }
    (name, options), *rest = trt.providers(settings, shapes)
    assert name == "TensorrtExecutionProvider"
    assert [p if isinstance(p, str) else p[0] for p in rest] == [
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    assert options["trt_fp16_enable"] is True
    assert options["trt_engine_cache_enable"] is True
    assert options["trt_engine_cache_path"] == str(tmp_path / "engines")
    assert (
        options["trt_profile_min_shapes"] == "input_ids:1x1,attention_mask:1x1,token_type_ids:1x1"
    )
    assert (
        options["trt_profile_max_shapes"]
        == "input_ids:16x64,attention_mask:16x64,token_type_ids:16x64"
    )


def test_runtime_info_lists_what_this_machine_offers():
    import openvino as ov

    info = runtimes.runtime_info()
    assert info["onnxruntime"]["cpu"]["precisions"] == ["fp32", "fp16"]
    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    assert ("bf16" in info["openvino"]["cpu"]["precisions"]) == ("BF16" in caps)
    assert "fp32" in info["openvino"]["cpu"]["precisions"]


# --- a real tritonserver --------------------------------------------------------------------------


def _infer(url: str, model: str, text: str) -> np.ndarray:
    import tritonclient.http as httpclient

    with closing(httpclient.InferenceServerClient(url=url)) as client:
        x = httpclient.InferInput("TEXT", [1, 1], "BYTES")
        x.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
        return client.infer(model, [x]).as_numpy("EMBEDDING")[0]


@pytest.mark.e2e
def test_triton_serves_the_runtime_serving_json_names(exported, tmp_path, monkeypatch):
    """A version whose serving.json names OpenVINO answers in Triton exactly as the serving core
    does in-process on OpenVINO (bf16 where the CPU has it: then visibly not ONNX Runtime's
    answers); a version naming a runtime this machine lacks does not load, with the reason."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from hf2triton.release.repository import BATCHING, build_repository
    from hf2triton.release.shipped import Shipped
    from hf2triton.targets import triton_local
    from tests.conftest import free_port, wait_http

    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path / "home"))
    kind, cfg, onnx_path, export_dir = exported("embedding")
    precision = (
        "bf16" if "bf16" in runtimes.runtime_info()["openvino"]["cpu"]["precisions"] else "fp32"
    )
    ov = {**OV_F32, "precision": precision}
    knobs = {
        "max_batch_size": 8,
        "preferred_batch_sizes": [8],
        "max_queue_delay_us": 100,
        "instance_count": 1,
        "intra_op_threads": 0,
        "max_batch_tokens": 256,
        "device": "cpu",
        "gpus": None,
    }
    assert set(knobs) == set(BATCHING)
    dim = load(exported, "embedding", ORT_FP32).embed(["x"]).shape[1]
    repo = tmp_path / "repo"
    repo.mkdir()
    runtimes_of = {
        "tiny-openvino": ov,
        "tiny-cuda": {"name": "onnxruntime-cuda", "device": "cuda", "precision": "fp32"},
    }
    for name, runtime in runtimes_of.items():
        shipped = Shipped(
            kind, name, onnx_path, export_dir, cfg, runtime, {"embedding_dim": dim}, {}
        )
        built = build_repository(shipped, name, knobs, TEXTS[:2], str(tmp_path / "builds"))
        shutil.copytree(Path(built["repository"]) / name, repo / name)
        # The gate's runtime is what serving.json names.
        path = repo / name / "1" / serving.SERVING_FILE
        assert json.loads(path.read_text())["runtime"] == runtime
        # The serving core's runtimes are a package: every module of it is in the version.
        shipped = repo / name / "1" / serving.PACKAGE_DIR / "runtimes"
        core = Path(serving.__file__).parent / "runtimes"
        assert {p.name for p in shipped.glob("*.py")} == {p.name for p in core.glob("*.py")}
    ports = [free_port() for _ in range(3)]
    proc = triton_local.launch(
        repo, triton_local.ServerPorts("127.0.0.1", *ports), tmp_path / "server.log"
    )
    url = f"127.0.0.1:{ports[0]}"
    try:
        wait_http(f"http://{url}/v2/health/live", timeout=120, proc=proc)
        with closing(httpclient.InferenceServerClient(url=url, network_timeout=300)) as client:
            client.load_model("tiny-openvino")
            with pytest.raises(InferenceServerException):
                client.load_model("tiny-cuda")
        served = np.stack([_infer(url, "tiny-openvino", t) for t in TEXTS])
    finally:
        triton_local.terminate(proc)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "CUDAExecutionProvider is not in use" in log
    # In-process, one request at a time as the server got them.
    model = load(exported, "embedding", ov)
    want = np.concatenate(
        [
            model.answer([{"TEXT": np.array([[t.encode()]], dtype=np.object_)}])[0]["EMBEDDING"]
            for t in TEXTS
        ]
    )
    assert np.abs(served - want).max() < 1e-6
    if precision == "bf16":
        onnxruntime = load(exported, "embedding", ORT_FP32).embed(TEXTS)
        assert np.abs(served - onnxruntime).max() > 1e-4


def test_the_fp16_graph_of_a_gpu_release_passes_a_cpu_numerics_check(exported, tmp_path):
    """What `deploy.gpu_gate: cpu-numerics` gates: the fp16 graph (inputs and outputs kept in
    fp32, the overflow-prone ops in fp32) run by ONNX Runtime on the CPU through its casts. It
    checks the graph's storage and structure, not the GPU kernels' numerics (no GPU here)."""
    from hf2triton.runtimes.onnxruntime_cuda import FP16_KEEP, fp16_graph

    kind, cfg, onnx_path, export_dir = exported("embedding")
    half = fp16_graph(onnx_path, str(tmp_path / "work"))
    assert half["method"] == "fp16" and half["size_bytes"] < half["fp32_bytes"]
    import onnx

    graph = onnx.load(half["onnx_path"]).graph
    assert graph.input[0].type.tensor_type.elem_type != onnx.TensorProto.FLOAT16  # kept types
    assert not any(n.op_type in FP16_KEEP and n.name.endswith("_fp16") for n in graph.node)
    settings = {
        **kind.serving_json(cfg, export_dir, max_batch_tokens=256),
        "runtime": {"name": "onnxruntime", "device": "cpu", "precision": "fp16"},
    }
    half_model = kind.open_candidate(half["onnx_path"], export_dir, settings)
    full = load(exported, "embedding", ORT_FP32).embed(TEXTS)
    got = half_model.embed(TEXTS)
    assert np.isfinite(got).all()
    assert cosine_rows(full, got).min() > 0.999


def test_the_fused_fp16_graph_of_a_gpu_release_is_fused_and_passes_a_cpu_numerics_check(
    exported, tmp_path
):
    """The GPU's fast graph: ONNX Runtime's transformer optimizer fuses the embeddings, each
    layer's attention, LayerNorms (with their residual Adds) and GELUs into its own kernels
    (heads and hidden size read from config.json), then the graph goes to fp16 with fp32 inputs
    and outputs. ONNX Runtime's CPU provider runs those kernels too (through casts where a kernel
    has no fp16 version): the gate's CPU numerics check. Its GPU speed is not measured here."""
    import collections

    import onnx

    from hf2triton.runtimes.onnxruntime_cuda import fused_fp16_graph

    kind, cfg, onnx_path, export_dir = exported("embedding")
    fused = fused_fp16_graph(onnx_path, export_dir, str(tmp_path / "work"))
    assert fused["method"] == "fp16/fused" and fused["graph"] == "onnx-fp16-ort"
    assert fused["size_bytes"] < fused["fp32_bytes"]
    graph = onnx.load(fused["onnx_path"]).graph
    ops = collections.Counter(n.op_type for n in graph.node)
    layers = 2  # tests/tiny_models.py build_tiny_bert
    assert ops["EmbedLayerNormalization"] == 1
    assert ops["Attention"] == layers and ops["BiasGelu"] == layers
    assert ops["SkipLayerNormalization"] == 2 * layers
    # Nothing left of the decomposed attention, LayerNorm or GELU.
    assert not {"Softmax", "ReduceMean", "Pow", "Erf", "Sqrt", "Div"} & set(ops)
    assert any(
        t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer
    )  # weights in fp16
    kept = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    assert onnx.TensorProto.FLOAT16 not in kept.values()  # the serving core feeds and reads fp32
    assert kept["last_hidden_state"] == onnx.TensorProto.FLOAT
    settings = {
        **kind.serving_json(cfg, export_dir, max_batch_tokens=256),
        "runtime": {"name": "onnxruntime", "device": "cpu", "precision": "fp16"},
    }
    got = kind.open_candidate(fused["onnx_path"], export_dir, settings).embed(TEXTS)
    full = load(exported, "embedding", ORT_FP32).embed(TEXTS)
    assert np.isfinite(got).all()
    assert cosine_rows(full, got).min() > 0.999


@pytest.mark.parametrize(
    "change, why",
    [
        ({"model_type": "llama"}, "has no fusions for model_type 'llama'"),
        ({"num_attention_heads": None}, "gives no usable attention shape (heads missing"),
        ({"num_attention_heads": 3}, "gives no usable attention shape (heads 3, hidden size 32"),
    ],
)
def test_an_architecture_the_optimizer_cannot_fuse_is_refused_with_why(
    exported, tmp_path, change, why
):
    """The fused variant of a model the optimizer does not know is a refused candidate (the
    gate names why), not a failed release: the other GPU graphs are still tried."""
    import json

    from hf2triton.runtimes import PLUGINS
    from hf2triton.runtimes.base import VariantContext

    kind, cfg, onnx_path, export_dir = exported("embedding")
    model_dir = tmp_path / "model"
    shutil.copytree(export_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(change)
    (model_dir / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v}))
    ctx = VariantContext(
        onnx_path, export_dir, str(model_dir), kind, None, None, None, str(tmp_path / "work")
    )
    built = {r.method: r.make() for r in PLUGINS.load("onnxruntime-cuda").recipes(ctx)}
    assert list(built) == ["fp16/fused", "fp16"]
    assert why in built["fp16/fused"]["error"] and not built["fp16/fused"]["onnx_path"]
    assert "error" not in built["fp16"] and Path(built["fp16"]["onnx_path"]).is_file()


@pytest.mark.parametrize("first", ["hf2triton", "serving"])
def test_openvino_and_nncf_send_no_telemetry(first):
    """Importing openvino sends a usage event and NNCF one per call, each from a process forked
    in a thread; such a child deadlocked and held a release's stderr open for ever. A process that
    imports hf2triton, or the serving core alone (as Triton's Python backend does), gets both
    libraries' no-op stubs instead: checked where neither CI nor NNCF_CI is set and pytest is not
    imported (NNCF turns its telemetry off under pytest by itself)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NNCF_CI", "NNCF_DEV")}
    load = {
        "hf2triton": "import hf2triton\n",
        # the serving package on its own, by another name, as a version directory holds it
        "serving": f"import sys\nsys.path.insert(0, {str(ROOT / 'hf2triton')!r})\nimport serving\n",
    }[first]
    code = load + (
        "import openvino\n"
        "from openvino.tools.ovc import telemetry_utils\n"
        "from nncf.telemetry import wrapper\n"
        "print(telemetry_utils.tm.__name__,\n"
        "      isinstance(wrapper.telemetry, wrapper.NNCFTelemetryStub))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["openvino.tools.ovc.telemetry_stub", "True"], proc.stdout
