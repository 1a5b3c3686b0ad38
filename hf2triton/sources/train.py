"""Source `train`: a small Llama-architecture causal language model and its byte-level BPE
tokenizer, trained here on CPU from a plain-text file (hf2triton.training.lm): seeded and
deterministic, and trained once: the same text and settings reuse the finished model. The
embedded default LLM (releases/kjv-lm.yaml) is one."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from hf2triton.sources.base import SOURCES, Source
from hf2triton.training.lm import PLAIN_CHAT_TEMPLATE, train_lm
from hf2triton.util.runs import step_logger
from hf2triton.util.specbase import SpecPath, Strict, unless
from hf2triton.util.workspace import home


class TrainSourceSpec(Strict):
    """What to train: the text, the model's size and the training's settings."""

    text: SpecPath = Field(
        description="UTF-8 plain text to learn from (lines starting with '#' "
        "are a header and left out; blank lines separate documents)"
    )
    vocab_size: int = Field(2048, ge=300, le=65536, description="BPE vocabulary size")
    layers: int = Field(2, ge=1, le=32, description="decoder layers")
    hidden: int = Field(128, ge=16, le=4096, description="hidden size")
    heads: int = Field(4, ge=1, le=64, description="attention heads")
    context: int = Field(64, ge=8, le=4096, description="tokens per training sequence")
    max_positions: int = Field(
        256,
        ge=8,
        le=32768,
        description="prompt plus generated tokens the model can serve (max_position_embeddings)",
    )
    steps: int = Field(1500, ge=1, le=1_000_000, description="optimizer steps")
    batch_size: int = Field(16, ge=1, le=1024)
    learning_rate: float = Field(
        0.005,
        gt=0,
        le=1,
        description="peak learning rate (linear warm-up, cosine decay to a tenth)",
    )
    seed: int = 0
    chat_template: str = Field(
        PLAIN_CHAT_TEMPLATE,
        description="the tokenizer's chat template "
        "(Jinja); default: the messages' text one per line, since the "
        "model learnt plain text, not conversations",
    )

    @model_validator(mode="after")
    def _shape(self) -> TrainSourceSpec:
        if not Path(self.text).is_file():
            raise ValueError(f"text {self.text}: no such file")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        return unless(
            self.context > self.max_positions,
            self,
            f"context {self.context} is more than max_positions {self.max_positions}",
        )


@SOURCES.register
class TrainSource(Source):
    """A small language model trained here from a text file, once."""

    key = "train"

    train: TrainSourceSpec = Field(
        description="a small language model trained here from a text file, once"
    )

    @property
    def lineage_id(self) -> str:
        return self.model_id or f"trained:{Path(self.train.text).name}"

    def locate(self) -> tuple[Path, str | None]:
        """The model, trained here the first time and reused after: its directory is keyed by
        the text's content hash and the settings."""
        train, log = self.train, step_logger()

        def progress(step: int, loss: float) -> None:  # a line per 100 steps, and the last
            if step % 100 == 0 or step == train.steps:
                log.info(
                    "fetch: training the language model, step %d of %d, loss %.3f",
                    step,
                    train.steps,
                    loss,
                )

        trained = train_lm(train, home() / "sources" / "trained", progress)
        if not trained["reused"]:
            log.info(
                "fetch: trained the language model on %d tokens of %s in %.0f s",
                trained["tokens"],
                Path(train.text).name,
                trained["seconds"],
            )
        return Path(trained["model_dir"]), None
