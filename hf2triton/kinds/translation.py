"""Kind `translation` (`task: translation`): encoder-decoder models (M2M100, Marian, ...)
served with greedy or beam search on ONNX Runtime (hf2triton.serving.seq2seq, ported from
transformers' `generate`). The gate scores served translations with sacreBLEU BLEU and chrF
against PyTorch `generate`'s, and against reference translations when the spec gives them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.errors import ExportError, SpecError
from hf2triton.kinds.base import KINDS, Data, Limits, read_lines
from hf2triton.kinds.generation_config import (
    GenerationSpec,
    TranslationConfig,
    resolve_translation_config,
)
from hf2triton.kinds.margin import Sample
from hf2triton.kinds.modality import TextToTextKind
from hf2triton.kinds.roles import TextAnswerGate
from hf2triton.kinds.serving_tokenizer import check_tokenizer, write_serving_tokenizer
from hf2triton.kinds.torch_reference import TorchTranslator, abs_difference, batched, strip_pad
from hf2triton.serving.seq2seq import ONNX_FILES, Seq2SeqModel, Seq2SeqTokenizer
from hf2triton.serving.translation import Translator


def bleu_chrf(hypotheses: list[str], references: list[str]) -> tuple[float, float]:
    """Corpus BLEU and chrF (sacrebleu defaults). Two identical corpora score 100 and 100."""
    import sacrebleu

    if hypotheses == references:
        return 100.0, 100.0  # sacrebleu gives 0 BLEU for identical empty strings
    bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
    chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
    return float(bleu), float(chrf)


def bleu_chrf_samples(hypotheses: list[str], references: list[str]) -> tuple[Sample, Sample]:
    """Corpus BLEU and chrF as sums of each sentence's n-gram statistics (how sacrebleu scores
    a corpus), for resampling: a resample of identical sentences scores 100, as bleu_chrf."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    same = np.array([[float(h == r)] for h, r in zip(hypotheses, references)])
    counts = np.ones_like(same)
    bleu_stats = np.asarray(bleu._extract_corpus_statistics(hypotheses, [references]), np.float64)
    chrf_stats = np.asarray(chrf._extract_corpus_statistics(hypotheses, [references]), np.float64)

    def scored(metric: Any, width: int) -> Any:
        def reduce(s: np.ndarray) -> float:
            if s[-2] == s[-1]:  # every resampled sentence is the reference itself
                return 100.0
            return float(metric._compute_score_from_stats(list(s[:width])).score)

        return reduce

    return (
        Sample(np.hstack([bleu_stats, same, counts]), scored(bleu, bleu_stats.shape[1])),
        Sample(np.hstack([chrf_stats, same, counts]), scored(chrf, chrf_stats.shape[1])),
    )


def serving_files(directory: str | Path) -> dict[str, str]:
    """The ONNX files the served translator runs, by role, in `directory`."""
    return {role: str(Path(directory) / name) for role, name in ONNX_FILES.items()}


def compare_translation(
    model_dir: str, export_dir: Path, cfg: TranslationConfig, sentences: list[str]
) -> dict[str, Any]:
    """Check an fp32 export: encoder states within reach of PyTorch's (largest |diff|), greedy
    ORT generation equal to PyTorch `generate` token for token, and the served tokenizer equal to
    transformers'. Returns the figures; raises on a tokenizer that cannot be served."""
    reference = TorchTranslator(model_dir, cfg)
    plan = json.loads((export_dir / TOKENIZER_DIR / "plan.json").read_text())
    served = Seq2SeqTokenizer(str(export_dir / TOKENIZER_DIR), plan, cfg.max_input_length)
    model = Seq2SeqModel(serving_files(export_dir))
    worst = 0.0
    torch = reference._torch
    for chunk in batched(sentences, 8):
        enc = reference.tokenizer(
            chunk,
            padding=True,
            truncation=True,
            max_length=cfg.max_input_length,
            return_tensors="np",
        )
        with torch.inference_mode():
            want = (
                reference.model.get_encoder()(
                    input_ids=torch.from_numpy(enc["input_ids"]),
                    attention_mask=torch.from_numpy(enc["attention_mask"]),
                )
                .last_hidden_state.float()
                .numpy()
            )
        got = model.encode(
            enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
        )
        worst = max(worst, abs_difference(want, got, enc["attention_mask"].astype(bool)))
    greedy = cfg.settings.with_request(num_beams=1)
    want_ids = reference.generate(sentences, num_beams=1)
    check_tokenizer(served, reference.tokenizer, sentences, want_ids)
    ids, _ = served.encode(sentences)
    got_ids = [
        g for chunk in batched(ids, 8) for g in model.generate(chunk, greedy, greedy.pad_token_id)
    ]
    pad = greedy.pad_token_id
    differ = [
        i
        for i, (a, b) in enumerate(zip(got_ids, want_ids))
        if strip_pad(a, pad) != strip_pad(b, pad)
    ]
    return {
        "max_abs_diff": worst,
        "greedy_mismatches": len(differ),
        "first_mismatch": sentences[differ[0]] if differ else None,
    }


def onnx_files_with_data(directory: str | Path) -> dict[str, Path]:
    """The served ONNX files of a seq2seq export or variant, with their external data files."""
    files: dict[str, Path] = {}
    for name in ONNX_FILES.values():
        src = Path(directory) / name
        for p in [
            src,
            *(q for q in src.parent.iterdir() if q.name.startswith(name) and q.name != name),
        ]:
            files[p.name] = p
    return files


TOKENIZER_DIR = "serving-tokenizer"  # written by export, beside the ONNX files


@KINDS.register
class TranslationKind(TextAnswerGate[TranslationConfig], TextToTextKind[TranslationConfig]):
    name = "translation"
    task = "translation"
    section = "generation"
    Options = GenerationSpec
    onnx_task = "text2text-generation-with-past"  # encoder, decoder and decoder-with-past
    serving_class = Translator
    answer_column = "TRANSLATION"
    main_file = ONNX_FILES["encoder"]
    tunable = False  # generation load is another kind of traffic; not searched
    item_word = "sentences"

    def resolve(self, model_dir: str) -> TranslationConfig:
        return resolve_translation_config(model_dir, self.options)

    def read_data(self) -> Data:
        items = read_lines(self.validation.sentences, "validation.sentences")
        extra = {}
        if self.options.references:
            refs = read_lines(self.options.references, "generation.references", "translations")
            if len(refs) != len(items):
                raise SpecError(
                    f"generation.references {self.options.references!r} has {len(refs)} "
                    f"translations for {len(items)} validation sentences: give one per "
                    "non-empty line of validation.sentences"
                )
            extra["references"] = refs
        return Data(items, extra)

    def export_inputs(self, data: Data) -> list[str]:
        longest = sorted(data.items, key=len, reverse=True)[:4]
        return list(dict.fromkeys([*data.items[:20], *longest]))

    def prepare_export(self, model_dir: str, out: Path, cfg: TranslationConfig) -> None:
        plan = write_serving_tokenizer(model_dir, out / TOKENIZER_DIR, cfg.source_lang)
        (out / TOKENIZER_DIR / "plan.json").write_text(json.dumps(plan, indent=1))

    def check_export(
        self, model_dir: str, out: Path, cfg: TranslationConfig, inputs: list[str]
    ) -> dict[str, float]:
        found = compare_translation(model_dir, out, cfg, inputs)
        if found["greedy_mismatches"]:
            raise ExportError(
                f"greedy generation with the fp32 ONNX files differs from PyTorch generate on "
                f"{found['greedy_mismatches']} of {len(inputs)} sentences (first: "
                f"{found['first_mismatch'][:40]!r}); try another export.opset or report the "
                "model"
            )
        return {"max_abs_diff": found["max_abs_diff"]}

    def settings(self, cfg: TranslationConfig, export_dir: str) -> dict[str, Any]:
        plan = json.loads((Path(export_dir) / TOKENIZER_DIR / "plan.json").read_text())
        return {
            "tokenizer": plan,
            "max_input_length": cfg.max_input_length,
            "decode": cfg.decode,
            "target_langs": cfg.target_langs,
            "max_new_tokens_limit": cfg.max_new_tokens_limit,
        }

    def version_files(self, candidate: str, export_dir: str) -> dict[str, Path]:
        files = onnx_files_with_data(candidate)
        for p in sorted((Path(export_dir) / TOKENIZER_DIR).iterdir()):
            if p.is_file() and p.name != "plan.json":
                files[p.name] = p
        return files

    def file_settings(self, files: dict[str, str]) -> dict[str, Any]:
        some_tokenizer_file = next(
            v for k, v in files.items() if not k.endswith(".onnx") and ".onnx" not in k
        )
        return {
            "files": {role: files[name] for role, name in ONNX_FILES.items()},
            "tokenizer_dir": os.path.dirname(some_tokenizer_file),
        }

    def reference(self, model_dir: str, cfg: TranslationConfig, data: Data) -> list[str]:
        model = TorchTranslator(model_dir, cfg)
        return model.decode(model.generate(data.items))

    def config_from_dict(self, data: dict[str, Any]) -> TranslationConfig:
        return TranslationConfig(**data)

    def score(
        self, reference: list[str], outputs: list[str], data: Data, cfg: TranslationConfig
    ) -> tuple[dict[str, float], dict]:
        bleu, chrf = bleu_chrf(outputs, list(reference))
        same = [h == r for h, r in zip(outputs, reference)]
        metrics = {"bleu": bleu, "chrf": chrf, "exact_match": sum(same) / max(1, len(same))}
        if "references" in data.extra:
            metrics["reference_bleu"], metrics["reference_chrf"] = bleu_chrf(
                outputs, data.extra["references"]
            )
        return metrics, {
            "differ": [
                {
                    "text": str(data.items[i])[:200],
                    "pytorch": reference[i][:200],
                    "candidate": outputs[i][:200],
                }
                for i in range(len(same))
                if not same[i]
            ][:10]
        }

    def samples(
        self, reference: list[str], outputs: list[str], data: Data, cfg: TranslationConfig
    ) -> dict[str, Sample]:
        found = dict(zip(("bleu", "chrf"), bleu_chrf_samples(outputs, list(reference))))
        if "references" in data.extra:
            gold = bleu_chrf_samples(outputs, data.extra["references"])
            found.update(zip(("reference_bleu", "reference_chrf"), gold))
        return found

    def limits(self) -> Limits:
        t = self.options.thresholds
        out = {"bleu": (">=", t.min_bleu), "chrf": (">=", t.min_chrf)}
        if t.min_reference_bleu is not None:
            out["reference_bleu"] = (">=", t.min_reference_bleu)
        if t.min_reference_chrf is not None:
            out["reference_chrf"] = (">=", t.min_reference_chrf)
        return out
