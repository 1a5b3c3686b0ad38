"""The order the gate judges its candidates in, and which it builds and times at all.

With `select="first"` the candidates are judged in their own order. With `select="fastest"` each
is timed first (the kind's `speed`, at the gate's objective: `streams` requests at once) and
judged fastest first; with `prune` (quantization.prune, the default) the search is pruned by
family, a runtime at one compute precision (`family`): each family's first candidate (its
representative: on ONNX Runtime the spec's own variant) is timed, then only the fastest family's
other candidates are built (hf2triton.runtimes plans them) and timed; another family's are built
and timed only when its first candidate ran faster than the fastest that passed so far (`bar`):
none of the fastest family's passed, or the one that did is slower than that family's first.
Within a family the candidates differ in their weights and KV cache, and the first is built from
the spec's own (quantized) variant, as a rule the family's fastest (at one stream, under the
latency objective, the first on compressed weights: `Search.leading`); a family whose first ran
no faster than what passed is left untimed. What is never timed is reported as such, with the
figure that ruled it out.

A 360M-parameter chat model had 33 candidates timed one after another for 17 minutes and 15
ONNX Runtime int8 graphs written (8 GB) when OpenVINO GenAI, three times faster than any of
them, shipped: this is what stops that.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from hf2triton.kinds.base import Candidate, timing_items
from hf2triton.release.far import weights_of
from hf2triton.release.plan import Gate, candidate_settings
from hf2triton.runtimes import plugin
from hf2triton.util.runs import step_logger


def family(cand: Candidate) -> str:
    """The runtime a candidate runs on and how it computes ("openvino bf16"; "openvino-genai
    fp32 dq32" with activations quantized in groups of 32): the search's unit of pruning. A
    precision is a family of its own because one runtime's f32 timing says nothing of its bf16:
    CLIP's image tower on OpenVINO ran 34 images/s at f32 and 80 at bf16 (2-core AVX512_BF16
    EPYC); with the two one family, its f32 candidate came first, ran slower than ONNX
    Runtime's int8 that passed, and bf16 was never timed. Quantized activations too: they
    change how every compressed layer computes, so one family's timing says nothing of the
    other's."""
    runs = plugin(cand.runtime)
    return f"{runs.name} {runs.computes(cand.runtime or {})}"


@dataclass
class Search:
    """The gate's candidates, built and timed as the gate asks for them: `groups()` yields the
    candidates to judge, a family's at a time, fastest first; `made` holds every candidate as
    built, `speeds` what was timed, `refused` the report entries of those that raised."""

    gate: Gate
    candidates: list[Candidate]
    made: dict[str, Candidate] = field(default_factory=dict)
    speeds: dict[str, dict[str, float]] = field(default_factory=dict)
    refused: list[dict[str, Any]] = field(default_factory=list)
    leaders: dict[str, float] = field(default_factory=dict)  # each family's first timing
    led_by: dict[str, str] = field(default_factory=dict)  # the candidate that timing is of
    # The speed of the fastest candidate that passed so far (the judge sets it; -1: none yet): a
    # family whose first candidate ran no faster is not timed further.
    bar: float = -1.0

    def __post_init__(self) -> None:
        self.made = {c.name: c for c in self.candidates}

    def groups(self) -> Iterator[list[Candidate]]:
        """The candidates to judge, in groups judged in turn, each fastest first: with a pruned
        search a family's at a time, the next family's only while its first candidate ran
        faster than `bar`."""
        gate = self.gate
        if gate.select != "fastest":
            yield self.candidates
            return
        if not gate.prune or gate.judge_all:
            self.time_all(self.candidates)
            yield self.fastest_first(self.candidates)
            return
        families: dict[str, list[Candidate]] = {}
        for c in self.candidates:
            families.setdefault(family(c), []).append(c)
        for name, members in families.items():
            self.leaders[name], self.led_by[name] = self.first_timed(self.leading(members))
        for name in sorted(families, key=lambda n: -self.leaders[n]):
            if self.leaders[name] < 0:
                continue  # every candidate of it raised: refused
            if self.bar >= 0 and self.leaders[name] <= self.bar:
                continue  # cannot beat what passed: left untimed, and reported so
            step_logger().info(
                "validate: %s is the fastest family left (%g): its %d candidates are timed",
                name,
                self.leaders[name],
                len(families[name]),
            )
            self.time_all(families[name])
            yield self.fastest_first(families[name])

    def leading(self, members: list[Candidate]) -> list[Candidate]:
        """A family's candidates in the order its first timing is tried: as planned, but at one
        stream (the latency objective) those on compressed weights first. A token there reads
        every weight, so the export's f32 weights run slowest and would speak for the family
        at its worst: in the gate's one-stream timings of SmolLM2-135M's shape, OpenVINO GenAI
        bf16 ran 64.6 tokens/s on f32 weights, 84 on int8."""
        if self.gate.objective != "latency":
            return members
        return sorted(members, key=lambda c: weights_of(c) in plugin(c.runtime).plain_weights)

    def first_timed(self, members: list[Candidate]) -> tuple[float, str]:
        """Time a family's candidates in order until one runs: its speed and name (-1: none
        ran)."""
        for c in members:
            if self.timed(c):
                return self.speeds[c.name]["speed"], c.name
        return -1.0, ""

    def time_all(self, members: list[Candidate]) -> None:
        for c in members:
            if c.name not in self.speeds and not self.is_refused(c):
                self.timed(c)

    def fastest_first(self, members: list[Candidate]) -> list[Candidate]:
        timed = [self.made[c.name] for c in members if c.name in self.speeds]
        return sorted(timed, key=lambda c: -self.speeds[c.name]["speed"])

    def is_refused(self, cand: Candidate) -> bool:
        return any(e["name"] == cand.name for e in self.refused)

    def build(self, cand: Candidate) -> Candidate:
        """The candidate with its graph built (a planned one is built now, once)."""
        made = self.made[cand.name]
        if made.planned:
            try:
                made = made.made()
            except Exception as exc:  # noqa: BLE001 - a build that raises refuses its candidate
                made = replace(made, error=f"building it failed: {type(exc).__name__}: {exc}")
            self.made[cand.name] = made
        return made

    def timed(self, cand: Candidate) -> bool:
        """Build, open, time and close `cand` (one open at a time); False when it raised (its
        refusal is in `refused`)."""
        model, t0 = None, time.perf_counter()
        try:
            cand = self.build(cand)
            if cand.error:
                raise CandidateBroken(cand.error)
            gate = self.gate
            model = gate.kind.open_candidate(
                cand.onnx_path, gate.export_dir, candidate_settings(gate.base, cand.gated_runtime)
            )
            speed = gate.kind.speed(model, timing_items(gate.gate_data.items), gate.streams)
            self.speeds[cand.name] = speed
            step_logger().info(
                "validate: speed of %s: %s (%.0f s)",
                cand.name,
                ", ".join(f"{k} {v:g}" for k, v in speed.items() if k != "speed"),
                time.perf_counter() - t0,
            )
            return True
        except Exception as exc:  # noqa: BLE001 - a candidate that breaks is refused, not fatal
            self.refused.append(refusal(cand, exc, t0))
            return False
        finally:
            getattr(model, "close", lambda: None)()

    def untimed(self, cand: Candidate, shipping: str | None) -> dict[str, Any]:
        """The report entry of a candidate the pruned search never built nor timed: its
        family's first candidate ran no faster than the one that ships."""
        against = (
            f"{self.bar:g}, the speed of {shipping}, which passes"
            if shipping and self.bar >= 0
            else f"{max(self.leaders.values(), default=0.0):g}"
        )
        return bare_entry(
            cand,
            judged=False,
            timed=False,
            status=f"not timed: {family(cand)}'s first candidate ran at "
            f"{self.leaders.get(family(cand), 0):g} against {against}"
            f" (the first timed: {self.led_by.get(family(cand)) or 'none'}; "
            "quantization.prune: false times every candidate)",
        )


def bare_entry(cand: Candidate, **fields: Any) -> dict[str, Any]:
    """A report entry of a candidate with no figures (refused, not judged, not timed), and
    `fields` that say why."""
    return {
        "name": cand.name,
        "runtime": cand.runtime,
        "gated_on": cand.gated_runtime,
        "metrics": {},
        "misses": {},
        "details": {},
        "worst": [],
        "champion_verdict": None,
        **fields,
    }


class CandidateBroken(Exception):
    """A candidate that cannot be judged (its graph could not be built)."""


def refusal(cand: Candidate, exc: BaseException, t0: float) -> dict[str, Any]:
    """The report entry of a candidate that raised, and its log line."""
    why = (
        str(exc)
        if isinstance(exc, CandidateBroken)
        else f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    )
    step_logger().warning(
        "validate: %s: refused, it raised: %s (%.0f s)", cand.name, why, time.perf_counter() - t0
    )
    return bare_entry(cand, misses={"error": float("inf")}, error=why)
