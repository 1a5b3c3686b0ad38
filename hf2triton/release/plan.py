"""The gate's plan, settled before anything runs: what the release asks of it (`GateSettings`),
what every candidate is measured on and against which limits (`Gate`), and PyTorch's answers
(`Reference`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from hf2triton.kinds.base import Data, ModelKind
from hf2triton.kinds.config import KindConfig
from hf2triton.kinds.margin import looks
from hf2triton.release.champion import mlflow_verdict

LOOK_SEED = 0  # the order a sample sized by its bounds takes the validation items in


@dataclass(frozen=True)
class GateSettings:
    """What a release asks of its gate, apart from the candidates and the data.

    Example:
        >>> GateSettings(batch=64, select="fastest", judge_all=True)
    """

    batch: int  # the largest dynamic batch Triton forms (deploy.max_batch_size)
    max_batch_tokens: int = 0  # deploy.max_batch_tokens, as serving.json carries it
    # "first": judged in order, the first that passes ships; "fastest": timed first, judged
    # fastest first, and the first that passes (the fastest that does) ships.
    select: Literal["first", "fastest"] = "first"
    max_drop: float = 0.0  # validation.max_drop: how far below the champion's task metric
    judge_all: bool = False  # judge every candidate's accuracy, for the report
    # The runtimes and precisions this machine could not try, with why (for the report).
    not_offered: Mapping[str, str] = field(default_factory=dict)
    # What "fastest" means: "throughput" at `batch` requests at once, or one request's "latency".
    objective: Literal["throughput", "latency"] = "throughput"
    # With select "fastest": time each family's first candidate (a runtime at one precision),
    # refine the fastest family's.
    prune: bool = True


@dataclass(frozen=True)
class Gate:
    """One release's gate, settled before anything runs: what every candidate is measured on,
    batched how, against which limits, and how the winner is picked."""

    kind: ModelKind[KindConfig]
    cfg: KindConfig
    data: Data  # the validation data as read (the smoke test's items come from it)
    gate_data: Data  # what the gate measures (labelled items added by some kinds)
    export_dir: str
    batch: int  # the largest dynamic batch Triton forms (deploy.max_batch_size)
    select: str  # "first" or "fastest" that passes
    judge_all: bool  # judge every candidate's accuracy, not only until the one that ships
    max_drop: float
    limits: dict[str, Any]
    smoke_index: list[int]
    base: dict[str, Any]  # serving.json without file locations
    quality: str | None  # the task metric compared with the champion, when the data has labels
    # The runtimes and precisions this machine could not try, with why (for the report).
    not_offered: Mapping[str, str] = field(default_factory=dict)
    objective: str = "throughput"  # what "fastest" means: "throughput" or "latency"
    prune: bool = True  # time each family's first candidate, refine the fastest family's
    # How many of the gate's items are judged at each look (the last: all of them): a kind
    # with a dear reference sizes its sample by the bounds (hf2triton.kinds.margin.looks).
    looks: tuple[int, ...] = ()

    def items(self, n: int) -> Data:
        """The gate's first `n` items (a look's), with their extra data."""
        return self.gate_data.part(0, n)

    @property
    def sized(self) -> str:
        """How many items the gate judges a candidate on: all, or (a sample sized by its
        bounds) the first look's, and more up to all where the bounds leave a verdict open."""
        n = len(self.gate_data)
        if len(self.looks) < 2:
            return str(n)
        return f"{self.looks[0]} (up to {n} where its bounds leave the verdict open)"

    @property
    def streams(self) -> int:
        """How many requests a candidate's speed is measured with at once: the serving batch
        for throughput, one for latency."""
        return 1 if self.objective == "latency" else self.batch

    @classmethod
    def of(
        cls,
        kind: ModelKind[KindConfig],
        cfg: KindConfig,
        data: Data,
        export_dir: str,
        settings: GateSettings,
    ) -> Gate:
        """The gate of the candidates of the export in `export_dir` (configured by `cfg`),
        measured on `data` as `settings` ask."""
        gate_data = kind.gate_data(data, cfg)
        # Compared with the champion on its task metric, every item counts: no early looks.
        sizes = looks(len(gate_data), None if kind.quality_metric else kind.first_look)
        if len(sizes) > 1:
            # A look judges a prefix: a seeded shuffle makes each prefix a random sample of
            # the file (which may be sorted by length or topic), the same one every run.
            assert len(gate_data) == len(data), "a kind that sizes its sample adds no items"
            order = [int(i) for i in np.random.default_rng(LOOK_SEED).permutation(len(data))]
            data, gate_data = data.reordered(order), gate_data.reordered(order)
        quality = (
            kind.quality_metric if kind.quality_metric in kind.labelled_metrics(gate_data) else None
        )
        return cls(
            kind,
            cfg,
            data,
            gate_data,
            export_dir,
            settings.batch,
            settings.select,
            settings.judge_all,
            settings.max_drop,
            kind.limits(),
            # The smoke test's items come from the first look's, whose reference every
            # candidate's judging computes.
            kind.smoke_indices(data.part(0, sizes[0])),
            kind.serving_json(cfg, export_dir, max_batch_tokens=settings.max_batch_tokens),
            quality,
            dict(settings.not_offered),
            settings.objective,
            settings.prune,
            sizes,
        )


@dataclass
class Reference:
    """PyTorch's answers the candidates are scored against, and the requests that ask for them:
    the gate's items (the first `len(outputs)` of them: `upto` asks PyTorch for more when a
    look needs them), and the smoke test's."""

    outputs: Any
    requests: list[dict[str, np.ndarray]]
    smoke_data: Data
    smoke_outputs: Any
    smoke_requests: list[dict[str, np.ndarray]]
    # PyTorch's answers on the gate's items [start, stop) and the requests that ask for them.
    more: Callable[[int, int], tuple[list[Any], list[dict[str, np.ndarray]]]] | None = None

    def upto(self, n: int) -> Reference:
        """This reference with PyTorch's answers on at least the gate's first `n` items,
        computed once for every candidate that needs them."""
        have = len(self.outputs)
        if n > have and self.more is not None:  # a reference of every item has no more
            outputs, requests = self.more(have, n)
            self.outputs = [*self.outputs, *outputs]
            self.requests = [*self.requests, *requests]
        return self


def candidate_settings(base: dict[str, Any], runtime: dict[str, Any] | None) -> dict[str, Any]:
    """serving.json (without file locations) of a candidate on `runtime`."""
    return {**base, "runtime": runtime} if runtime else dict(base)


@dataclass(frozen=True)
class Facing:
    """The serving champion a candidate faces (with labelled data): its report entry
    (`champion`: version, metric, value), the `floor` a candidate's task metric must reach ({}:
    none to reach), and the candidates it already serves (`same`: not compared with
    themselves)."""

    champion: dict[str, Any] = field(default_factory=dict)
    floor: dict[str, Any] = field(default_factory=dict)
    same: frozenset[str] = frozenset()

    def judge(
        self, gate: Gate, name: str, metrics: dict[str, float], missed: dict[str, Any]
    ) -> str | None:
        """MLflow's own model validation's verdict on candidate `name` against the champion
        (None: passes, or not compared), its miss added to `missed`."""
        quality = gate.quality
        if not self.floor or name in self.same:
            return None
        assert quality is not None  # a floor is only set for the task metric (face_champion)
        verdict = mlflow_verdict(quality, metrics[quality], self.champion["value"], gate.max_drop)
        if verdict:
            missed[f"champion.{quality}"] = self.floor[quality][1] - metrics[quality]
        return verdict
