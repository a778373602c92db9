"""transformers as kvc's client: a stored prompt restored into a
DynamicCache (every strategy, a partial prefix, a corrupt chunk, a lossy
codec), and transformers decoding from it as it does without any cache,
for a trained Llama and random Llama, Qwen2 and Qwen3 models.
transformers is the independent reference: kvc's K and V, computed or
loaded, must make transformers' own model say what it says on its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvc  # noqa: E402
from helpers import (corrupt_one_object, family_model,  # noqa: E402
                     tiny_llama_config)
from kvc.transformers import CacheClient, PagedMemory, next_token_quality  # noqa: E402

CHUNK = 64
STEPS = 12


def load(directory: str) -> object:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="module",
                params=["stories260K", "generated", "llama3-rope", "mistral",
                        "mistral-window", "qwen2", "qwen2-yarn", "qwen3"])
def subject(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object, list[int]]:
    """(model directory, transformers model, a 200-token prompt it wrote)."""
    if request.param == "stories260K":
        directory = request.getfixturevalue("stories_dir")
    else:
        # A model of transformers' own making (a Llama, a Qwen2 with its
        # q/k/v biases, a Qwen3 with its q/k norms): kvc reads what it saves
        # and computes what transformers' forward does.
        torch.manual_seed(0)
        family = "llama" if request.param == "generated" else request.param
        directory = str(tmp_path_factory.mktemp(f"generated-{family}"))
        family_model(transformers, torch, family,
                     tiny_llama_config(transformers)).save_pretrained(directory)
    model = load(directory)
    # A prompt the model itself finds likely: its own greedy text.
    with torch.no_grad():
        prompt = model.generate(torch.tensor([[1]]), max_new_tokens=199,
                                do_sample=False, min_new_tokens=199)[0]
    return directory, model, prompt.tolist()


def _layer(cache: object, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    entry = cache.layers[layer]  # type: ignore[attr-defined]
    return entry.keys, entry.values


def generate_after(model: object, prompt: list[int],
                   cache: object | None) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), past_key_values=cache,
                             max_new_tokens=STEPS, min_new_tokens=STEPS,
                             do_sample=False)
    return out[0, len(prompt):].tolist()


# Logits closer than this are a tie bf16's rounding of K and V may break
# either way; a wrong cache moves them by far more.
NEAR_TIE = 0.05


def assert_continues(model: object, prompt: list[int], cache: object,
                     reference: list[int]) -> None:
    """``generate`` from ``cache`` continues with ``reference``'s greedy
    tokens, or leaves them first at a token transformers' own logits tie
    within NEAR_TIE (the random models have such ties)."""
    got = generate_after(model, prompt, cache)
    if got == reference:
        return
    i = next(i for i, (a, b) in enumerate(zip(got, reference)) if a != b)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + reference[:i]])).logits[0, -1]
    margin = float(logits[reference[i]] - logits[got[i]])
    assert margin < NEAR_TIE, (i, got, reference, margin)


def saved_store(tmp_path: Path, directory: str, prompt: list[int],
                forms: str = "kv") -> str:
    """A file store holding ``prompt``, saved by kvc-run (kvc's prefill)."""
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(" ".join(map(str, prompt)))
    store = f"file://{tmp_path}/store"
    kvc.run_tool(["save", "--model", directory, "--tokens", tokens,
                  "--store", store, "--chunk-tokens", CHUNK, "--layer-group",
                  "1", "--forms", forms])
    return store


@pytest.mark.parametrize("strategy",
                         ["compute", "kv", "hidden", "cake", "hcache", "joint"])
def test_every_strategy_restores_what_transformers_decodes_from(
        subject: tuple[str, object, list[int]], strategy: str,
        tmp_path: Path) -> None:
    directory, model, prompt = subject
    reference = generate_after(model, prompt, None)
    store = saved_store(tmp_path, directory, prompt, forms="kv,hidden")
    connector = kvc.Connector(directory, [store], strategies=[strategy],
                              policy="always", chunk_tokens=CHUNK)
    client = CacheClient(model, connector, capacity_tokens=512)
    restored = client.restore("r", prompt)
    assert restored.decision.loads, restored.decision.why
    assert restored.decision.strategy == strategy
    assert restored.tokens == 192  # three whole chunks of the 200
    assert_continues(model, prompt, restored.cache, reference)
    # What the plan computed, transformers computed (the server's prefill).
    computes = strategy in ("compute", "cake", "hcache")
    assert (connector.prefills_served > 0) == computes or strategy == "joint"


@pytest.mark.parametrize("server_prefill", [True, False])
def test_the_server_computes_what_a_plan_computes(
        subject: tuple[str, object, list[int]], tmp_path: Path,
        server_prefill: bool) -> None:
    # transformers' model with one layer's values negated is not the model in
    # the directory kvc reads: a plan that computes matches transformers'
    # own decoding only when transformers computed it.
    directory, _, prompt = subject
    model = load(directory)
    with torch.no_grad():
        model.model.layers[0].self_attn.v_proj.weight.neg_()
    reference = generate_after(model, prompt, None)
    # The stores hold the prompt (saved by kvc's model): compute is chosen.
    connector = kvc.Connector(directory,
                              [saved_store(tmp_path, directory, prompt)],
                              strategies=["compute"], policy="always",
                              chunk_tokens=CHUNK)
    client = CacheClient(model, connector, capacity_tokens=512,
                         server_prefill=server_prefill)
    restored = client.restore("r", prompt)
    assert restored.decision.strategy == "compute" and restored.tokens == 192
    kl, _ = next_token_quality(model, restored, prompt, reference)
    print(f"server_prefill={server_prefill}: KL {kl:.3g} nats")
    if server_prefill:
        assert connector.prefills_served > 0
        assert kl < 1e-3
    else:
        assert connector.prefills_served == 0
        assert kl > 1e-2


def test_a_server_prefill_that_raises_fails_the_load(
        subject: tuple[str, object, list[int]], tmp_path: Path) -> None:
    directory, model, prompt = subject
    connector = kvc.Connector(directory,
                              [saved_store(tmp_path, directory, prompt)],
                              strategies=["compute"], policy="always",
                              chunk_tokens=CHUNK)
    client = CacheClient(model, connector, capacity_tokens=512)

    def broken(*args: object) -> object:
        raise RuntimeError("the server's model is out of memory")

    def load() -> None:
        decision = connector.decide("r", prompt, 0)
        assert decision.loads
        blocks = client.memory.allocate(decision.load_tokens)
        try:
            connector.start_load("r", blocks)
            connector.wait_load("r")
        finally:
            connector.cancel("r")
            client.memory.free(blocks)

    connector.prefill_with(broken)
    with pytest.raises(kvc.Error, match="out of memory"):
        load()
    # A result other than a (K, V) pair per layer is refused, named.
    connector.prefill_with(lambda *args: [])
    with pytest.raises(kvc.Error, match="one \\(K, V\\) pair per layer"):
        load()


@pytest.mark.parametrize("seconds_per_token,loads", [(1e-12, False),
                                                     (1.0, True)])
def test_loads_are_weighed_against_transformers_prefill(
        subject: tuple[str, object, list[int]], tmp_path: Path,
        seconds_per_token: float, loads: bool) -> None:
    # The client's measured prefill decides: one that takes no time is
    # never beaten by a load, one of a second a token always is (the
    # target's price alone would decide both the same way).
    directory, model, prompt = subject
    connector = kvc.Connector(directory,
                              [saved_store(tmp_path, directory, prompt)],
                              strategies=["kv"], chunk_tokens=CHUNK)
    client = CacheClient(model, connector, capacity_tokens=512)
    assert client.prefill_clock.seconds(len(prompt)) is None
    for tokens in (32, 64, 128, 256):
        client.prefill_clock.observe(tokens, tokens * seconds_per_token)
    restored = client.restore("r", prompt)
    assert restored.decision.loads == loads, restored.decision.why


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_partial_prefix_is_loaded_and_the_rest_computed(
        subject: tuple[str, object, list[int]], tmp_path: Path,
        dtype: str) -> None:
    directory, model, prompt = subject
    # The prefix as it comes back: transformers' K and V rounded to the
    # memory's dtype, stored in bf16 (kvc's KV dtype) and loaded into the
    # memory again. transformers continues from that as it does from the
    # restored cache (that rounding alone flips a near-tied token of the
    # random YaRN model in f16).
    cast = getattr(torch, dtype)

    def stored(x: torch.Tensor) -> torch.Tensor:
        return x.to(cast).to(torch.bfloat16).to(cast).to(x.dtype)

    from transformers import DynamicCache
    with torch.no_grad():
        prefix = model(torch.tensor([prompt[:128]]), use_cache=True)
    layers = [_layer(prefix.past_key_values, i)
              for i in range(model.config.num_hidden_layers)]
    reference = generate_after(model, prompt, DynamicCache(
        [(stored(k), stored(v)) for k, v in layers], config=model.config))
    connector = kvc.Connector(directory, [f"file://{tmp_path}/s"],
                              policy="always", strategies=["kv"],
                              chunk_tokens=CHUNK)
    config = model.config
    # The server's memory as torch tensors of either dtype, viewed by kvc.
    memory = PagedMemory(config.num_hidden_layers, config.num_key_value_heads,
                         config.hidden_size // config.num_attention_heads,
                         num_blocks=32, dtype=getattr(torch, dtype))
    client = CacheClient(model, connector, memory)
    # transformers' own prefill of the first 128 tokens, saved through kvc.
    metrics = client.save("a", prompt[:128])
    assert metrics["written"] == 2 * model.config.num_hidden_layers
    assert connector.lookup(prompt).tokens == 128
    restored = client.restore("b", prompt)
    assert restored.decision.load_tokens == 128 and restored.tokens == 128
    assert_continues(model, prompt, restored.cache, reference)


@pytest.mark.parametrize("recompute", [True, False])
def test_a_corrupt_chunk_is_never_served(
        subject: tuple[str, object, list[int]], tmp_path: Path,
        recompute: bool) -> None:
    directory, model, prompt = subject
    reference = generate_after(model, prompt, None)
    store = saved_store(tmp_path, directory, prompt)
    corrupt_one_object(tmp_path / "store")
    connector = kvc.Connector(directory, [store], policy="always",
                              strategies=["kv"], chunk_tokens=CHUNK,
                              recompute_failures=recompute)
    client = CacheClient(model, connector, capacity_tokens=512)
    restored = client.restore("r", prompt)
    if not recompute:
        assert restored.failed_blocks
        assert restored.tokens < 192
        assert_continues(model, prompt, restored.cache, reference)
        return
    assert restored.metrics and restored.metrics["fallbacks"]
    assert restored.tokens == 192 and not restored.failed_blocks
    # The corrupt chunk was recomputed by transformers (in the memory's
    # f16) beside chunks kvc's model saved (bf16): every row is within a
    # few bf16 steps of transformers' own prefill, which a served corrupt
    # chunk is not. (Such a mixed cache may flip a near-tied greedy token
    # of a random model, so the tokens are not compared.)
    with torch.no_grad():
        full = model(torch.tensor([prompt[:192]]), use_cache=True)
    for layer in range(model.config.num_hidden_layers):
        for got, want in zip(_layer(restored.cache, layer),
                             _layer(full.past_key_values, layer)):
            error = (got - want).abs().max() / want.abs().max()
            assert error < 0.05, (layer, float(error))
    kl, _ = next_token_quality(model, restored, prompt, reference)
    assert kl < 5e-3, kl


def test_a_store_that_went_away_leaves_transformers_to_prefill(
        subject: tuple[str, object, list[int]], tmp_path: Path) -> None:
    directory, model, prompt = subject
    reference = generate_after(model, prompt, None)
    store = saved_store(tmp_path, directory, prompt)
    connector = kvc.Connector(directory, [store], chunk_tokens=CHUNK,
                              policy="always", strategies=["kv"])
    client = CacheClient(model, connector, capacity_tokens=512)
    for path in sorted((tmp_path / "store").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    restored = client.restore("r", prompt)
    assert restored.tokens == 0 and not restored.decision.loads
    assert generate_after(model, prompt, restored.cache) == reference


# Bounds with room over what the models measure (docs/python.md): the random
# models' weights make int4 costly, and their near-ties let one of the 20
# positions' top tokens flip under the server's fp16 cache alone (Qwen2, raw:
# KL 5e-4 nats, agreement 0.95); a broken codec or a misplaced token is far
# beyond them.
@pytest.mark.parametrize("codec,max_kl,min_agree",
                         [("raw", 5e-3, 0.9), ("int8", 0.02, 0.9),
                          ("hadamard+int4", 1.0, 0.45)])
def test_codec_quality_on_transformers_logits(
        subject: tuple[str, object, list[int]], tmp_path: Path, codec: str,
        max_kl: float, min_agree: float) -> None:
    directory, model, prompt = subject
    connector = kvc.Connector(directory, [f"file://{tmp_path}/s"],
                              policy="always", strategies=["kv"],
                              chunk_tokens=CHUNK, codec=codec)
    client = CacheClient(model, connector, capacity_tokens=512)
    client.save("a", prompt)
    restored = client.restore("b", prompt)
    assert restored.tokens == 192
    kl, agree = next_token_quality(model, restored, prompt,
                                   generate_after(model, prompt, None))
    print(f"{codec}: KL {kl:.3g} nats, top-1 agreement {agree:.3f}")
    # 18 of 20 positions is 0.9 in float32: 0.89999998.
    assert kl <= max_kl and agree >= min_agree - 1e-6


def test_a_save_that_fails_raises_its_own_error(
        subject: tuple[str, object, list[int]], tmp_path: Path) -> None:
    """A cache the memory cannot hold stops the save with its own error,
    not with the Connector's about a request it never saw."""
    directory, model, prompt = subject
    connector = kvc.Connector(directory, [f"file://{tmp_path}/store"],
                              chunk_tokens=CHUNK)
    client = CacheClient(model, connector, capacity_tokens=512)
    kv_heads = connector.model.kv_heads
    wrong = [(torch.zeros(1, kv_heads, len(prompt), 3),) * 2
             for _ in range(connector.model.layers)]
    with pytest.raises(RuntimeError) as raised:
        client.save("s", prompt, cache=wrong)
    assert not isinstance(raised.value, kvc.Error)
