"""Inference: decoding (greedy, beam), translation of lines, BLEU."""
