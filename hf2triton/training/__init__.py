"""Training on CPU, seeded and deterministic: the retraining example and the embedded language
model."""
