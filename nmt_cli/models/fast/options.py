"""Which speed work a Transformer's decoding uses: chosen per model, explicitly."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodingOptions:
    """The decoding speed work of one Transformer (`Transformer(..., decoding=...)`).

    The defaults are what `nmt translate` runs; `REFERENCE_DECODING` turns every switch
    off, and gives the same outputs (tests/test_fast_decoding.py). The switches act on
    a CPU only, except `initial_capacity`, which every device uses.
    """

    # First capacity of the self-attention cache, in positions; it doubles as decoding goes on.
    initial_capacity: int = 32
    # Float32 self-attention cache in beam slots, which beam reordering leaves in place
    # (nmt_cli/models/fast/beam_slots.py); off: the row-major cache of other devices.
    beam_slot_cache: bool = True
    # Sentences that are done wait in the batch, masked, until this fraction of it is
    # done, and then leave together (the search reads the model's `sentence_drop_fraction`).
    # Each departure copies the filled cache of every sentence that stays, and a done
    # sentence kept costs its share of the step's arithmetic (benchmarks/HISTORY.md,
    # "done sentences leaving in groups").
    sentence_drop_fraction: float = 0.25
    # Self-attention buffers reused from batch to batch (nmt_cli/models/fast/buffer_pool.py).
    pooled_buffers: bool = True
    # The cross-attention keys once more, transposed (decoding_state.CrossAttentionState.keys_t).
    transposed_cross_keys: bool = True
    # When a sentence's first-step rows are all alike (a search's beams), run one and copy
    # it. (On a GPU the check would make the host wait for the encoder.)
    first_step_once: bool = True
    # The output projection through oneDNN's kernel (fast/logits.py) rather than F.linear.
    onednn_logits: bool = True
    # The encoder, and the cross-attention keys and values, computed on a padded batch's
    # tokens alone, not on its pads (fast/token_rows.py), once the pads are at least this
    # share of the batch's positions (below it the two copies per layer cost about what
    # they save: benchmarks/encoder_padding.py); None: never.
    token_rows_from_pads: float | None = 0.05


REFERENCE_DECODING = DecodingOptions(beam_slot_cache=False, sentence_drop_fraction=0.0, pooled_buffers=False,
                                     transposed_cross_keys=False, first_step_once=False, onednn_logits=False,
                                     token_rows_from_pads=None)
