"""Inference: searches over a step function (greedy, beam, sampling), the Transformer's
decoding, translation of lines, BLEU."""
