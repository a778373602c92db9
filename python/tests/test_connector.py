"""The Connector through Python: tensors viewed in place, errors raised as
kvc.Error, the GIL released while kvc works. numpy only."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import kvc

BLOCK = 16


def server_caches(model: kvc.Model, blocks: int = 64,
                  dtype: type = np.float16) -> tuple[list[np.ndarray], list[np.ndarray]]:
    shape = (blocks, BLOCK, model.kv_heads, model.head_dim)
    return ([np.zeros(shape, dtype) for _ in range(model.layers)],
            [np.zeros(shape, dtype) for _ in range(model.layers)])


def fill(keys: list[np.ndarray], values: list[np.ndarray], blocks: list[int],
         seed: int) -> None:
    """What a server's prefill would write: distinct values per layer."""
    rng = np.random.default_rng(seed)
    for k, v in zip(keys, values):
        k[blocks] = rng.standard_normal(k[blocks].shape).astype(k.dtype)
        v[blocks] = rng.standard_normal(v[blocks].shape).astype(v.dtype)


def bf16(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bfloat16 (to nearest, ties to even), as stored: a
    model's KV is kept at its KV dtype whatever the server's caches hold."""
    bits = a.astype(np.float32).view(np.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.view(np.float32).astype(a.dtype)


def connector(model: kvc.Model, store: str, **options: object) -> kvc.Connector:
    options.setdefault("chunk_tokens", 64)
    return kvc.Connector(model, [store], **options)


@pytest.fixture()
def model(gen_model: str) -> kvc.Model:
    return kvc.Model(gen_model)


def test_model_describes_itself(model: kvc.Model) -> None:
    assert (model.layers, model.kv_heads, model.head_dim) == (2, 2, 16)
    assert len(model.fingerprint) == 64
    with pytest.raises(kvc.Error) as error:
        kvc.Model("/nonexistent/model")
    assert error.value.code == "not_found"


def test_a_save_and_a_load_move_the_servers_own_bytes(model: kvc.Model) -> None:
    c = connector(model, "mem://", policy="always", strategies=["kv"])
    keys, values = server_caches(model)
    c.register_caches(keys, values)
    tokens = list(range(1, 200))
    assert c.lookup(tokens).tokens == 0

    saved = list(range(13))
    fill(keys, values, saved, seed=3)
    for layer in range(model.layers):
        c.save_layer("a", tokens, layer, saved)
    metrics = c.wait_save("a")
    assert metrics["written"] == 3 * model.layers  # 3 whole 64-token chunks
    c.cancel("a")

    found = c.lookup(tokens)
    assert found.tokens == 192 and found.from_index
    assert found.held[0].codec == "raw" and found.held[0].form == "kv"

    decision = c.decide("b", tokens, 0)
    assert decision.loads and decision.load_tokens == 192, decision.why
    loaded = list(range(20, 32))
    c.start_load("b", loaded)
    for layer in range(model.layers):
        if layer % 2:
            c.wait_layer("b", layer, timeout=30)
        else:
            # The CPU device has no streams: a wait on one is the host's,
            # and the layer is written when it returns.
            c.wait_layer_on("b", layer, stream=0)
            np.testing.assert_array_equal(keys[layer][loaded],
                                          bf16(keys[layer][saved[:12]]))
    assert c.wait_load("b")["bytes_read"]
    assert c.failed_blocks("b") == []
    # The load wrote into the numpy arrays themselves: what was saved, at
    # the model's KV dtype (bf16).
    for k, v in zip(keys, values):
        np.testing.assert_array_equal(k[loaded], bf16(k[saved[:12]]))
        np.testing.assert_array_equal(v[loaded], bf16(v[saved[:12]]))
    c.cancel("b")
    assert "b" in c.finished().loads


def test_one_tensor_per_layer_layouts(model: kvc.Model) -> None:
    c = connector(model, "mem://", policy="always", strategies=["kv"])
    shape = (2, 64, BLOCK, model.kv_heads, model.head_dim)
    caches = [np.zeros(shape, np.float16) for _ in range(model.layers)]
    c.register_caches(caches, layout="keys_first")
    tokens = list(range(5, 69))
    for cache in caches:
        cache[:, :4] = np.random.default_rng(0).standard_normal(
            cache[:, :4].shape)
    for layer in range(model.layers):
        c.save_layer("a", tokens, layer, [0, 1, 2, 3])
    c.wait_save("a")
    c.cancel("a")
    assert c.decide("b", tokens + [1], 0).load_tokens == 64
    c.start_load("b", [10, 11, 12, 13])
    c.wait_load("b")
    for cache in caches:
        np.testing.assert_array_equal(cache[:, 10:14], bf16(cache[:, 0:4]))


def test_bad_caches_are_refused(model: kvc.Model) -> None:
    c = connector(model, "mem://")
    keys, values = server_caches(model, dtype=np.float32)
    with pytest.raises(kvc.Error) as error:
        c.register_caches(keys, values)
    assert error.value.code == "unimplemented"
    keys, values = server_caches(model)
    with pytest.raises(kvc.Error, match="K and a V tensor per layer"):
        c.register_caches(keys)
    with pytest.raises(kvc.Error, match="first's shape"):
        c.register_caches(keys, values[:-1] + [np.zeros((3, BLOCK, 2, 16),
                                                        np.float16)])
    with pytest.raises(kvc.Error, match="heads|layers|shape"):
        c.register_caches(keys[:1], values[:1])
    with pytest.raises(kvc.Error, match="layout expects"):
        c.register_caches(keys, values, layout="sideways")  # type: ignore[arg-type]
    # A strided view is not the server's contiguous memory, and a copy of
    # it would take the loads: refused, never converted.
    with pytest.raises(TypeError):
        c.register_caches([k[:, ::2] for k in keys],
                          [v[:, ::2] for v in values])



def test_bad_requests_are_refused(model: kvc.Model) -> None:
    c = connector(model, "mem://", policy="always", strategies=["kv"])
    keys, values = server_caches(model, blocks=8)
    c.register_caches(keys, values)
    with pytest.raises(kvc.Error):
        c.start_load("never-decided", [0])
    with pytest.raises(kvc.Error):
        c.wait_load("never-decided")
    tokens = list(range(64))
    fill(keys, values, [0, 1, 2, 3], seed=1)
    for layer in range(model.layers):
        c.save_layer("a", tokens, layer, [0, 1, 2, 3])
    c.wait_save("a")
    assert c.decide("b", tokens + [7], 0).load_tokens == 64
    with pytest.raises(kvc.Error) as error:
        c.start_load("b", [0, 1, 2, 99])
    assert error.value.code == "invalid_argument"
    with pytest.raises(kvc.Error):
        c.save_layer("c", tokens, 5, [0, 1, 2, 3])
    with pytest.raises(kvc.Error, match="one-dimensional"):
        c.lookup([[1, 2]])  # type: ignore[list-item]


@pytest.mark.parametrize("option, value, message", [
    ("policy", "sometimes", "policy expects cheapest, always or never"),
    ("strategies", ["kv", "teleport"], "strategies: unknown strategy"),
    ("codec", "int9", "codec"),
    ("chunk_tokens", 0, "chunk_tokens must be positive"),
    ("layer_group", -1, "layer_group must be positive"),
    ("staging_mib", 0, "staging_mib must be positive"),
    ("plan_cache_entries", 0, "plan_cache_entries must be positive"),
    ("max_kl", -0.5, "max_kl must be 0 or more"),
])
def test_options_are_parsed_by_name(model: kvc.Model, option: str,
                                    value: object, message: str) -> None:
    # Every option goes through kvc::host::connectorOptions, as kvc-run's.
    with pytest.raises(kvc.Error, match=message) as error:
        connector(model, "mem://", **{option: value})
    assert error.value.code == "invalid_argument"


def saved_prompt(model: kvc.Model, **options: object) -> tuple[
        kvc.Connector, list[int]]:
    """A Connector over a fresh ``mem://`` store holding one saved prompt of
    129 tokens (two whole chunks), and the prompt."""
    c = connector(model, "mem://", **options)
    keys, values = server_caches(model)
    c.register_caches(keys, values)
    tokens = list(range(1, 130))
    for layer in range(model.layers):
        c.save_layer("a", tokens, layer, [0, 1, 2, 3, 4, 5, 6, 7])
    c.wait_save("a")
    return c, tokens


def test_named_options_reach_the_connector(model: kvc.Model) -> None:
    c, tokens = saved_prompt(model, policy="never", strategies=["kv", "cake"],
                             plan_cache_entries=1)
    decision = c.decide("b", tokens, 0)
    assert not decision.loads and "never loads" in decision.why


def test_the_waits_release_the_gil(model: kvc.Model) -> None:
    # A load over a slow link: Python threads run while wait_load blocks.
    c = connector(model, "mem://?gbps=0.02", policy="always",
                  strategies=["kv"])
    keys, values = server_caches(model, blocks=80)
    c.register_caches(keys, values)
    tokens = list(range(1, 1100))
    blocks = list(range(69))
    fill(keys, values, blocks, seed=5)
    for layer in range(model.layers):
        c.save_layer("a", tokens, layer, blocks)
    c.wait_save("a")
    c.cancel("a")
    assert c.decide("b", tokens, 0).load_tokens == 1088
    ticks = 0
    done = threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    c.start_load("b", blocks)
    started = time.monotonic()
    c.wait_load("b")
    waited = time.monotonic() - started
    before = ticks
    done.set()
    ticker.join()
    assert waited > 0.05  # 557 KB over 20 Mbit/s
    assert before > 10


def test_plans_are_cached_by_shape(model: kvc.Model) -> None:
    c, tokens = saved_prompt(model, policy="always", strategies=["kv"])
    c.decide("b", tokens, 0)
    compiled = c.plans_compiled
    c.decide("c", tokens, 0)
    assert c.plans_compiled == compiled and c.plan_cache_hits >= 1


def test_a_closed_connector_says_so(model: kvc.Model) -> None:
    with connector(model, "mem://") as c:
        pass
    with pytest.raises(kvc.Error, match="closed"):
        c.lookup([1, 2, 3])


def test_compile_restore_prices_every_strategy(model: kvc.Model,
                                               tmp_path: Path) -> None:
    if not kvc.has_compiler:
        pytest.skip("built without the compiler")
    store = f"file://{tmp_path}/store"
    c = connector(model, store)
    keys, values = server_caches(model)
    c.register_caches(keys, values)
    tokens = list(range(1, 129))
    fill(keys, values, list(range(8)), seed=2)
    for layer in range(model.layers):
        c.save_layer("a", tokens, layer, list(range(8)))
    c.wait_save("a")
    c.close()
    # The store records its layout: no chunk size is repeated here.
    plans = kvc.compile_restore(model, store, tokens)
    assert {"compute", "kv", "joint"} <= plans.keys()
    assert all(seconds is None or seconds > 0 for seconds in plans.values())
    with pytest.raises(kvc.Error):
        kvc.compile_restore(model, "file:///nonexistent/store", tokens)


def test_targets_and_tools() -> None:
    assert "cpu-2core" in kvc.targets() and "h100-sxm" in kvc.targets()
    with pytest.raises(kvc.Error) as error:
        kvc.Connector("/nonexistent", ["mem://"], target="no-such-machine")
    assert error.value.code == "not_found"
    assert "kvc-run" in kvc.run_tool(["--version"]).stdout
    with pytest.raises(kvc.Error, match="unknown command"):
        kvc.run_tool(["no-such-command"])
