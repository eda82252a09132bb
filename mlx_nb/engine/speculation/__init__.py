"""Speculative decoding per row of the shared batch: tokens proposed by prompt lookup or a draft
model, verified in one forward."""
