"""The interface every deploy target implements. A rollout is, for every target:

1. `deploy`: the new version serves beside the one that serves now (the old one untouched);
2. the smoke test queries the new version on `endpoints`;
3. `promote`: it becomes what clients reach (and the MLflow alias `champion` moves);
4. `retire`: what served before is unloaded or removed;
and `rollback` undoes 1 (and 3) when anything before 4 fails, leaving the old version serving.
The release flow wraps 1-3 in one Prefect transaction whose rollback hook calls `rollback`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, NotRequired, TypedDict

from pydantic import Field, field_validator, model_validator

from hf2triton.clients.credentials import ApiKeys, resolve
from hf2triton.errors import DeployError
from hf2triton.image.spec import ImageSpec
from hf2triton.runtimes.devices import DEVICES
from hf2triton.targets.smoke import Endpoint
from hf2triton.util import plugins
from hf2triton.util.specbase import Strict, matching

# A host name (RFC 1123 labels) or an IPv4 address.
HOST_PATTERN = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)

Check = Callable[[Endpoint], dict[str, float]]  # the kind's smoke test on one endpoint


class TuningSpec(Strict):
    """Triton configuration search (feature-extraction releases): every combination of the
    listed dynamic-batching and execution settings is loaded into a private tritonserver with the
    validated model and driven by closed-loop gRPC clients, one sentence per request; the release
    ships the configuration with the most requests/s (mean over `clients`) whose p99 stays under
    `max_p99_ms`, written into the generated config.pbtxt."""

    search: bool = False
    preferred_batch_sizes: list[list[Annotated[int, Field(ge=1)]]] | None = Field(
        None, description="candidates; default: only deploy.preferred_batch_sizes"
    )
    max_queue_delay_us: list[Annotated[int, Field(ge=0, le=1_000_000)]] = [2000, 8000]
    execution: list[
        tuple[Annotated[int, Field(ge=1, le=64)], Annotated[int, Field(ge=0, le=256)]]
    ] = Field(
        [(1, 0), (2, 1)],
        description="(instance_count, intra_op_threads) pairs (instances per GPU with device "
        "gpu); threads 0: ONNX Runtime's default (on a GPU: the host's cores shared among the "
        "instances); default: [1, 0], [2, 1] on cpu; [1, 0], [2, 0], [4, 0], [8, 0] on gpu",
    )
    max_batch_tokens: list[Annotated[int, Field(ge=0, le=1_000_000)]] | None = Field(
        None,
        description="token budgets of the served model's sub-batches to try; default: "
        "only deploy.max_batch_tokens",
    )
    clients: list[Annotated[int, Field(ge=1, le=1000)]] = Field(
        [16, 64], description="closed-loop client counts; default: 16, 64 on cpu; 64, 128 on gpu"
    )
    seconds: float = Field(
        5, gt=0, le=600, description="measured per configuration and client count, after a warm-up"
    )
    max_p99_ms: float | None = Field(None, gt=0, description="latency cap at every client count")

    @model_validator(mode="after")
    def _non_empty(self) -> TuningSpec:
        for key in ("max_queue_delay_us", "execution", "clients"):
            if not getattr(self, key):
                raise ValueError(f"tuning.{key} needs at least one value")
        if self.preferred_batch_sizes is not None and not all(self.preferred_batch_sizes):
            raise ValueError("tuning.preferred_batch_sizes: each candidate needs a batch size")
        if self.max_batch_tokens is not None and not self.max_batch_tokens:
            raise ValueError("tuning.max_batch_tokens needs at least one value (or leave it out)")
        return self


class OpenAISpec(Strict):
    """The OpenAI-compatible API beside Triton (hf2triton/openai_api): /v1/models,
    /v1/embeddings, /v1/chat/completions, /v1/completions, /v1/rerank and /predict over the
    served models, reaching Triton over gRPC."""

    enabled: bool = Field(True, description="serve the API beside Triton")
    port: int = Field(9000, ge=1, le=65535, description="the API's HTTP port")
    credentials_block: str | None = Field(
        None,
        description="name of a saved hf2triton ApiKeys Prefect block: the bearer keys "
        "the API accepts; without it HF2TRITON_OPENAI_API_KEYS (comma-separated), else none "
        "(the API takes requests without a key)",
    )
    max_body_mb: float = Field(4, gt=0, le=1024, description="the largest request body (MB)")
    timeout_s: float = Field(600, gt=0, description="the longest a request may take")
    remote_image_hosts: list[str] = Field(
        default_factory=list,
        description="hosts whose image URLs (http or https) the API fetches for a client, "
        "redirects not followed, at most max_body_mb; empty: a URL is refused and images come "
        "as base64 data URIs",
    )

    @field_validator("remote_image_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        bad = [h for h in hosts if not h or "/" in h or ":" in h or h != h.strip()]
        if bad:
            raise ValueError(
                f"remote_image_hosts takes host names alone (images.example.com), got {bad}"
            )
        return [h.lower() for h in hosts]

    def url(self, host: str) -> str:
        return f"http://{host}:{self.port}/v1"

    def arguments(self) -> list[str]:
        """The API server's arguments for these limits."""
        return [
            f"--max-body-mb={self.max_body_mb:g}",
            f"--timeout-s={self.timeout_s:g}",
            *(f"--remote-image-host={h}" for h in self.remote_image_hosts),
        ]

    def key_hashes(self) -> list[str]:
        """sha256 of each key the API is to accept (the block's, else the environment's);
        empty: it takes requests without a key."""
        found = resolve(ApiKeys, self.credentials_block)
        return found.hashes() if found is not None else []

    def container_environment(self) -> dict[str, str]:
        """The serving image's entrypoint settings (a container's environment): whether the API
        runs, with its limits and the sha256 hashes of its keys (never the keys)."""
        if not self.enabled:
            return {"HF2TRITON_OPENAI": "off"}
        env = {"HF2TRITON_OPENAI_ARGS": " ".join(self.arguments())}
        hashes = self.key_hashes()
        if hashes:
            env["HF2TRITON_OPENAI_KEY_SHA256"] = ",".join(hashes)
        return env

    def client_key(self) -> str | None:
        """A key the smoke test and the watch send (None: the API asks none)."""
        found = resolve(ApiKeys, self.credentials_block)
        keys = (
            [k.strip() for k in found.keys.get_secret_value().split(",") if k.strip()]
            if found is not None
            else []
        )
        return keys[0] if keys else None


# The CPU's token budget of a sub-batch (measured: hf2triton.runtimes.devices).
DEFAULT_MAX_BATCH_TOKENS = DEVICES.load(DEVICES.default).default_max_batch_tokens


class DeploySection(Strict):
    """What every deploy target's section shares: how Triton batches and runs the model, and
    how long a new version may take to load. A target's own section adds `target` (its registry
    name) and its own keys."""

    target: str
    # The target runs the release's serving image (so `image.build` cannot be false).
    runs_image: ClassVar[bool] = False

    max_batch_size: int = Field(
        64,
        ge=1,
        le=4096,
        description="the largest dynamic batch "
        "Triton forms (requests); the gate measures batches of this size",
    )
    preferred_batch_sizes: list[Annotated[int, Field(ge=1)]] = Field(
        [8, 16, 32], description="batch sizes Triton's dynamic batcher prefers to send at once"
    )
    max_queue_delay_us: int = Field(
        2000,
        ge=0,
        le=1_000_000,
        description="how long a request may wait for others to batch with (microseconds)",
    )
    instance_count: int = Field(
        1,
        ge=1,
        le=64,
        description="model instances (on the CPU, or on each GPU with device gpu); default: 1 "
        "on cpu, 8 per GPU on gpu (eight served most of 1 to 16 on an H200)",
    )
    intra_op_threads: int = Field(
        0,
        ge=0,
        le=256,
        description="0: ONNX Runtime's default (on a GPU: the serving host's cores divided "
        "among the model's instances there)",
    )
    max_batch_tokens: int = Field(
        DEFAULT_MAX_BATCH_TOKENS,
        ge=0,
        le=1_000_000,
        description="token budget of one ONNX run: the served model sorts a dynamic batch by "
        "length and runs it in sub-batches of at most this many padded tokens (rows x longest); "
        "0: one padded run per dynamic batch; default: 512 on cpu, 8192 on gpu",
    )
    device: Literal[tuple(DEVICES)] = Field(  # type: ignore[valid-type]
        "cpu",
        description="where Triton runs the model: cpu (KIND_CPU instances), or gpu "
        "(KIND_GPU instances and a GPU runtime; the gate must run on a GPU too, see gpu_gate)",
    )
    gpus: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        description="with device gpu: the GPUs Triton places instances on, "
        "instance_count on each; default: every GPU of the server",
    )
    gpu_gate: Literal["here", "cpu-numerics"] = Field(
        "here",
        description="with device gpu: `here` gates on this machine's GPU (a release "
        "started without one stops before any work); `cpu-numerics` accepts a CPU check of the "
        "GPU graph's numerics (for an image built on a CPU host), and the smoke test on the "
        "target then judges the served answers with the gate's limits",
    )
    ready_timeout_s: float = Field(
        180, gt=0, description="how long a new version may take to load and become ready (seconds)"
    )
    tuning: TuningSpec = TuningSpec()
    openai: OpenAISpec = Field(
        OpenAISpec(),
        description="the OpenAI-compatible API beside "
        "Triton: every target runs it (the serving image starts it)",
    )

    @model_validator(mode="before")
    @classmethod
    def _device_defaults(cls, data: object) -> object:
        """What the spec leaves out is the device's default (hf2triton.runtimes.devices): the
        instances (per GPU), the token budget of a sub-batch, and the instances, threads and
        clients the configuration search tries."""
        if not isinstance(data, dict):
            return data
        device = DEVICES.get(data.get("device") or DEVICES.default)
        if device is None:  # a device the field itself refuses
            return data
        data = {
            "instance_count": device.default_instances,
            "max_batch_tokens": device.default_max_batch_tokens,
            **data,
        }
        tuning = data.get("tuning", {})
        if isinstance(tuning, dict):
            data["tuning"] = {
                "execution": [list(p) for p in device.tuning_execution],
                "clients": list(device.tuning_clients),
                **tuning,
            }
        return data

    @model_validator(mode="after")
    def _gpus_need_gpu(self) -> DeploySection:
        if self.gpus is not None and not DEVICES.load(self.device).gpus:
            raise ValueError(f"deploy.gpus {self.gpus} needs deploy.device: gpu")
        return self

    @model_validator(mode="after")
    def _batches(self) -> DeploySection:
        too_big = [b for b in self.preferred_batch_sizes if b > self.max_batch_size]
        too_big += [
            b for c in self.tuning.preferred_batch_sizes or [] for b in c if b > self.max_batch_size
        ]
        if too_big:
            raise ValueError(
                f"preferred_batch_sizes {too_big} exceed max_batch_size {self.max_batch_size}"
            )
        return self


class WatchPoint(TypedDict):
    name: str
    http: str  # host:port
    grpc: str  # host:port
    metrics: str  # http://host:port/metrics
    openai: NotRequired[str]  # the OpenAI-compatible API's base URL, http://host:port/v1


class PublishedSection(DeploySection):
    """A target whose Triton listens on ports of this machine."""

    host: Annotated[
        str,
        matching(
            HOST_PATTERN,
            "a host name or IPv4 address such as '127.0.0.1' or '0.0.0.0' (no scheme, no port: "
            "the ports are http_port, grpc_port and metrics_port)",
        ),
    ] = Field("127.0.0.1", description="the address the server listens on")
    http_port: int = Field(8000, ge=1, le=65535, description="Triton's HTTP/REST port")
    grpc_port: int = Field(8001, ge=1, le=65535, description="Triton's gRPC port")
    metrics_port: int = Field(8002, ge=1, le=65535, description="Triton's Prometheus metrics port")

    def watch_point(self, what: str) -> WatchPoint:
        """Where the watch reads this Triton's metrics and probes it: its published ports."""
        point = WatchPoint(
            name=f"{what} {self.host}:{self.http_port}",
            http=f"{self.host}:{self.http_port}",
            grpc=f"{self.host}:{self.grpc_port}",
            metrics=f"http://{self.host}:{self.metrics_port}/metrics",
        )
        if self.openai.enabled:
            point["openai"] = self.openai.url(self.host)
        return point

    @model_validator(mode="after")
    def _ports_differ(self) -> PublishedSection:
        ports = [self.http_port, self.grpc_port, self.metrics_port]
        names = "http_port, grpc_port and metrics_port"
        if self.openai.enabled:
            ports.append(self.openai.port)
            names = "http_port, grpc_port, metrics_port and openai.port"
        if len(set(ports)) != len(ports):
            raise ValueError(f"{names} must differ (got {ports})")
        return self


class Deployment(TypedDict):
    target: str
    model_name: str
    version: str
    endpoints: list[Endpoint]  # where the smoke test queries the new version
    state: dict[str, Any]  # what rollback and retire need (JSON-able, no credentials)
    reused: bool


class DeployTarget:
    """One place a release can go. `spec` is its variant of the spec's `deploy` section; the
    release's name, work directory, MLflow model name and image section come with it."""

    name: ClassVar[str]
    Spec: ClassVar[type[DeploySection]]  # its `deploy:` section

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = plugins.tag_of(cls.Spec, "target")

    # Each target reads its own section's keys: a subclass narrows `spec` to its `Spec`.
    spec: DeploySection

    def __init__(
        self,
        spec: DeploySection,
        release: str,
        work: str = "",
        registry_model: str = "",
        image: ImageSpec | None = None,
    ):
        self.spec = spec
        self.release = release
        self.work = work
        self.registry_model = registry_model or release
        self.image = image

    def deploy(
        self,
        repository: str,
        model_name: str,
        version: str,
        files: dict[str, str],
        image: dict[str, Any],
        check: Check,
    ) -> Deployment:
        """Put `version` beside what serves; raise (having cleaned up) if it cannot load."""
        raise NotImplementedError

    def promote(self, deployment: Deployment) -> Deployment:
        """Make the new version what clients reach (most targets: it already is, by number)."""
        return deployment

    def retire(self, deployment: Deployment) -> list[str]:
        """After promotion: stop serving what served before; returns what was retired."""
        return []

    def rollback(self, deployment: Deployment) -> None:
        """Back to what served before the deploy."""

    def watch_points(self) -> list[WatchPoint]:
        """Where the watch (hf2triton.watch) reads metrics and probes what serves."""
        return []

    def restore(self, model_name: str, version: str, check: Check) -> list[str]:
        """Serve `version` again (one this target still holds) instead of what serves now: it
        loads beside the serving version and passes `check` before the other stops; returns the
        versions that stopped serving. Used by `hf2triton rollback` and the watch."""
        raise DeployError(
            f"deploy target {self.name!r} cannot roll back after promotion yet: "
            "release the previous version again instead"
        )

    def summary(self, deployment: Deployment) -> dict[str, Any]:
        """The release summary's `endpoint` (and any target-specific) entries."""
        first = deployment["endpoints"][0]
        endpoint = {
            "model": deployment["model_name"],
            "version": deployment["version"],
            "http": f"http://{first['http']}/v2/models/{deployment['model_name']}/versions/"
            f"{deployment['version']}/infer",
            "grpc": first["grpc"],
        }
        if first.get("openai"):
            endpoint["openai"] = first["openai"]
        return {"endpoint": endpoint}


# spec `deploy.target:` -> the target's class; each target's module registers it where it is
# defined (`@TARGETS.register`), and hf2triton.targets imports the modules.
TARGETS = plugins.Registry(lambda cls: cls.name, default="local-triton")
