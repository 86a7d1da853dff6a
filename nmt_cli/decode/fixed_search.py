"""Beam search whose whole step, model and search together, is one CUDA graph.

With only the model's step graphed (nmt_cli/decode/graphs.py), the search's own
operators, about 80 small ones per step, are what is left for the host to launch.
Here they run on buffers of fixed shapes with the step number on the device, so the
whole step is captured and replayed: per step the host launches one graph and asks,
one step late, whether every sentence is done.

A capture costs about as much as several eager steps, so the buffers and graphs of a
batch shape are kept for the next batch of that shape (a `Workspace`). So that batches
of similar sizes share one, sources are padded to a multiple of SOURCE_BUCKET tokens,
and batches to one of four sizes per power of two with sentences that end at once.
Each workspace keeps, per cache capacity (doubling from the model's first capacity),
two self-attention buffers that alternate (the step gathers the reordered rows of one
into the other, whole capacity) and the two graphs that read them; its graphs share
one memory pool, as they run one at a time and keep nothing.

The semantics are `search.generate`'s (the same candidate, finishing and advancing
functions run inside the step), for beam search and greedy decoding without sampling
or --no-repeat-ngram-size (`supports`). How differs, not what:
* at step 0 the beams other than the first start at -inf instead of being skipped:
  the same candidates, as all beams are the same then;
* finished sentences stay in the batch, masked, until every sentence is done;
* the batch is padded (pads are masked, as in any padded batch; padding sentences
  have a maximum length of 0 and are dropped from the results).
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from nmt_cli.config import DecodeConfig
from nmt_cli.data.dictionary import EOS_ID, PAD_ID
from nmt_cli.decode.graphs import GraphedCall, GraphedTransformer, autocast_state
from nmt_cli.decode.lenpen import length_penalty
from nmt_cli.decode.search import (
    BeamState,
    HostCopy,
    Hypothesis,
    advance_beams,
    beam_candidates,
    best_hypotheses,
    check_beam_fits,
    finish_hypotheses,
    force_eos,
    max_output_lengths,
    penalize,
)
from nmt_cli.models.decoding_state import RowMajorKV
from nmt_cli.models.transformer import Transformer

# Sources are right-padded to a multiple of this many tokens, so that batches of
# similar lengths share buffers and graphs.
SOURCE_BUCKET = 16
# Workspaces kept (least recently used dropped first): each holds cache buffers of
# every capacity its batches reached.
MAX_WORKSPACES = 2


def supports(cfg: DecodeConfig) -> bool:
    """Whether a search of `cfg` keeps its shapes fixed (sampling and n-gram bans do not)."""
    return not cfg.sampling and cfg.no_repeat_ngram_size == 0


@dataclass
class Workspace:
    """What the graphed steps of one batch shape read and write, kept between batches."""

    state: BeamState
    position: Tensor  # () long: the step, on the device
    cross_kv: Tensor
    cross_mask: Tensor
    self_kv: dict[int, tuple[Tensor, Tensor]] = dataclasses.field(default_factory=dict)  # capacity -> buffers
    steps: dict[tuple[int, int], GraphedCall] = dataclasses.field(default_factory=dict)  # (capacity, parity)
    pool: Any = None  # the graphs' shared memory pool, made with the first graph

    def buffers(self, capacity: int) -> tuple[Tensor, Tensor]:
        """The two self-attention buffers of `capacity` (zeros at first: a step reads all of one)."""
        if capacity not in self.self_kv:
            shape = RowMajorKV.shape(self.cross_kv, self.state.tokens.size(0), capacity)
            self.self_kv[capacity] = tuple(self.cross_kv.new_zeros(shape) for _ in range(2))
        return self.self_kv[capacity]


class FixedSearch:
    """Beam search for one model and one decoding config, one graphed call per step."""

    def __init__(self, decoder: GraphedTransformer, cfg: DecodeConfig) -> None:
        if not supports(cfg):
            raise ValueError("FixedSearch needs beam search without sampling or --no-repeat-ngram-size")
        self.decoder = decoder
        self.cfg = cfg
        self.workspaces: OrderedDict[tuple, Workspace] = OrderedDict()
        self.steps_built = 0  # step functions made so far: on a GPU, each one a capture

    @torch.inference_mode()
    def generate(self, src_tokens: Tensor, max_target_positions: int) -> list[list[Hypothesis]]:
        """search.generate for src_tokens (B, S), right-padded with `<pad>`."""
        cfg, model = self.cfg, self.decoder.model
        B, K = src_tokens.size(0), cfg.beam
        if B == 0:
            return []
        check_beam_fits(K, model.decoder.output_projection.out_features)  # nn.Linear or a CPU inference layer
        src_lengths = src_tokens.ne(PAD_ID).sum(dim=1).tolist()
        max_len = max_output_lengths(src_lengths, cfg, max_target_positions)
        L = max(max_len) + 2
        src_tokens, max_len = _padded(src_tokens, max_len)
        ws = self._workspace(src_tokens, torch.tensor(max_len, device=src_tokens.device), L)
        pending: HostCopy | None = None  # the previous step's `done` flags, on their way to the host
        capacity = model.decoding.initial_capacity
        for step in range(L - 1):
            model.decoder.embed_positions.prepare(step + 1)
            parity = step % 2  # the buffer that holds the cache at this step
            while step >= capacity:  # the filled prefix moves to buffers twice as long
                old = ws.buffers(capacity)[parity]
                capacity *= 2
                ws.buffers(capacity)[parity][:, :step].copy_(old[:, :step])
            if (capacity, parity) not in ws.steps:
                self_kv, spare = ws.buffers(capacity)[parity], ws.buffers(capacity)[1 - parity]
                forward = _whole_step(model, ws, self_kv, spare, cfg)
                use_graph = self.decoder.use_graphs and src_tokens.is_cuda
                if use_graph and ws.pool is None:
                    ws.pool = torch.cuda.graph_pool_handle()
                ws.steps[capacity, parity] = GraphedCall(forward, src_tokens.device, use_graph, ws.pool)
                self.steps_built += 1
            call = ws.steps[capacity, parity]
            call()
            self.decoder.check(call)
            if pending is not None and bool(pending.get().all()):
                break
            pending = HostCopy(ws.state.done)
        return best_hypotheses(ws.state, cfg.nbest)[:B]

    def _workspace(self, src_tokens: Tensor, max_len: Tensor, L: int) -> Workspace:
        """The workspace of this batch's shape, reset for it: a new batch's state, encoder
        states and position 0. (The self-attention buffers keep the last batch's values:
        finite, and masked until overwritten.)"""
        model, K = self.decoder.model, self.cfg.beam
        B = src_tokens.size(0)
        width = L + (-L % SOURCE_BUCKET)  # room for the tokens; the loop stops at L anyway
        state = BeamState.start(max_len, K, width)
        state.cum_scores[:, 1:] = -math.inf  # step 0 expands the first beam only
        cross = model.cross_attention_state(model.encode(src_tokens))
        cross_kv, cross_mask = cross.kv, cross.mask
        key = (B, src_tokens.size(1), width, src_tokens.device, autocast_state(src_tokens.device))
        ws = self.workspaces.get(key)
        if ws is None:
            ws = Workspace(state, torch.zeros((), dtype=torch.long, device=src_tokens.device), cross_kv, cross_mask)
            self.workspaces[key] = ws
            while len(self.workspaces) > MAX_WORKSPACES:
                self.workspaces.popitem(last=False)
            return ws
        self.workspaces.move_to_end(key)
        for field in dataclasses.fields(BeamState):
            getattr(ws.state, field.name).copy_(getattr(state, field.name))
        ws.cross_kv.copy_(cross_kv)
        ws.cross_mask.copy_(cross_mask)
        ws.position.zero_()
        return ws


def batch_bucket(size: int) -> int:
    """`size` rounded up to one of four sizes per power of two (at most a quarter more)."""
    step = 2 ** max(0, size.bit_length() - 3)
    return -(-size // step) * step


def _padded(src_tokens: Tensor, max_len: list[int]) -> tuple[Tensor, list[int]]:
    """The batch padded to its bucket: sources to a multiple of SOURCE_BUCKET tokens, and
    sentences (a lone `</s>` with a maximum length of 0: done after the first step)."""
    B, S = src_tokens.shape
    padded = torch.full((batch_bucket(B), S + (-S % SOURCE_BUCKET)), PAD_ID, dtype=src_tokens.dtype,
                        device=src_tokens.device)
    padded[:B, :S] = src_tokens
    padded[B:, 0] = EOS_ID
    return padded, max_len + [0] * (padded.size(0) - B)


def _whole_step(model: Transformer, ws: Workspace, self_kv: Tensor, spare: Tensor, cfg: DecodeConfig) -> Callable[[], None]:
    """The step at ws.position as a function of fixed shapes, everything in place: the
    model's step, the search's, the cache rows gathered into `spare`, position + 1."""
    state, position = ws.state, ws.position
    B, K = state.cum_scores.shape

    def step() -> None:
        column = position.view(1) + 1  # where this step's tokens go
        last_tokens = state.tokens.index_select(1, position.view(1))  # (B*K, 1)
        lprobs = model.decode_step_static(last_tokens, position, self_kv, ws.cross_kv, ws.cross_mask)
        lprobs = _adjust(lprobs, position, state.max_len, K, cfg)
        # Never the first step's shortcut: beams 1.. start at -inf instead (see the module docstring).
        cands = beam_candidates(lprobs.view(B, K, -1), state.cum_scores, first_step=False)
        divisor = length_penalty(column.double(), cfg.lenpen, cfg.lenpen_style).float()  # (1,)
        finish_hypotheses(state, cands, lprobs, column, divisor, cfg)
        state.done |= state.fin_count.ge(K) | state.max_len.le(position)
        rows = advance_beams(state, cands, lprobs, column, K)
        torch.index_select(self_kv, 0, rows, out=spare)
        position.add_(1)

    return step


def _adjust(lprobs: Tensor, position: Tensor, max_len: Tensor, K: int, cfg: DecodeConfig) -> Tensor:
    """search.adjust_lprobs without n-gram bans, with the step on the device."""
    lprobs = penalize(lprobs, cfg)
    at_max = max_len.le(position).unsqueeze(1).expand(-1, K).reshape(-1)  # (B*K,): only </s> is allowed
    if cfg.min_len > 0:
        # Rows at their maximum length keep </s>: forcing it wins over min_len.
        lprobs[:, EOS_ID].masked_fill_(position.lt(cfg.min_len) & at_max.logical_not(), -math.inf)
    return force_eos(lprobs, at_max)
