"""Decoding steps replayed as CUDA graphs (`nmt translate` on a GPU, unless `--no-cuda-graphs`).

On a GPU a decoding step of a Transformer is a few hundred small kernels, and at
common batch sizes launching them takes longer than running them. A CUDA graph
records a step's kernels once; each later step launches them all with one call.

A replayed graph reads and writes the memory it was captured with, so the captured
step (Transformer.decode_step_static) keeps its shapes and buffers whatever the
position: it takes the new tokens and the position from two small tensors owned here,
attends over the cache's whole capacity with later positions masked, and writes its
log-probabilities into memory of its own. The model's row-major cache (RowMajorKV)
alternates between two buffers (reordering gathers the rows into the spare one and
swaps them), so a cache shape gets two graphs, one per buffer. A larger capacity or a smaller batch
makes new buffers and so new graphs: finished sentences therefore stay in the batch,
masked, until half of it is done (`sentence_drop_fraction`, read by the search).
nmt_cli/decode/fixed_search.py captures the search's own work into the same graph.

Without CUDA the same fixed-shape step runs eagerly, which is how the CPU tests check
everything here but the capture itself. Should a capture fail, decoding goes on with
eager fixed-shape steps, after one warning.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.search import IncrementalDecoder
from nmt_cli.models.decoding_state import DecoderCache
from nmt_cli.models.transformer import EncoderOut, Transformer


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


class GraphedCall:
    """A function of fixed shapes and memory, run as a CUDA graph on `device`.

    The first call runs it eagerly (its answer, and the warm-up a capture needs) and
    captures it; later calls replay the graph. A replay overwrites what the previous
    replay returned. Without graphs (`use_graph` False, or after a failed capture,
    which `failure` then names) every call runs eagerly.
    """

    def __init__(self, forward: Callable[[], Any], device: torch.device, use_graph: bool, pool: Any = None) -> None:
        self.forward = forward
        self.device = device
        self.use_graph = use_graph
        # A memory pool shared with other graphs that never run at the same time and
        # return nothing (torch.cuda.graph_pool_handle()); None: a pool of its own.
        self.pool = pool
        self.graph: Any = None  # torch.cuda.CUDAGraph once captured
        self.graph_output: Any = None
        self.failure: str | None = None

    def __call__(self) -> Any:
        if self.graph is not None:
            self.graph.replay()
            return self.graph_output
        if not self.use_graph:
            return self.forward()
        try:
            stream = _capture_stream(self.device)
            main = torch.cuda.current_stream(self.device)
        except Exception as error:  # noqa: BLE001 - no CUDA for this device: run eagerly
            self._fail(error)
            return self.forward()
        stream.wait_stream(main)
        try:
            # Autocast's weight cache must stay off: casts cached by a capture would be freed
            # when the caller's autocast region ends, while the graph still reads them.
            with torch.cuda.stream(stream), _autocast_without_cache(self.device):
                # The eager run is this call's answer, and warms up the capture stream
                # (cuBLAS workspaces and other lazy state must not be created while capturing).
                result = self.forward()
                self._capture(stream)
        finally:
            main.wait_stream(stream)
        if isinstance(result, Tensor):
            result.record_stream(main)
        return result

    def _capture(self, stream) -> None:
        try:
            stream.synchronize()  # nothing pending on the stream when its capture begins
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=self.pool)
            try:
                output = self.forward()
            finally:
                graph.capture_end()
        except Exception as error:  # noqa: BLE001 - whatever stopped the capture, the caller goes on eagerly
            self._fail(error)
            return
        self.graph, self.graph_output = graph, output

    def _fail(self, error: Exception) -> None:
        text = str(error).strip()
        self.failure = f"CUDA graph capture failed ({text.splitlines()[0] if text else type(error).__name__})"
        self.use_graph = False


@dataclass
class GraphedCache:
    """A GraphedTransformer's decoding cache: the model's (always row-major, zeroed), and
    the fixed-shape steps made for its buffers."""

    model: DecoderCache = field(default_factory=DecoderCache)
    steps: dict[tuple, "_DecoderStep"] = field(default_factory=dict)


class GraphedTransformer:
    """A Transformer behind the search's IncrementalDecoder protocol, its one-token steps
    run with fixed shapes: replayed as CUDA graphs on a GPU (`use_graphs`), eagerly elsewhere."""

    # The search lets finished sentences leave the batch only once this fraction of it is
    # done: every departure reallocates the cache, and each new buffer costs a capture.
    sentence_drop_fraction = 0.5

    def __init__(self, model: Transformer, use_graphs: bool, warn: Callable[[str], None] = _to_stderr) -> None:
        self.model = model
        self.use_graphs = use_graphs
        self.warn = warn

    def encode(self, src_tokens: Tensor) -> EncoderOut:
        return self.model.encode(src_tokens)

    def new_cache(self) -> GraphedCache:
        return GraphedCache()

    @torch.no_grad()
    def decode_step(self, prev_tokens: Tensor, encoder_out: EncoderOut, cache: GraphedCache) -> Tensor:
        """Transformer.decode_step, through a captured step when one new token per row is asked.

        The log-probs returned are the graph's own memory: the next step overwrites them
        (the search uses them before then; clone them to keep them longer).
        """
        model_cache = cache.model
        if not model_cache.started:
            self.model.start_cache(encoder_out, prev_tokens.size(0), model_cache, zeroed=True)
        start = model_cache.length
        if prev_tokens.size(1) - start != 1:  # a forced prefix of several tokens: an ordinary step
            return self.model.decode_step(prev_tokens, encoder_out, model_cache)
        self.model.prepare_static_step(model_cache)
        step = self._step_for(cache)
        step.new_tokens.copy_(prev_tokens[:, start:])
        step.index.fill_(start)
        lprobs = step.call()
        self.check(step.call)
        model_cache.length = start + 1
        return lprobs

    def check(self, call: GraphedCall) -> None:
        """After `call` ran: if its capture failed, warn once and capture nothing more."""
        if call.failure is not None and self.use_graphs:
            self.use_graphs = False
            self.warn(f"warning: {call.failure}; decoding goes on without CUDA graphs")

    def reorder_cache(self, cache: GraphedCache, index: Tensor, sentence_index: Tensor | None = None) -> None:
        self.model.reorder_cache(cache.model, index, sentence_index=sentence_index)

    def reorder_encoder_out(self, encoder_out: EncoderOut, index: Tensor) -> EncoderOut:
        return self.model.reorder_encoder_out(encoder_out, index)

    def _step_for(self, cache: GraphedCache) -> "_DecoderStep":
        """The fixed-shape step that reads the cache's current buffers (made on first use)."""
        buffers = (cache.model.self_attn.kv, cache.model.cross.kv, cache.model.cross.mask)
        key = _graph_key(cache.steps, buffers)
        if key not in cache.steps:
            cache.steps[key] = _DecoderStep.make(self.model, *buffers, use_graph=self.use_graphs)
        return cache.steps[key]


def _graph_key(calls: dict[tuple, Any], buffers: tuple[Tensor, ...]) -> tuple:
    """What a captured call reads, as a key of `calls`: the buffers' addresses and shapes,
    and the autocast state. Calls for other shapes read buffers that are gone: they are
    dropped from `calls` (with their graphs) when a new shape comes."""
    shapes = tuple(tuple(t.shape) for t in buffers)
    key = (tuple(t.data_ptr() for t in buffers), shapes, autocast_state(buffers[0].device))
    for old in [k for k in calls if k[1] != shapes]:
        del calls[old]
    return key


@dataclass
class _DecoderStep:
    """The model's fixed-shape step for one set of cache buffers, and its two inputs."""

    new_tokens: Tensor  # (B*K, 1) long: written before each call
    index: Tensor  # () long: the new token's position, written before each call
    call: GraphedCall  # -> (B*K, V) float32 log-probabilities

    @classmethod
    def make(cls, model: Transformer, self_kv: Tensor, cross_kv: Tensor, cross_mask: Tensor,
             use_graph: bool) -> "_DecoderStep":
        device = self_kv.device
        new_tokens = torch.zeros(self_kv.size(0), 1, dtype=torch.long, device=device)
        index = torch.zeros((), dtype=torch.long, device=device)

        def forward() -> Tensor:
            return model.decode_step_static(new_tokens, index, self_kv, cross_kv, cross_mask)

        return cls(new_tokens, index, GraphedCall(forward, device, use_graph))


_CAPTURE_STREAMS: dict[torch.device, Any] = {}


def _capture_stream(device: torch.device):
    """One side stream per device for every capture: its warm state carries over."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


def autocast_state(device: torch.device) -> tuple[bool, torch.dtype | None]:
    """Whether autocast is on for `device`, and its dtype: part of what a graph captured."""
    enabled = torch.is_autocast_enabled(device.type)
    return enabled, torch.get_autocast_dtype(device.type) if enabled else None


def _autocast_without_cache(device: torch.device):
    enabled, dtype = autocast_state(device)
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False) if enabled else nullcontext()


def with_fixed_steps(decoder: IncrementalDecoder, use_graphs: bool,
                     warn: Callable[[str], None] = _to_stderr) -> IncrementalDecoder:
    """`decoder` (a Transformer or an ensemble of them) with its steps run by GraphedTransformer;
    `warn` gets the one line said when a capture fails."""
    if isinstance(decoder, Transformer):
        return GraphedTransformer(decoder, use_graphs, warn)
    if isinstance(decoder, Ensemble):
        return Ensemble([with_fixed_steps(m, use_graphs, warn) for m in decoder.models])
    raise TypeError(f"no fixed-shape decoding steps for {type(decoder).__name__}")
