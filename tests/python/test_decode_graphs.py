"""A decode loop captured into CUDA graphs, as vLLM runs one, with custody as PyTorch's allocator: a
Llama from a transformers config with random weights (no download), a static KV cache of 256
tokens filled by a prompt and then by decoding, the decode step captured for four batch sizes into
graphs that share one memory pool, each replayed 100 times; every replay's logits must equal those
of the same step run uncaptured. The same program under PyTorch's own allocator gives the figures to
compare (peak reserved memory over the whole program, the uncaptured runs included, and the median
time of a replayed step, printed; docs/benchmarks.md).

Needs a GPU, PyTorch with CUDA, transformers and the CUDA build of the allocator library
(CUSTODY_LIBRARY); skipped otherwise."""
import importlib.util
import json

import pytest

from conftest import cuda_torch_missing, run_python

DECODE = r"""
import json, sys, time
import torch
allocator = sys.argv[1]
if allocator == "custody":
    import custody.torch
    custody.torch.enable()
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

torch.manual_seed(0)
CACHE, PROMPT, STEPS, BATCHES = 256, 156, 100, (1, 2, 4, 8)   # the cache fills up: 156 + 100 = 256
config = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=4, vocab_size=4096, max_position_embeddings=CACHE,
                     attn_implementation="eager")
model = LlamaForCausalLM(config).to("cuda", torch.float16).eval()


def static_cache(batch):
    try:
        return StaticCache(config=config, max_batch_size=batch, max_cache_len=CACHE, device="cuda",
                           dtype=torch.float16)
    except TypeError:  # transformers that size the cache at its first update
        return StaticCache(config=config, max_cache_len=CACHE)


class Decoder:
    # One batch size's decode step on static buffers: the token, its position and the attention
    # mask over the cache (an explicit 4D mask, so that no mask is computed on the host).
    def __init__(self, batch):
        self.batch = batch
        self.cache = static_cache(batch)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
        self.position = torch.zeros(1, dtype=torch.long, device="cuda")
        self.mask = torch.full((batch, 1, 1, CACHE), float("-inf"), dtype=torch.float16, device="cuda")

    def prefill(self, prompt):
        n = prompt.shape[1]
        mask = torch.full((self.batch, 1, n, CACHE), float("-inf"), dtype=torch.float16, device="cuda")
        mask[:, :, :, :n] = torch.triu(torch.full((n, n), float("-inf"), device="cuda"), 1).to(torch.float16)
        positions = torch.arange(n, device="cuda")
        out = model(prompt, past_key_values=self.cache, cache_position=positions,
                    position_ids=positions.unsqueeze(0).expand(self.batch, n), attention_mask=mask, use_cache=True)
        self.mask[:, :, :, :n] = 0
        return out.logits[:, -1:].argmax(-1)

    def step(self):
        return model(self.token, past_key_values=self.cache, cache_position=self.position,
                     position_ids=self.position.view(1, 1).expand(self.batch, 1), attention_mask=self.mask,
                     use_cache=True).logits

    def set(self, token, at):
        self.token.copy_(token)
        self.position.fill_(at)
        self.mask[:, :, :, at] = 0


def run(batch, prompt, capture, pool=None):
    # Prefill, then STEPS decode steps (captured and replayed, or run eagerly): every step's logits.
    d = Decoder(batch)
    token = d.prefill(prompt)
    graph = None
    if capture:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # warm up on a side stream, as PyTorch asks before capturing
            d.set(token, PROMPT)
            d.step()
        torch.cuda.current_stream().wait_stream(side)
        # The warm-up wrote position PROMPT of the cache: the first replay writes it again, the same.
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits = d.step()
    outputs, times = [], []
    for i in range(STEPS):
        d.set(token, PROMPT + i)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph is not None:
            graph.replay()
            out = logits
        else:
            out = d.step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        outputs.append(out[:, -1].float().clone())
        token = out[:, -1:].argmax(-1)
    return graph, outputs, times


with torch.no_grad():
    prompts = {b: torch.randint(0, config.vocab_size, (b, PROMPT), device="cuda") for b in BATCHES}
    reference = {b: run(b, prompts[b], capture=False)[1] for b in BATCHES}
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()           # one pool for every batch size (vLLM's)
    graphs, replay_ms = [], {}
    for b in sorted(BATCHES, reverse=True):         # the largest first, as vLLM captures
        graph, outputs, times = run(b, prompts[b], capture=True, pool=pool)
        graphs.append(graph)
        for step, (got, want) in enumerate(zip(outputs, reference[b])):
            if not torch.equal(got, want):
                diff = (got - want).abs().max().item()
                raise SystemExit("batch %d step %d: the replay's logits differ from the uncaptured run's "
                                 "(max difference %g)" % (b, step, diff))
        replay_ms[b] = sorted(times)[len(times) // 2]
    torch.cuda.synchronize()
    print(json.dumps({"allocator": allocator, "peak_reserved": torch.cuda.max_memory_reserved(),
                      "median_replay_ms": replay_ms, "replays": STEPS * len(BATCHES)}))
"""


def _missing():
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed"
    return cuda_torch_missing()


@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_decode_graphs_for_four_batch_sizes_replay_exactly_under_custody():
    figures = {}
    for allocator in ("custody", "pytorch"):
        done = run_python(DECODE, args=[allocator])
        figures[allocator] = json.loads(done.stdout.strip().splitlines()[-1])
        assert figures[allocator]["replays"] == 400
    custody_, pytorch = figures["custody"], figures["pytorch"]
    print("decode graphs, peak reserved: custody %d B, PyTorch %d B (%.3f); median replay (ms) by batch: "
          "custody %s, PyTorch %s" % (custody_["peak_reserved"], pytorch["peak_reserved"],
                                       custody_["peak_reserved"] / pytorch["peak_reserved"],
                                       custody_["median_replay_ms"], pytorch["median_replay_ms"]))
