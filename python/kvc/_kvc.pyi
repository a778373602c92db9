"""Type stubs of kvc's extension module (python/src/module.cpp)."""

from typing import Any, Callable, Sequence

has_compiler: bool
has_cuda: bool

def set_compute_threads(threads: int) -> None: ...

class Model:
    @staticmethod
    def load(dir: str) -> Model: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def layers(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def max_positions(self) -> int: ...

class Held:
    store: int
    chunk_tokens: int
    layer_group: int
    form: str
    codec: str
    tokens: int

class Lookup:
    held: list[Held]
    tokens: int
    from_index: bool

class Decision:
    load_tokens: int
    strategy: str
    predicted_seconds: float
    recompute_seconds: float
    why: str
    store: int
    chunk_tokens: int
    layer_group: int
    loads: bool

class ConnectorSpec:
    """A Connector's options by name (kvc::host::ConnectorSpec)."""
    stores: list[str]
    tenant: str
    chunk_tokens: int
    layer_group: int
    codec: str
    strategies: str
    policy: str
    recompute_failures: bool
    staging_mib: int
    codec_profile: str
    gpu_chip: str
    max_kl: float
    plan_cache_entries: int
    def __init__(self) -> None: ...

class Connector:
    @staticmethod
    def create(model: Model, spec: ConnectorSpec, target_json: str,
               bundles: Sequence[str], device: str) -> Connector: ...
    def register_caches(self, keys: Sequence[Any], values: Sequence[Any],
                        layout: str) -> None: ...
    def lookup(self, tokens: Sequence[int]) -> Lookup: ...
    def decide(self, id: str, tokens: Sequence[int],
               tokens_on_device: int,
               recompute_seconds: float | None = None) -> Decision: ...
    def decide_as(self, id: str, tokens: Sequence[int],
                  tokens_on_device: int, load_tokens: int, strategy: str,
                  store: int, chunk_tokens: int,
                  layer_group: int) -> Decision: ...
    def start_load(self, id: str, block_ids: Sequence[int]) -> None: ...
    def wait_layer(self, id: str, layer: int,
                   timeout: float | None) -> None: ...
    def wait_layer_on(self, id: str, layer: int, stream: int) -> None: ...
    def wait_load(self, id: str) -> dict[str, Any]: ...
    def failed_blocks(self, id: str) -> list[int]: ...
    def save_layer(self, id: str, tokens: Sequence[int], layer: int,
                   block_ids: Sequence[int]) -> None: ...
    def wait_save(self, id: str) -> dict[str, Any]: ...
    def cancel(self, id: str) -> None: ...
    def finished(self) -> tuple[list[str], list[str]]: ...
    def set_prefill(self, fn: Callable[..., Any] | None) -> None: ...
    @property
    def prefills_served(self) -> int: ...
    @property
    def plans_compiled(self) -> int: ...
    @property
    def plan_cache_hits(self) -> int: ...
    def close(self) -> None: ...

def compile_restore(model: Model, store: str, tenant: str,
                    tokens: Sequence[int], target_json: str,
                    strategies: Sequence[str]
                    ) -> list[tuple[str, float | None]]: ...
