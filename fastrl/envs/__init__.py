"""Environments: EnvPool (sync and async), the Gymnasium vector env and TorchRL adapters, the torch-native suite,
their spaces and the rollout buffer they fill. Knows nothing of models or runs.

``registry`` names envs and picks the backend, ``batched`` steps a batch of them (``make_env``, ``probe_env``),
``stats`` holds what every backend shares (step tensors, episode statistics, normalizers)."""
