"""vLLM as kvc's client: kvc.vllm.KvcConnector under vLLM's own Scheduler
on the CPU (a DeviceConfig("cpu") and a local model directory, as vLLM's
connector unit tests build one), with the worker side on CPU tensors in
vLLM's KV layout. The forward pass is played by transformers: it writes
the KV of the tokens vLLM computes; what kvc loads must equal what a full
prefill writes."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig,  # noqa: E402
                         ModelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorRole)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, SlidingWindowSpec)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import kvc  # noqa: E402
from helpers import corrupt_one_object, tiny_llama_config  # noqa: E402
from kvc.prefill import PrefillClock  # noqa: E402
from kvc.vllm import KvcConnector  # noqa: E402

# The Redis Cluster the lit tests start (test/lit-tools/redis_cluster.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test"
                       / "lit-tools"))
from redis_cluster import RedisCluster  # noqa: E402

BLOCK = 16
BLOCKS = 96
CHUNK = 64
LAYERS = 2
KV_HEADS = 2
HEAD_DIM = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch.manual_seed(0)
    config = tiny_llama_config(transformers)
    assert (config.num_hidden_layers, config.num_key_value_heads) == \
        (LAYERS, KV_HEADS)
    directory = str(tmp_path_factory.mktemp("vllm-llama"))
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


class Engine:
    """vLLM's Scheduler and one worker's connector, stepped by hand; the
    model runner's forward pass is transformers writing the computed
    tokens' K and V into vLLM's paged caches."""

    def __init__(self, model_dir: str, stores: list[str], blocks: int = BLOCKS,
                 **extra: Any) -> None:
        self.blocks = blocks
        extra = {"stores": stores, "chunk_tokens": CHUNK, **extra}
        self.config = VllmConfig(
            model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True,
                                     dtype="float32", seed=0,
                                     max_model_len=1024),
            scheduler_config=SchedulerConfig(
                max_num_seqs=16, max_num_batched_tokens=1024,
                max_model_len=1024, enable_chunked_prefill=True,
                is_encoder_decoder=False),
            # vLLM's own prefix cache off: every hit is kvc's.
            cache_config=CacheConfig(block_size=BLOCK, cache_dtype="auto",
                                     enable_prefix_caching=False),
            kv_transfer_config=KVTransferConfig(
                kv_connector="KvcConnector",
                kv_connector_module_path="kvc.vllm", kv_role="kv_both",
                kv_load_failure_policy="recompute",
                kv_connector_extra_config=extra),
            device_config=DeviceConfig("cpu"))
        self.names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        self.kv_cache_config = kv_cache_config = KVCacheConfig(
            num_blocks=blocks, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(self.names, FullAttentionSpec(
                block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                dtype=torch.bfloat16))])
        self.config.cache_config.num_gpu_blocks = blocks
        self.scheduler = Scheduler(
            vllm_config=self.config, kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.config),
            block_size=BLOCK)
        self.worker = KvcConnector(self.config, KVConnectorRole.WORKER,
                                   kv_cache_config)
        # vLLM's FlashAttention layout: [2, blocks, block_size, heads, dim].
        self.caches = {name: torch.zeros(2, blocks, BLOCK, KV_HEADS, HEAD_DIM,
                                         dtype=torch.bfloat16)
                       for name in self.names}
        self.worker.register_kv_caches(self.caches)
        self.model = transformers.LlamaForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32).eval()
        self.tables: dict[str, list[int]] = {}
        self.prompts: dict[str, list[int]] = {}
        self.loaded: dict[str, int] = {}
        self.invalid: set[int] = set()

    def add(self, request_id: str, prompt: list[int], max_tokens: int = 2) -> None:
        self.prompts[request_id] = prompt
        self.scheduler.add_request(Request(
            request_id, prompt, SamplingParams(max_tokens=max_tokens,
                                               ignore_eos=True), None))

    @torch.no_grad()
    def full_prefill(self, tokens: list[int]) -> list[tuple[Any, Any]]:
        """transformers' K and V of ``tokens`` per layer, [n, heads, dim]."""
        cache = self.model(torch.tensor([tokens]), use_cache=True).past_key_values
        return [(layer.keys[0].transpose(0, 1), layer.values[0].transpose(0, 1))
                for layer in cache.layers]

    def rows(self, request_id: str, begin: int, end: int) -> Any:
        t = torch.arange(begin, end)
        table = torch.tensor(self.tables[request_id])
        return table[t // BLOCK], t % BLOCK

    def step(self) -> Any:
        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        for new in out.scheduled_new_reqs:
            self.tables[new.req_id] = list(new.block_ids[0])
            self.loaded[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        computed = {new.req_id: new.num_computed_tokens
                    for new in out.scheduled_new_reqs}
        for i, req_id in enumerate(cached.req_ids):
            if cached.new_block_ids[i] is not None:
                self.tables[req_id].extend(cached.new_block_ids[i][0])
            computed[req_id] = cached.num_computed_tokens[i]
        self.worker.handle_preemptions(meta)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)  # type: ignore[arg-type]
        # The forward pass: the prompt tokens vLLM computes this step.
        writes = {}
        for req_id, begin in computed.items():
            end = min(begin + out.num_scheduled_tokens[req_id],
                      len(self.prompts[req_id]))
            if end > begin:
                writes[req_id] = (begin, end,
                                  self.full_prefill(self.prompts[req_id][:end]))
        for layer, name in enumerate(self.names):
            self.worker.wait_for_layer_load(name)
            for req_id, (begin, end, kv) in writes.items():
                blocks, offsets = self.rows(req_id, begin, end)
                self.caches[name][0, blocks, offsets] = kv[layer][0][begin:end].to(torch.bfloat16)
                self.caches[name][1, blocks, offsets] = kv[layer][1][begin:end].to(torch.bfloat16)
            self.worker.save_kv_layer(name, self.caches[name], None)
        self.worker.wait_for_save()
        sending, receiving = self.worker.get_finished(out.finished_req_ids)
        errors = self.worker.get_block_ids_with_load_errors()
        self.invalid |= errors
        self.worker.clear_connector_metadata()
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for req_id in ids:
            done = computed[req_id] + out.num_scheduled_tokens[req_id]
            sampled.append([7] if done >= len(self.prompts[req_id]) else [])
        self.scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                finished_sending=sending, finished_recving=receiving,
                invalid_block_ids=errors)))
        return out

    def run(self, seconds: float = 300, settle: bool = True) -> None:
        """Steps until no request is left (vLLM's engine loop keeps stepping
        while a finished request's save still holds its blocks), then (with
        ``settle``) waits for the saves' writes, which the worker waits for
        off the forward pass. ``seconds`` guards against a hang only: a
        loaded CI machine may take tens of seconds."""
        deadline = time.monotonic() + seconds
        while self.scheduler.requests or self.worker.connector_worker._saves_started:
            if time.monotonic() > deadline:
                raise AssertionError(f"requests left after {seconds} s: "
                                     f"{list(self.scheduler.requests)}")
            out = self.step()
            if not out.num_scheduled_tokens:
                time.sleep(0.001)
        if settle:
            assert self.worker.flush_saves(seconds)

    def loaded_error(self, request_id: str) -> float:
        """The largest difference of the loaded tokens' K and V from a full
        prefill, relative to the largest |K| or |V|."""
        n = self.loaded[request_id]
        reference = self.full_prefill(self.prompts[request_id][:n])
        blocks, offsets = self.rows(request_id, 0, n)
        error = largest = 0.0
        for layer, name in enumerate(self.names):
            for kv in (0, 1):
                mine = self.caches[name][kv, blocks, offsets].float()
                error = max(error, float((mine - reference[layer][kv]).abs().max()))
                largest = max(largest, float(reference[layer][kv].abs().max()))
        return error / largest

    def assert_empty(self) -> None:
        """No request, block or connector state left behind."""
        scheduler = self.scheduler
        assert not scheduler.requests and not scheduler.running
        assert len(scheduler.waiting) == 0
        pool = scheduler.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == self.blocks - 1  # all but the null one
        assert isinstance(scheduler.connector, KvcConnector)
        connector = scheduler.connector.connector_scheduler
        assert connector is not None
        assert not connector._saving and not connector._prefills
        assert not connector._holding
        assert not connector._pending_loads and not connector._on_device
        assert not connector._waiting and not connector._stored
        assert not connector._partial
        assert not self.worker.connector_worker._saves_started and not self.worker.connector_worker._loading
        assert not self.worker.connector_worker._receiving


def prompt_of(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (n,), generator=g).tolist()


def test_full_partial_and_no_hits(model_dir: str, tmp_path: Path) -> None:
    engine = Engine(model_dir, [f"file://{tmp_path}/store"], policy="always",
                    strategies=["kv"])
    prompt = prompt_of(1, 200)
    engine.add("a", prompt)
    engine.run()
    engine.assert_empty()
    assert engine.loaded["a"] == 0

    # The same prompt: three whole chunks stored, vLLM computes the rest.
    engine.add("full", prompt)
    # A prompt sharing only the first two chunks.
    engine.add("partial", prompt[:128] + prompt_of(2, 72))
    # Nothing in common.
    engine.add("miss", prompt_of(3, 150))
    engine.run()
    assert engine.loaded == {"a": 0, "full": 192, "partial": 128, "miss": 0}
    assert engine.loaded_error("full") <= 1 / 64
    assert engine.loaded_error("partial") <= 1 / 64
    assert not engine.invalid
    engine.assert_empty()


def test_asynchronous_loads(model_dir: str, tmp_path: Path) -> None:
    # vLLM keeps the requests out of the batch while kvc loads, and
    # schedules them once the worker reports the loads done.
    engine = Engine(model_dir, [f"file://{tmp_path}/store"], policy="always",
                    strategies=["kv"], async_load=True)
    prompt = prompt_of(1, 200)
    engine.add("a", prompt)
    engine.run()
    engine.add("full", prompt)
    engine.add("partial", prompt[:128] + prompt_of(2, 72))
    out = engine.step()
    assert not out.scheduled_new_reqs  # both wait for their loads
    assert {load.request_id for load in out.kv_connector_metadata.loads} == \
        {"full", "partial"}
    engine.run()
    assert engine.loaded == {"a": 0, "full": 192, "partial": 128}
    assert engine.loaded_error("full") <= 1 / 64
    assert engine.loaded_error("partial") <= 1 / 64
    assert not engine.invalid
    engine.assert_empty()


def test_an_abort_during_an_asynchronous_load(model_dir: str,
                                              tmp_path: Path) -> None:
    engine = Engine(model_dir, [f"file://{tmp_path}/store?gbps=0.005"],
                    policy="always", strategies=["kv"], async_load=True)
    prompt = prompt_of(1, 200)
    engine.add("a", prompt)
    engine.run()  # and written behind the slow link
    engine.add("b", prompt)
    engine.step()
    assert "b" in engine.worker.connector_worker._receiving
    engine.scheduler.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    engine.run()
    assert "b" not in engine.loaded
    engine.assert_empty()


def test_kvc_declines_when_recomputing_is_faster(model_dir: str,
                                                 tmp_path: Path) -> None:
    # A store behind a very slow link: the Cheapest policy leaves the prompt
    # to vLLM's prefill (priced by the target: this harness's forward pass
    # is not vLLM's, test_vllm_engine.py prices a real one); and one that
    # loads faster than the target's prefill is loaded.
    prompt = prompt_of(1, 200)
    for gbps, loaded in ((0.0001, 0), (100, 192)):
        engine = Engine(model_dir, [f"file://{tmp_path}/store?gbps={gbps}"],
                        prefill="target")
        engine.add("a", prompt)
        engine.run()
        engine.add("b", prompt)
        engine.run()
        assert engine.loaded["b"] == loaded
        engine.assert_empty()


@pytest.mark.parametrize("load_over_prefill", [0.8, 0.3])
def test_a_load_that_holds_up_the_queue_is_left_to_vllm(
        model_dir: str, tmp_path: Path, load_over_prefill: float) -> None:
    # Eight requests for a stored prompt arrive together; each one's load is
    # priced at a fraction of its own prefill. A load holds up the end of
    # the step it joins, and so every request behind it, where a prefill
    # holds up only those behind it: at 0.8 of the prefill loading every
    # request would make the queue's mean first token later than vLLM
    # prefilling some of them, at 0.3 it would not.
    engine = Engine(model_dir, [f"file://{tmp_path}/store"], blocks=160,
                    strategies=["kv"])
    prompt = prompt_of(1, 200)
    engine.add("a", prompt)
    engine.run()
    assert isinstance(engine.scheduler.connector, KvcConnector)
    scheduler = engine.scheduler.connector.connector_scheduler
    assert scheduler is not None
    # vLLM's prefill as if measured at 2 ms + 0.1 ms a token (and not
    # re-measured from this harness's steps).
    scheduler._clock = PrefillClock()
    for tokens in (64, 128, 256, 512):
        scheduler._clock.observe(tokens, 0.002 + 1e-4 * tokens)
    scheduler._clock.observe = lambda *args, **kwargs: None  # type: ignore
    scheduler._calibrate()
    probe = scheduler._kvc_for(scheduler._tenant).decide(
        "probe", prompt[:-1], 0, 1.0)
    scheduler._kvc_for(scheduler._tenant).cancel("probe")
    assert probe.loads and probe.load_tokens == 192
    scheduler._load_clock.observe(probe.predicted_seconds,
                                  load_over_prefill * 0.022)
    for i in range(8):
        engine.add(f"q{i}", prompt)
    engine.run()
    loaded = [engine.loaded[f"q{i}"] for i in range(8)]
    held = [d for d in scheduler.decisions if "would hold up" in d.why]
    if load_over_prefill < 0.5:
        assert loaded == [192] * 8 and not held
    else:
        assert 0 in loaded and held, (loaded, [d.why for d in
                                               scheduler.decisions])
        assert all(d.load_tokens == 0 for d in held)
    engine.assert_empty()


def test_the_worker_runs_the_schedulers_decision(model_dir: str,
                                                 tmp_path: Path,
                                                 caplog: Any) -> None:
    # The scheduler decides b's load while the store holds two of its
    # chunks; a third is stored before the worker starts the load. The
    # worker loads the two it was told to (vLLM computes the rest), and
    # never decides again.
    store = f"file://{tmp_path}/store"
    engine = Engine(model_dir, [store], policy="always", strategies=["kv"])
    prompt = prompt_of(1, 200)
    engine.add("a", prompt[:129])
    engine.run()
    engine.add("b", prompt)
    out = engine.scheduler.schedule()
    (load,) = out.kv_connector_metadata.loads
    assert (load.loaded, load.decision.load_tokens) == (128, 128)
    other = Engine(model_dir, [store], policy="always", strategies=["kv"])
    other.add("c", prompt)
    other.run()
    assert other.loaded["c"] == 128  # and it saved the third chunk

    def no_second_decision(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the worker decided again")

    for tenant_kvc in engine.worker.connector_worker._kvcs.values():
        tenant_kvc.decide = no_second_decision  # type: ignore[method-assign]
    engine.worker.bind_connector_metadata(out.kv_connector_metadata)
    with caplog.at_level(logging.DEBUG, logger="kvc.vllm"):
        engine.worker.start_load_kv(None)  # type: ignore[arg-type]
        engine.worker.wait_for_save()
    engine.worker.clear_connector_metadata()
    loaded = [r.args for r in caplog.records
              if r.msg == "kvc: request %s loaded: %s"]
    assert loaded and loaded[0][0] == "b"
    # Two chunks of every layer (objects of one size each), nothing more.
    sizes = {p.stat().st_size for p in (tmp_path / "store").rglob("*")
             if p.is_file() and "layouts" not in p.parts}
    assert len(sizes) == 1
    assert sum(loaded[0][1]["bytes_read"].values()) == \
        2 * LAYERS * sizes.pop(), loaded[0][1]


def test_a_corrupt_chunk_is_recomputed_by_vllm(model_dir: str,
                                               tmp_path: Path) -> None:
    engine = Engine(model_dir, [f"file://{tmp_path}/store"], policy="always",
                    strategies=["kv"])
    prompt = prompt_of(1, 200)
    engine.add("a", prompt)
    engine.run()
    corrupt_one_object(tmp_path / "store")
    engine.add("b", prompt)
    engine.run()
    # vLLM was told which blocks failed and recomputed from the first.
    assert engine.invalid
    engine.assert_empty()


def test_a_store_that_went_away(model_dir: str, tmp_path: Path) -> None:
    engine = Engine(model_dir, [f"file://{tmp_path}/store"], policy="always",
                    strategies=["kv"], save=True)
    prompt = prompt_of(1, 200)
    engine.add("a", prompt)
    engine.run()
    for path in sorted((tmp_path / "store").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    engine.add("b", prompt)
    engine.run()
    assert engine.loaded["b"] == 0
    engine.assert_empty()


def test_a_cluster_master_gone(model_dir: str) -> None:
    """A Redis Cluster of three masters without replicas loses one after
    the save: kvc loads what the two that answer hold, vLLM is told which
    blocks failed and recomputes them, and the cache is exact."""
    if not RedisCluster.available():
        pytest.skip("no redis-server")
    prompt = prompt_of(3, 512)
    whole = (len(prompt) - 1) // CHUNK * CHUNK
    loaded = []
    # Each master is the victim of a cluster of its own: which one held the
    # first chunk decides how much prefix is left.
    for victim in range(3):
        with RedisCluster() as cluster:
            engine = Engine(model_dir,
                            [f"redis-cluster://{cluster.nodes}?timeout_ms=500"],
                            policy="always", strategies=["kv"])
            engine.add("a", prompt)
            engine.run()
            cluster.kill(victim)
            engine.add("b", prompt)
            engine.run()
            # kvc loaded a prefix the live masters hold and stopped at the
            # dead master's first chunk, or tried it and told vLLM which
            # blocks failed; vLLM recomputed the rest; the cache is exact.
            assert engine.invalid or engine.loaded["b"] < whole
            assert engine.loaded_error("b") < 1 / 64
            engine.assert_empty()
            loaded.append(engine.loaded["b"])
    # Two of the three masters did not hold the first chunk.
    assert sum(tokens > 0 for tokens in loaded) >= 2, loaded


def test_an_abort_during_a_save_leaves_nothing_behind(model_dir: str,
                                                      tmp_path: Path) -> None:
    engine = Engine(model_dir, [f"file://{tmp_path}/store?gbps=0.01"],
                    policy="always", strategies=["kv"])
    # Aborted while its save still writes over a slow link: vLLM frees its
    # blocks only once the worker reports the save done.
    engine.add("aborted", prompt_of(1, 200), max_tokens=50)
    engine.step()
    engine.step()
    assert engine.worker.connector_worker._saves_started == {"aborted"}
    engine.scheduler.finish_requests("aborted", RequestStatus.FINISHED_ABORTED)
    assert engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() \
        < engine.blocks - 1
    engine.run()
    engine.assert_empty()


def test_a_preemption_during_a_save_leaves_nothing_behind(
        model_dir: str, tmp_path: Path) -> None:
    # Too few blocks for both requests to decode: vLLM preempts the later
    # one while its save still reads its blocks; the worker stops the save
    # before vLLM reuses them.
    engine = Engine(model_dir, [f"file://{tmp_path}/store?gbps=0.005"],
                    blocks=20, policy="always", strategies=["kv"])
    engine.add("q", prompt_of(4, 40), max_tokens=120)
    engine.add("p", prompt_of(1, 200), max_tokens=40)
    preempted = False
    deadline = time.monotonic() + 60
    while engine.scheduler.requests or engine.worker.connector_worker._saves_started:
        assert time.monotonic() < deadline
        saving = "p" in engine.worker.connector_worker._saves_started
        out = engine.step()
        if "p" in (out.preempted_req_ids or ()):
            # Preempted while its save was running: stopped and forgotten.
            assert saving and "p" not in engine.worker.connector_worker._saves_started
            preempted = True
    assert preempted
    engine.assert_empty()


def test_bad_configurations_are_clear_errors(model_dir: str,
                                             tmp_path: Path) -> None:
    with pytest.raises(Exception, match="stores"):
        Engine(model_dir, [])
    with pytest.raises(Exception, match="unknown keys"):
        Engine(model_dir, [f"file://{tmp_path}/s"], colour="blue")
    with pytest.raises(Exception, match="multiple of vLLM's block size"):
        Engine(model_dir, [f"file://{tmp_path}/s"], chunk_tokens=40)


def _documented_refusals() -> dict[str, str]:
    """docs/vllm.md's table of what the connector refuses at start: what,
    and the message (``N`` a number, ``...`` anything)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "vllm.md").read_text()
    table = text.split("## Refused at start, by name", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (.+?) \| (.+?) \|$", table, re.M)
    return {what: message for what, message in rows
            if what != "what" and not set(what) <= set("-")}


def _message_pattern(documented: str) -> str:
    """A documented message as a pattern: each `quoted` part, in order,
    ``N`` and ``M`` standing for numbers and ``...`` for anything."""
    parts = re.findall(r"`([^`]+)`", documented)
    assert parts, documented
    wildcards = {"...": ".*", "N": r"\d+", "M": r"\d+"}
    return ".*".join(
        "".join(wildcards.get(piece) or re.escape(piece)
                for piece in re.split(r"(\.\.\.|\b[NM]\b)", part))
        for part in parts)


def test_the_refusals_are_the_documented_ones(model_dir: str,
                                             tmp_path: Path) -> None:
    # Every row of docs/vllm.md's refusal table is raised, with its message,
    # by the configuration it names; and every refusal the tests know is in
    # the table.
    engine = Engine(model_dir, [f"file://{tmp_path}/store"])
    config, groups = engine.config, engine.kv_cache_config

    def start(vllm_config: Any = config, kv_cache_config: Any = groups) -> None:
        KvcConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)

    def tensor_parallel(mp: pytest.MonkeyPatch) -> None:
        mp.setattr(config.parallel_config, "tensor_parallel_size", 2)
        mp.setitem(config.kv_transfer_config.kv_connector_extra_config,
                   "device", "cuda")
        start()

    def pipeline_parallel(mp: pytest.MonkeyPatch) -> None:
        mp.setattr(config.parallel_config, "pipeline_parallel_size", 2)
        start()

    def mla(mp: pytest.MonkeyPatch) -> None:
        mp.setattr(type(config.model_config), "use_mla",
                   property(lambda self: True))
        start()

    def fp8(mp: pytest.MonkeyPatch) -> None:
        mp.setattr(config.cache_config, "cache_dtype", "fp8_e4m3")
        mp.setitem(config.kv_transfer_config.kv_connector_extra_config,
                   "device", "cuda")
        start()

    def sliding(mp: pytest.MonkeyPatch) -> None:
        start(kv_cache_config=KVCacheConfig(
            num_blocks=BLOCKS, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(engine.names, SlidingWindowSpec(
                block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                dtype=torch.bfloat16, sliding_window=64))]))

    def unreadable(mp: pytest.MonkeyPatch) -> None:
        other = tmp_path / "gpt2"
        shutil.copytree(model_dir, other)
        settings = json.loads((other / "config.json").read_text())
        (other / "config.json").write_text(json.dumps(
            {**settings, "model_type": "gpt2"}))
        mp.setitem(config.kv_transfer_config.kv_connector_extra_config,
                   "model", str(other))
        start()

    def shape(mp: pytest.MonkeyPatch) -> None:
        engine.worker.register_kv_caches({
            name: torch.zeros(BLOCKS, BLOCK, KV_HEADS, HEAD_DIM,
                              dtype=torch.bfloat16) for name in engine.names})

    def layers(mp: pytest.MonkeyPatch) -> None:
        engine.worker.register_kv_caches(
            {engine.names[0]: engine.caches[engine.names[0]]})

    triggers = {
        "tensor parallelism on a GPU or with `async_load`": tensor_parallel,
        "pipeline parallelism > 1": pipeline_parallel,
        "MLA models (DeepSeek's latent KV)": mla,
        "an fp8 KV cache on a GPU (`kv_cache_dtype fp8*`, kvc's device cuda)":
            fp8,
        "hybrid, sliding-window or state-space models": sliding,
        "a model kvc cannot read": unreadable,
        "caches of another shape": shape,
        "caches of another layer count": layers,
    }
    documented = _documented_refusals()
    assert set(documented) == set(triggers)
    for what, trigger in triggers.items():
        with pytest.MonkeyPatch.context() as mp, \
                pytest.raises(kvc.Error) as raised:
            trigger(mp)
        if what == "a model kvc cannot read":
            assert 'model_type: "gpt2"' in str(raised.value), raised.value
        else:
            assert re.search(_message_pattern(documented[what]),
                             str(raised.value)), (what, str(raised.value))


def test_worker_calls_before_registration_and_unsupported_models(
        model_dir: str, tmp_path: Path) -> None:
    engine = Engine(model_dir, [f"file://{tmp_path}/store"], policy="always",
                    strategies=["kv"])
    engine.add("a", prompt_of(1, 200))
    engine.run()
    engine.add("b", prompt_of(1, 200))
    out = engine.scheduler.schedule()
    assert out.kv_connector_metadata.loads
    worker = KvcConnector(engine.config, KVConnectorRole.WORKER,
                          engine.kv_cache_config)
    worker.bind_connector_metadata(out.kv_connector_metadata)
    with pytest.raises(kvc.Error, match="register_kv_caches"):
        worker.start_load_kv(None)  # type: ignore[arg-type]
    with pytest.raises(kvc.Error, match="layers"):
        worker.register_kv_caches({"model.layers.0.self_attn.attn":
                                   engine.caches[engine.names[0]]})
    with pytest.raises(kvc.Error, match="shape"):
        worker.register_kv_caches({name: torch.zeros(BLOCKS, BLOCK, KV_HEADS,
                                                     HEAD_DIM, dtype=torch.bfloat16)
                                   for name in engine.names})
    sliding = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(engine.names, SlidingWindowSpec(
                                block_size=BLOCK, num_kv_heads=KV_HEADS,
                                head_size=HEAD_DIM, dtype=torch.bfloat16,
                                sliding_window=64))])
    with pytest.raises(kvc.Error, match="full attention"):
        KvcConnector(engine.config, KVConnectorRole.WORKER, sliding)


def test_a_save_kvc_refuses_still_frees_its_blocks(model_dir: str,
                                                   tmp_path: Path) -> None:
    # A save refused when handed (here: a block table too short for the
    # prompt) is reported done, so that vLLM frees the request's blocks.
    engine = Engine(model_dir, [f"file://{tmp_path}/store"], policy="always",
                    strategies=["kv"])
    scheduler_side = engine.scheduler.connector
    build = scheduler_side.build_connector_meta

    def truncated(out: Any) -> Any:
        meta = build(out)
        for save in meta.saves:
            save.block_ids = save.block_ids[:1]
        return meta

    scheduler_side.build_connector_meta = truncated  # type: ignore[method-assign]
    engine.add("a", prompt_of(1, 200))
    engine.run()
    engine.assert_empty()


def test_tenants_key_salts_adapters_and_dtype(model_dir: str,
                                              tmp_path: Path) -> None:
    # What keys a request's chunks: the connector's tenant and the engine's
    # dtype, the request's cache salt and LoRA adapter; a multimodal
    # request is not keyed (neither loaded nor saved).
    from types import SimpleNamespace

    from vllm.lora.request import LoRARequest

    engine = Engine(model_dir, [f"file://{tmp_path}/store"], tenant="acme")
    connector = engine.scheduler.connector

    def tenant(**fields: Any) -> str | None:
        request = SimpleNamespace(**{"mm_features": None, "cache_salt": None,
                                     "lora_request": None, **fields})
        return connector.connector_scheduler._tenant_of(request)

    plain = tenant()
    assert plain == "acme|dtype=float32"
    keys = {plain, tenant(cache_salt="s1"), tenant(cache_salt="s2"),
            tenant(lora_request=LoRARequest("a", 1, "/adapters/a")),
            tenant(lora_request=LoRARequest("b", 2, "/adapters/b")),
            tenant(cache_salt="s1",
                   lora_request=LoRARequest("a", 1, "/adapters/a"))}
    assert len(keys) == 6
    assert tenant(mm_features=[object()]) is None


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_cpu_caches_pack_and_unpack(kv_cache_dtype: str) -> None:
    # vLLM's fp8 CPU cache through staging: values fp8 holds come back
    # exactly; any value, saved (decoded) and loaded again, gets vLLM's own
    # codes back but for negative zeros; scales divide on the way in and
    # multiply on the way out. (Blocks of 32 tokens: vLLM's fp8 caches
    # have no vec16 layout.)
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from kvc._vllm_cpu import FP8_FORMATS, PackedCpuCache

    try:
        isa = _get_attn_isa(torch.bfloat16, 32, 32, kv_cache_dtype)
    except NotImplementedError as error:
        # vLLM's CPU attention runs fp8 caches with AVX-512 or AMX only.
        pytest.skip(f"vLLM refuses {kv_cache_dtype} caches here: {error}")
    scales = {0: (1.0, 1.0), 1: (0.5, 4.0)}
    caches = [torch.zeros(6, 2, 32, 64, dtype=torch.uint8)
              for _ in scales]
    packed = PackedCpuCache(caches, isa, None, kv_cache_dtype,
                            lambda layer: scales[layer])
    assert packed.staging_dtype == torch.bfloat16 and packed.lossy
    g = torch.Generator().manual_seed(0)
    exact = (torch.randint(-8, 9, packed.staging[0][:2].shape, generator=g)
             / 4).to(torch.bfloat16)
    packed.staging[0][[0, 1]] = exact
    packed.pack(0, [0, 1], [3, 5])
    packed.unpack(0, [3, 5], [2, 4])
    assert torch.equal(packed.staging[0][[2, 4]], exact)

    values = torch.randn(packed.staging[0][:1].shape, generator=g)
    packed.staging[0][0] = values[0].to(torch.bfloat16)
    packed.pack(0, [0], [1])
    codes = caches[0][1].clone()
    packed.unpack(0, [1], [3])
    packed.pack(0, [3], [2])
    moved = caches[0][2] != codes
    assert bool((codes[moved] == 0x80).all() and (caches[0][2][moved] == 0).all())

    # Layer 1: K / 0.5 and V / 4 stored; decoded times the scales.
    packed.staging[1][0] = exact[0]
    packed.pack(1, [0], [4])
    packed.unpack(1, [4], [1])
    assert torch.equal(packed.staging[1][1], exact[0])
    stored = caches[1][4].reshape(-1)[packed.inverse]
    stored = stored.view(FP8_FORMATS[kv_cache_dtype]).float().view(2, -1)
    assert torch.equal(stored[0], exact[0][0].float().reshape(-1) * 2)
    assert torch.equal(stored[1], exact[0][1].float().reshape(-1) / 4)
