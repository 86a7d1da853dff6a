"""Speed work for decoding, and for training on a CPU, kept apart from the model it serves.

The reference Transformer (nmt_cli/models/transformer.py) runs without any of this and
decodes to the same outputs (tests/test_fast_decoding.py). What is used is chosen
explicitly: the linear layers by `nmt_cli.decode.loading.prepare_linears` (`packed.py`:
weights packed for oneDNN, float32 and bf16 on a CPU; `int8.py`: 8-bit integer
products; `linear_swap.py`: what they share), the decoding work by the model's
`DecodingOptions` (`options.py`, which lists the switches: `beam_slots.py`, the CPU
layout of the cache that beam reordering leaves in place; `buffer_pool.py`, CPU cache
buffers reused from batch to batch; `token_rows.py`, the encoder and the cross-attention
projections on a padded batch's tokens alone; `logits.py`, the output projection through
oneDNN's kernel), and the dropout of training by the model's `lane_mask_dropout`
(`dropout.py`: masks cheap to draw on a CPU, with the same expectation as F.dropout's).
"""
