"""Training (Section 5): a grid of one-hidden-layer networks as one batched model
(:mod:`.grid`)."""
