"""kvc inside a real vLLM engine: ``vllm.LLM`` (vLLM's CPU build) with
``KvcConnector`` loaded by module path, against the same engine without a
connector. Each engine runs in a process of its own (kvc.vllm_engine), as a
server would start it; the checks are the greedy tokens each returns and
vLLM's own counters of what it found in its prefix cache and what the
connector loaded (``vllm:external_prefix_cache_hits``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import kvc
from kvc.vllm_engine import stored_objects

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("vllm")

from helpers import (engine_llama_config, family_model,  # noqa: E402
                     write_lora_adapter)

BLOCK = 32
CHUNK = 64
HITS = "vllm:external_prefix_cache_hits"
LOCAL_HITS = "vllm:prefix_cache_hits"


def run_engine(spec: dict[str, Any], tmp_path: Path, name: str) -> dict[str, Any]:
    """Runs one engine through ``spec``'s phases in a process of its own."""
    spec = {"block_size": BLOCK, "max_model_len": 1024, **spec}
    spec_path = tmp_path / f"{name}.spec.json"
    result_path = tmp_path / f"{name}.result.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "kvc.vllm_engine", spec_path,
                           result_path], env=env, capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0 or not result_path.is_file():
        raise AssertionError(f"engine {name} exited {done.returncode}:\n"
                             f"{done.stderr[-6000:]}")
    return json.loads(result_path.read_text())


def prompt_of(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (n,), generator=g).tolist()


def held(n: int) -> int:
    """The tokens kvc holds and loads of an n-token prompt saved whole:
    its whole chunks, the prompt's last token left to vLLM."""
    return (n - 1) // CHUNK * CHUNK


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random GQA Llama (2 layers, 4 heads and 2 KV heads of 32) that
    transformers writes in bf16."""
    torch.manual_seed(0)
    directory = str(tmp_path_factory.mktemp("engine-llama"))
    model = transformers.LlamaForCausalLM(engine_llama_config(transformers))
    model.to(torch.bfloat16).save_pretrained(directory)
    return directory


P1 = prompt_of(1, 300)
P2 = P1[:128] + prompt_of(2, 100)   # shares two chunks with P1
P3 = prompt_of(3, 200)               # shares nothing
Q = [prompt_of(10 + i, 150 + 20 * i) for i in range(3)]
BATCH = [P1, P1[:192] + prompt_of(4, 70), P2, *Q, prompt_of(5, 180),
         prompt_of(6, 90)]
ALL = [P1, P2, P3, *Q, *BATCH, P1[:128] + prompt_of(7, 60)]


@pytest.fixture(scope="module")
def reference(model_dir: str, tmp_path_factory: pytest.TempPathFactory
              ) -> dict[tuple[int, ...], list[int]]:
    """The engine's own greedy tokens for every prompt, without kvc."""
    tmp = tmp_path_factory.mktemp("reference")
    unique = list({tuple(p): p for p in ALL}.values())
    result = run_engine({"model": model_dir, "prefix_caching": False,
                         "phases": [{"generate": [{"tokens": p} for p in unique]}]},
                        tmp, "reference")
    outputs = result["phases"][0]["outputs"]
    return {tuple(p): out for p, out in zip(unique, outputs)}


def connector(store: Path, **extra: Any) -> dict[str, Any]:
    return {"stores": [f"file://{store}"], "chunk_tokens": CHUNK,
            "policy": "always", "strategies": ["kv"], **extra}


def generate(*prompts: list[int], salt: str | None = None) -> dict[str, Any]:
    return {"generate": [{"tokens": p, **({"salt": salt} if salt else {})}
                         for p in prompts]}


def test_loads_what_it_saved_and_keys_salts(model_dir: str, reference: Any,
                                            tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = run_engine({
        "model": model_dir, "prefix_caching": False,
        "connector": connector(store),
        "phases": [
            generate(P1, *Q),                    # saved
            generate(*BATCH),                    # 8 at once, most loaded
            generate(P1, salt="tenant-b"),       # another salt: nothing
            generate(P3),                        # nothing stored
        ]}, tmp_path, "kvc")
    assert "start_error" not in result, result
    save, batch, salted, miss = result["phases"]
    assert save["counters"][HITS] == 0
    assert save["outputs"] == [reference[tuple(p)] for p in (P1, *Q)]
    # Every prompt of the batch: vLLM's tokens; kvc loaded the chunks it
    # holds of each (P1 whole, P1's first 192, P2's two shared, Q whole).
    assert batch["outputs"] == [reference[tuple(p)] for p in BATCH]
    expected = held(300) + 192 + 128 + sum(held(len(q)) for q in Q)
    assert batch["counters"][HITS] == expected
    assert salted["counters"][HITS] == 0
    assert salted["outputs"] == [reference[tuple(P1)]]
    assert miss["counters"][HITS] == 0
    assert miss["outputs"] == [reference[tuple(P3)]]


def test_keys_lora_adapters(model_dir: str, tmp_path: Path) -> None:
    # Two adapters that change the model's K and V: the same prompt saved
    # under adapter a is never loaded for adapter b (zero external hits,
    # b's own tokens), and is for a again.
    config = engine_llama_config(transformers)
    adapters = {name: str(write_lora_adapter(tmp_path / name, config, seed))
                for name, seed in (("a", 1), ("b", 2))}
    lora = {"max_rank": 8, "adapters": adapters}

    def under(name: str) -> dict[str, Any]:
        return {"generate": [{"tokens": P1, "lora": name}]}

    alone = run_engine({"model": model_dir, "prefix_caching": False,
                        "lora": lora, "phases": [under("a"), under("b")]},
                       tmp_path, "lora-alone")
    assert "start_error" not in alone, alone
    ref_a, ref_b = (p["outputs"] for p in alone["phases"])
    assert ref_a != ref_b  # the adapters change what the model computes
    store = tmp_path / "store"
    result = run_engine({"model": model_dir, "prefix_caching": False,
                         "lora": lora, "connector": connector(store),
                         "phases": [under("a"), under("b"), under("a")]},
                        tmp_path, "lora-kvc")
    assert "start_error" not in result, result
    saved, other, again = result["phases"]
    assert saved["outputs"] == ref_a
    assert other["counters"][HITS] == 0
    assert other["outputs"] == ref_b
    assert again["counters"][HITS] == held(len(P1))
    assert again["outputs"] == ref_a


def test_loads_past_vllms_own_prefix(model_dir: str, reference: Any,
                                     tmp_path: Path) -> None:
    # vLLM's prefix cache on (its default): the connector loads only the
    # chunks past what vLLM already holds.
    store = tmp_path / "store"
    shared = P1[:128] + prompt_of(7, 60)
    result = run_engine({
        "model": model_dir, "prefix_caching": True,
        "connector": connector(store),
        "phases": [
            generate(P1),              # saved (and held by vLLM)
            {"reset_prefix_cache": True},
            generate(shared),          # vLLM holds nothing: kvc loads 128
            generate(P1),              # vLLM holds 128: kvc loads the rest
        ]}, tmp_path, "kvc-prefix")
    assert "start_error" not in result, result
    save, reset, first, second = result["phases"]
    assert save["outputs"] == [reference[tuple(P1)]]
    assert reset["reset"]
    assert first["counters"][HITS] == 128
    assert first["outputs"] == [reference[tuple(shared)]]
    assert second["counters"][LOCAL_HITS] == 128
    assert second["counters"][HITS] == held(300) - 128
    assert second["outputs"] == [reference[tuple(P1)]]


def test_corrupt_chunk_and_lost_store(model_dir: str, reference: Any,
                                      tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = run_engine({
        "model": model_dir, "prefix_caching": False,
        "connector": connector(store), "failure_policy": "recompute",
        "phases": [
            generate(P1),
            {"corrupt": str(store)},
            generate(P1),              # the corrupt chunk recomputed
            {"remove": str(store)},
            generate(P1),              # the store gone: vLLM prefills
        ]}, tmp_path, "kvc-faults")
    assert "start_error" not in result, result
    phases = result["phases"]
    assert phases[2]["outputs"] == [reference[tuple(P1)]]
    assert phases[4]["outputs"] == [reference[tuple(P1)]]


def test_corrupt_chunk_fails_the_request(model_dir: str, reference: Any,
                                         tmp_path: Path) -> None:
    # kv_load_failure_policy "fail": the request ends in an error; nothing
    # is generated from a cache kvc could not fill intact.
    store = tmp_path / "store"
    result = run_engine({
        "model": model_dir, "prefix_caching": False,
        "connector": connector(store), "failure_policy": "fail",
        "phases": [generate(P1), {"corrupt": str(store)}, generate(P1)]},
        tmp_path, "kvc-fail")
    assert "start_error" not in result, result
    last = result["phases"][2]
    assert "error" in last or last["finish_reasons"] == ["error"], last
    if "outputs" in last:
        assert last["outputs"][0] != reference[tuple(P1)] or \
            last["finish_reasons"] == ["error"]


def test_kv_events_and_metrics(model_dir: str, reference: Any,
                               tmp_path: Path) -> None:
    # A KV-aware router's view: a ZMQ subscriber to vLLM's KV events sees
    # kvc's saved blocks under vLLM's own block hashes (medium STORAGE) and
    # the blocks of a chunk a load found corrupt removed; vLLM's
    # Prometheus registry holds kvc's counters.
    store = tmp_path / "store"
    result = run_engine({
        "model": model_dir, "prefix_caching": True, "kv_events": True,
        "connector": connector(store), "failure_policy": "recompute",
        "phases": [
            generate(P1),                 # saved
            {"reset_prefix_cache": True},
            {"corrupt": str(store)},
            generate(P1),                 # loaded, one chunk recomputed
        ]}, tmp_path, "kvc-events")
    assert "start_error" not in result, result
    phases = result["phases"]
    assert phases[3]["outputs"] == [reference[tuple(P1)]]
    events = [e for phase in phases for e in phase["events"]]
    # vLLM's own blocks of P1, in order: the hashes a router knows.
    vllm_blocks = [h for e in phases[0]["events"]
                   if e["type"] == "stored" and e["medium"] == "GPU"
                   for h in e["block_hashes"]]
    stored = [e for e in events
              if e["type"] == "stored" and e["medium"] == "STORAGE"]
    assert len(stored) == 1, events
    chunks = held(300) // BLOCK
    assert stored[0]["block_hashes"] == vllm_blocks[:chunks]
    assert stored[0]["tokens"] == held(300)
    removed = [e for e in events
               if e["type"] == "removed" and e["medium"] == "STORAGE"]
    assert len(removed) == 1, events
    assert len(removed[0]["block_hashes"]) == CHUNK // BLOCK
    assert set(removed[0]["block_hashes"]) <= set(stored[0]["block_hashes"])

    def total(name: str) -> float:
        return result["counters"].get(name, 0.0)

    assert total("vllm:kvc_decisions{strategy=recompute}") == 1
    assert total("vllm:kvc_decisions{strategy=kv}") == 1
    assert total("vllm:kvc_hit_tokens") == held(300)
    assert total("vllm:kvc_loads") == 1
    assert total("vllm:kvc_loaded_tokens") == held(300)
    assert total("vllm:kvc_fallback_tokens") == CHUNK
    assert total("vllm:kvc_load_bytes") > 0
    assert total("vllm:kvc_load_seconds_count") == 1
    assert total("vllm:kvc_load_seconds_sum") > 0
    assert total("vllm:kvc_saves") == 1
    assert total("vllm:kvc_saved_objects") == held(300) // CHUNK * 2
    assert total("vllm:kvc_failed_saves") == total("vllm:kvc_failed_loads") == 0


def test_prefill_decode_disaggregation(model_dir: str, reference: Any,
                                       tmp_path: Path) -> None:
    # P/D over a shared store: a producer engine (kv_role kv_producer)
    # prefills and saves, loading nothing; a consumer (kv_consumer) loads
    # what it saved and decodes, saving nothing. The consumer's tokens are
    # a single engine's.
    store = tmp_path / "store"
    producer = run_engine({
        "model": model_dir, "prefix_caching": False, "role": "kv_producer",
        "connector": connector(store),
        "phases": [{**generate(P1, *Q), "max_tokens": 1},
                   {**generate(P1), "max_tokens": 1}]}, tmp_path, "producer")
    assert "start_error" not in producer, producer
    assert producer["phases"][1]["counters"][HITS] == 0  # loads nothing
    saved = stored_objects(store)
    assert saved
    consumer = run_engine({
        "model": model_dir, "prefix_caching": False, "role": "kv_consumer",
        "connector": connector(store),
        "phases": [generate(P1, *Q), generate(P3)]}, tmp_path, "consumer")
    assert "start_error" not in consumer, consumer
    loaded, missed = consumer["phases"]
    assert loaded["outputs"] == [reference[tuple(p)] for p in (P1, *Q)]
    assert loaded["counters"][HITS] == held(300) + sum(held(len(q)) for q in Q)
    assert missed["outputs"] == [reference[tuple(P3)]]
    assert stored_objects(store) == saved  # the consumer saved nothing


def test_a_producer_killed_mid_save_leaves_the_consumer_exact(
        model_dir: str, reference: Any, tmp_path: Path) -> None:
    # The producer is killed (SIGKILL) once its first object is written,
    # its other writes still crossing a slow link: the consumer loads the
    # whole chunks it finds and computes the rest; its tokens are a single
    # engine's.
    store = tmp_path / "store"
    slow = {**connector(store), "stores": [f"file://{store}?gbps=0.0005"]}
    spec = tmp_path / "producer.spec.json"
    spec.write_text(json.dumps({
        "block_size": BLOCK, "max_model_len": 1024, "model": model_dir,
        "prefix_caching": False, "role": "kv_producer", "connector": slow,
        "phases": [{**generate(P1), "max_tokens": 1}]}))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    producer = subprocess.Popen(
        [sys.executable, "-m", "kvc.vllm_engine", spec,
         tmp_path / "producer.result.json"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not stored_objects(store):
            assert producer.poll() is None, "the producer ended first"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        producer.kill()
        producer.wait()
    found = len(stored_objects(store))
    assert 0 < found < held(300) // CHUNK * 2  # some, not all
    consumer = run_engine({
        "model": model_dir, "prefix_caching": False, "role": "kv_consumer",
        "connector": connector(store), "phases": [generate(P1)]},
        tmp_path, "consumer")
    assert "start_error" not in consumer, consumer
    phase = consumer["phases"][0]
    assert phase["outputs"] == [reference[tuple(P1)]]
    assert phase["counters"][HITS] % CHUNK == 0
    assert phase["counters"][HITS] < held(300)


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3"])
def test_model_families(family: str, tmp_path: Path) -> None:
    # vLLM's own Mistral, Qwen2 (q/k/v biases) and Qwen3 (per-head q/k
    # norms, here with attention_bias) over the engine Llama's sizes, their
    # biases and norms random: kvc reads the model, saves vLLM's KV and
    # loads it back; the tokens are the engine's own.
    torch.manual_seed(0)
    directory = tmp_path / family
    model = family_model(transformers, torch, family,
                         engine_llama_config(transformers))
    model.to(torch.bfloat16).save_pretrained(directory)
    prompts = [P1, P2]
    plain = run_engine({"model": str(directory), "prefix_caching": False,
                        "phases": [generate(*prompts)]}, tmp_path,
                       f"{family}-plain")
    result = run_engine({
        "model": str(directory), "prefix_caching": False,
        "connector": connector(tmp_path / "store"),
        "phases": [generate(P1), generate(*prompts)]}, tmp_path,
        f"{family}-kvc")
    assert "start_error" not in result, result
    saved, loaded = result["phases"]
    assert saved["counters"][HITS] == 0
    assert loaded["counters"][HITS] == held(300) + 128
    assert loaded["outputs"] == plain["phases"][0]["outputs"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_float32_and_float16_caches(model_dir: str, tmp_path: Path,
                                    dtype: str) -> None:
    # An f32 engine (its cache packed for f32, kvc's staging and store in
    # bf16) and an f16 one (staged and stored in f16): the tokens are the
    # engine's own.
    prompts = [P1, P2]
    plain = run_engine({"model": model_dir, "dtype": dtype,
                        "prefix_caching": False,
                        "phases": [generate(*prompts)]}, tmp_path,
                       f"{dtype}-plain")
    store = tmp_path / "store"
    result = run_engine({
        "model": model_dir, "dtype": dtype, "prefix_caching": False,
        "connector": connector(store),
        "phases": [generate(P1), generate(*prompts)]}, tmp_path,
        f"{dtype}-kvc")
    assert "start_error" not in result, result
    loaded = result["phases"][1]
    assert loaded["counters"][HITS] == held(300) + 128
    assert loaded["outputs"] == plain["phases"][0]["outputs"]


def test_tensor_parallel_engines_share_stores(model_dir: str, reference: Any,
                                              tmp_path: Path) -> None:
    # Tensor parallelism (2 ranks, a KV head each): rank 0's worker loads
    # and saves whole objects, rank 1 receives and sends its heads through
    # vLLM's group. What a TP=1 engine saved loads at TP=2, and what the
    # TP=2 engine saved loads at TP=1; the tokens are each engine's own.
    tp2 = {"model": model_dir, "prefix_caching": False,
           "tensor_parallel_size": 2}
    plain = run_engine({**tp2, "phases": [generate(P1, P2)]}, tmp_path,
                       "tp2-plain")
    store = tmp_path / "store"
    run_engine({"model": model_dir, "prefix_caching": False,
                "connector": connector(store), "phases": [generate(P1)]},
               tmp_path, "tp1-saves")
    result = run_engine({**tp2, "connector": connector(store),
                         "phases": [generate(P1, P2), generate(P3)]},
                        tmp_path, "tp2-kvc")
    assert "start_error" not in result, result
    loaded, saved = result["phases"]
    assert loaded["counters"][HITS] == held(300) + 128
    assert loaded["outputs"] == plain["phases"][0]["outputs"]
    assert saved["counters"][HITS] == 0
    back = run_engine({"model": model_dir, "prefix_caching": False,
                       "connector": connector(store),
                       "phases": [generate(P3)]}, tmp_path, "tp1-loads")
    assert back["phases"][0]["counters"][HITS] == held(200)
    assert back["phases"][0]["outputs"] == [reference[tuple(P3)]]


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_caches(model_dir: str, tmp_path: Path,
                    kv_cache_dtype: str) -> None:
    # An fp8 cache (E4M3, E5M2): loads packed by vLLM's own cache write,
    # saves decoded from its codes. The tokens are the fp8 engine's own, and
    # a store saved by the bf16 engine is not the fp8 engine's (its values
    # are not the ones the fp8 engine keeps): it finds nothing there.
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
        _get_attn_isa(torch.bfloat16, BLOCK, 32, kv_cache_dtype)
    except NotImplementedError as error:
        # vLLM's CPU attention runs fp8 caches with AVX-512 or AMX only.
        pytest.skip(f"vLLM refuses {kv_cache_dtype} caches here: {error}")
    prompts = [P1, P2]
    fp8 = {"model": model_dir, "prefix_caching": False,
           "kv_cache_dtype": kv_cache_dtype}
    plain = run_engine({**fp8, "phases": [generate(*prompts)]}, tmp_path,
                       f"{kv_cache_dtype}-plain")
    store = tmp_path / "store"
    run_engine({"model": model_dir, "prefix_caching": False,
                "connector": connector(store), "phases": [generate(P3)]},
               tmp_path, "bf16-saves")
    result = run_engine({
        **fp8, "connector": connector(store),
        "phases": [generate(P3), generate(P1), generate(*prompts)]},
        tmp_path, f"{kv_cache_dtype}-kvc")
    assert "start_error" not in result, result
    other, saved, loaded = result["phases"]
    assert other["counters"][HITS] == 0
    assert saved["counters"][HITS] == 0
    assert loaded["counters"][HITS] == held(300) + 128
    assert loaded["outputs"] == plain["phases"][0]["outputs"]


@pytest.fixture(scope="module")
def larger_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random Llama whose prefill on this CPU takes tens of
    milliseconds (4 layers, hidden 512, 8 heads and 4 KV heads of 64), so
    that loads and vLLM's prefill can be told apart."""
    torch.manual_seed(0)
    directory = str(tmp_path_factory.mktemp("larger-llama"))
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=512, intermediate_size=1024,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
        max_position_embeddings=2048, initializer_range=0.3)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(
        directory)
    return directory


def test_prices_vllms_own_prefill(larger_model_dir: str,
                                  tmp_path: Path) -> None:
    # policy cheapest (the default) against the prefill vLLM was measured
    # to take: a store that loads faster than vLLM prefills is loaded; the
    # same store behind a slow link is not (vLLM prefills), same tokens.
    store = tmp_path / "store"
    warm = [{"generate": [{"tokens": prompt_of(100 + i, n)}], "max_tokens": 2}
            for i, n in enumerate([100, 300, 500, 700, 900, 200, 600, 400])]
    prompt = prompt_of(50, 800)
    fast = run_engine({
        "model": larger_model_dir, "prefix_caching": False,
        "max_model_len": 2048,
        "connector": {"stores": [f"file://{store}"], "chunk_tokens": CHUNK},
        "phases": [generate(prompt), *warm, generate(prompt)]},
        tmp_path, "priced-fast")
    assert "start_error" not in fast, fast
    stored, *_, loaded = fast["phases"]
    decision = loaded["decisions"][0]
    assert decision["recompute_seconds"] is not None, decision
    # The recompute is priced at vLLM's speed: within a factor of two of the
    # prefill vLLM took for the same prompt (docs/results.md measures how
    # close), where kvc's carried target (cpu-2core) is not the engine.
    measured = stored["prefill_seconds"][0]
    assert measured / 2 < decision["recompute_seconds"] < measured * 2, \
        (decision, measured)
    assert decision["load_tokens"] == held(800), decision
    assert loaded["counters"][HITS] == held(800)
    assert loaded["outputs"] == stored["outputs"]

    # A target that prices kvc's compute ten times slower than vLLM's, and
    # the store behind a link where a load of one chunk (64 tokens) takes
    # longer than vLLM's prefill of the whole prompt: priced against the
    # target, loads look faster than recomputing (and are slower); against
    # vLLM's measured prefill, vLLM prefills.
    target = json.loads((Path(kvc.__file__).parent / "targets" /
                         "cpu-2core.json").read_text())
    target["compute"]["dense_tflops"] /= 10
    target["compute"]["mem_gbs"] /= 10
    (tmp_path / "slow-compute.json").write_text(json.dumps(target))
    slow_store = {"stores": [f"file://{store}?gbps=0.005"],
                  "chunk_tokens": CHUNK, "save": False, "strategies": ["kv"],
                  "target": str(tmp_path / "slow-compute.json")}
    slow = run_engine({
        "model": larger_model_dir, "prefix_caching": False,
        "max_model_len": 2048, "connector": slow_store,
        "phases": [*warm, generate(prompt)]}, tmp_path, "priced-slow")
    assert "start_error" not in slow, slow
    last = slow["phases"][-1]
    assert last["counters"][HITS] == 0
    assert last["decisions"][0]["load_tokens"] == 0
    assert "not faster than" in last["decisions"][0]["why"]
    assert "vLLM's measured prefill" in last["decisions"][0]["why"]
    assert last["outputs"] == stored["outputs"]
    # The same engine priced by the target alone loads.
    by_target = run_engine({
        "model": larger_model_dir, "prefix_caching": False,
        "max_model_len": 2048,
        "connector": {**slow_store, "prefill": "target"},
        "phases": [generate(prompt)]}, tmp_path, "priced-by-target")
    assert by_target["phases"][0]["counters"][HITS] > 0
    assert by_target["phases"][0]["outputs"] == stored["outputs"]


def test_aborts_mid_load_and_mid_save(model_dir: str, reference: Any,
                                      tmp_path: Path) -> None:
    # Requests aborted while kvc saves them (first phase) and while it
    # loads them (a slow link, asynchronous loads): every block comes back
    # to vLLM, the others finish with vLLM's tokens, and a later request
    # loads what was stored intact.
    store = tmp_path / "store"
    slow = connector(tmp_path / "slow-store")
    result = run_engine({
        "model": model_dir, "prefix_caching": False,
        "connector": connector(store),
        "phases": [
            {"abort": {"generate": [{"tokens": P1}, {"tokens": P2}],
                       "steps": 1, "abort": [0]}},
            generate(P1, P2),
        ]}, tmp_path, "kvc-abort-save")
    assert "start_error" not in result, result
    aborted, after = result["phases"]
    assert aborted["free_blocks"] == aborted["blocks"] - 1
    assert aborted["outputs"][1] == reference[tuple(P2)]
    assert after["outputs"] == [reference[tuple(P1)], reference[tuple(P2)]]

    loading = run_engine({
        "model": model_dir, "prefix_caching": False,
        "connector": {**slow, "async_load": True},
        "phases": [
            generate(P1, P2),
            {"reset_prefix_cache": True},
        ]}, tmp_path, "kvc-fill-slow")
    assert "start_error" not in loading, loading
    throttled = {**slow, "async_load": True,
                 "stores": [f"file://{tmp_path / 'slow-store'}?gbps=0.002"]}
    result = run_engine({
        "model": model_dir, "prefix_caching": False, "connector": throttled,
        "phases": [
            {"abort": {"generate": [{"tokens": P1}, {"tokens": P2}],
                       "steps": 2, "abort": [0]}},
            generate(P3),
        ]}, tmp_path, "kvc-abort-load")
    assert "start_error" not in result, result
    aborted, after = result["phases"]
    assert aborted["free_blocks"] == aborted["blocks"] - 1
    assert aborted["outputs"][1] == reference[tuple(P2)]
    assert after["outputs"] == [reference[tuple(P3)]]


def test_preemption_under_block_pressure(model_dir: str, tmp_path: Path) -> None:
    # Too few blocks for eight long decodes: vLLM preempts and recomputes
    # while kvc loads and saves; every request ends with the tokens the
    # engine alone gives under the same pressure.
    prompts = [P1, P2, *Q, P1[:192] + prompt_of(8, 40), prompt_of(9, 120),
               prompt_of(10, 160)]
    phases = [generate(P1, *Q), {"reset_prefix_cache": True},
              {**generate(*prompts), "max_tokens": 96}]
    plain = run_engine({"model": model_dir, "prefix_caching": True,
                        "num_gpu_blocks": 40, "phases": phases},
                       tmp_path, "pressure-plain")
    store = tmp_path / "store"
    result = run_engine({"model": model_dir, "prefix_caching": True,
                         "num_gpu_blocks": 40, "connector": connector(store),
                         "phases": phases}, tmp_path, "pressure-kvc")
    assert "start_error" not in result, result
    last = result["phases"][2]
    assert last["counters"]["vllm:num_preemptions"] > 0
    assert last["counters"][HITS] > 0
    assert last["outputs"] == plain["phases"][2]["outputs"]
