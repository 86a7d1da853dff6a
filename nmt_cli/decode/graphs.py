"""Decoding steps replayed as CUDA graphs (`nmt translate --cuda-graphs`).

On a GPU a decoding step of a Transformer is a few hundred small kernels, and at
common batch sizes launching them takes longer than running them. A CUDA graph
records a step's kernels once; each later step launches them all with one call.

A replayed graph reads and writes the memory it was captured with, so the captured
step (Transformer.decode_step_static) keeps its shapes and buffers whatever the
position: it takes the new tokens and the position from two small tensors owned here,
attends over the cache's whole capacity with later positions masked, and writes its
log-probabilities into memory of its own. The model's cache alternates between two
buffers (reorder_cache gathers the rows into the spare one and swaps them), so a
cache shape gets two graphs, one per buffer. A larger capacity or a smaller batch
makes new buffers and so new graphs: finished sentences therefore stay in the batch,
masked, until half of it is done (`sentence_drop_fraction`, read by the search).

Without CUDA the same fixed-shape step runs eagerly, which is how the CPU tests check
everything here but the capture itself. Should a capture fail, decoding goes on with
eager fixed-shape steps, after one warning.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.search import IncrementalDecoder
from nmt_cli.models.transformer import EncoderOut, Transformer


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


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

    @torch.no_grad()
    def decode_step(self, prev_tokens: Tensor, encoder_out: EncoderOut, cache: dict[str, Any]) -> Tensor:
        """Transformer.decode_step, through a captured step when one new token per row is asked."""
        if not cache:
            self.model.start_cache(encoder_out, prev_tokens.size(0), cache, zeroed=True)
        start = cache["length"]
        if prev_tokens.size(1) - start != 1:  # a forced prefix of several tokens: an ordinary step
            return self.model.decode_step(prev_tokens, encoder_out, cache)
        self.model.prepare_static_step(cache)
        step = self._step_for(cache)
        step.new_tokens.copy_(prev_tokens[:, start:])
        step.index.fill_(start)
        try:
            lprobs = step.run()
        except GraphCaptureError as error:
            self.use_graphs = False
            cache["fixed_steps"].clear()
            self.warn(f"warning: {error}; decoding goes on without CUDA graphs")
            lprobs = step.forward()
        cache["length"] = start + 1
        return lprobs

    def reorder_cache(self, cache: dict[str, Any], index: Tensor, sentence_index: Tensor | None = None) -> None:
        self.model.reorder_cache(cache, index, sentence_index=sentence_index)

    def reorder_encoder_out(self, encoder_out: EncoderOut, index: Tensor) -> EncoderOut:
        return self.model.reorder_encoder_out(encoder_out, index)

    def _step_for(self, cache: dict[str, Any]) -> "_FixedStep":
        """The fixed-shape step that reads the cache's current buffers (made on first use)."""
        buffers = (cache["self_kv"], cache["cross_kv"], cache["cross_mask"])
        key = tuple((t.data_ptr(), tuple(t.shape)) for t in buffers) + (_autocast_state(buffers[0].device),)
        steps: dict[tuple, _FixedStep] = cache.setdefault("fixed_steps", {})
        if key not in steps:
            # Steps for other shapes read buffers that are gone: drop them (and their graphs).
            shapes = tuple(shape for _, shape in key[:3])
            for old in [k for k in steps if tuple(shape for _, shape in k[:3]) != shapes]:
                del steps[old]
            steps[key] = _FixedStep.make(self.model, *buffers, use_graph=self.use_graphs)
        return steps[key]


class GraphCaptureError(RuntimeError):
    """A fixed-shape step could not be captured as a CUDA graph."""


@dataclass
class _FixedStep:
    """One fixed-shape decoding step: its two inputs, and how to run it."""

    new_tokens: Tensor  # (B*K, 1) long: written before each run
    index: Tensor  # () long: the new token's position, written before each run
    forward: Callable[[], Tensor]
    use_graph: bool
    graph: Any = None  # torch.cuda.CUDAGraph once captured
    graph_output: Tensor | None = None

    @classmethod
    def make(cls, model: Transformer, self_kv: Tensor, cross_kv: Tensor, cross_mask: Tensor,
             use_graph: bool) -> "_FixedStep":
        device = self_kv.device
        new_tokens = torch.zeros(self_kv.size(0), 1, dtype=torch.long, device=device)
        index = torch.zeros((), dtype=torch.long, device=device)

        def forward() -> Tensor:
            return model.decode_step_static(new_tokens, index, self_kv, cross_kv, cross_mask)

        return cls(new_tokens, index, forward, use_graph)

    def run(self) -> Tensor:
        """Log-probabilities (B*K, V) of this step. With graphs, the first run computes
        them eagerly and captures the step; later runs replay it. A replay overwrites
        the tensor the previous replay returned."""
        if not self.use_graph:
            return self.forward()
        if self.graph is not None:
            self.graph.replay()
            return self.graph_output
        try:
            return self._run_and_capture()
        except Exception as error:  # noqa: BLE001 - whatever stopped the capture, the caller goes on eagerly
            message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise GraphCaptureError(f"CUDA graph capture failed ({message})") from error

    def _run_and_capture(self) -> Tensor:
        stream = _capture_stream(self.index.device)
        main = torch.cuda.current_stream(self.index.device)
        stream.wait_stream(main)
        try:
            # Autocast's weight cache must stay off: casts cached by a capture would be freed
            # when the caller's autocast region ends, while the graph still reads them.
            with torch.cuda.stream(stream), _autocast_without_cache(self.index.device):
                # The eager run is this step's answer, and warms up the capture stream
                # (cuBLAS workspaces and other lazy state must not be created while capturing).
                lprobs = self.forward()
                stream.synchronize()  # nothing pending on the stream when its capture begins
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin()
                try:
                    output = self.forward()
                finally:
                    graph.capture_end()
        finally:
            main.wait_stream(stream)
        lprobs.record_stream(main)
        self.graph, self.graph_output = graph, output
        return lprobs


_CAPTURE_STREAMS: dict[torch.device, Any] = {}


def _capture_stream(device: torch.device):
    """One side stream per device for every capture: its warm state carries over."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


def _autocast_state(device: torch.device) -> tuple[bool, torch.dtype | None]:
    enabled = torch.is_autocast_enabled(device.type)
    return enabled, torch.get_autocast_dtype(device.type) if enabled else None


def _autocast_without_cache(device: torch.device):
    enabled, dtype = _autocast_state(device)
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
