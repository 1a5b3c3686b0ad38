"""The release flow's steps: one thin Prefect task per step over hf2triton's library. Each takes
paths, plain config and the small typed results of earlier steps (and the model kind or deploy
target the flow chose once) and returns a small typed result; call `step.fn(...)` to run one
without Prefect."""
