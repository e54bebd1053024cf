"""The encoder-decoder of the paper (§3): config, attention, embeddings, layers, the model."""
