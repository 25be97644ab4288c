"""Learning: models (encoders, heads), distributions, losses (PPO, IMPALA), optimizers and the pure update
``(params, opt_state, batch, hparams) -> (params, opt_state, metrics)``. Touches no files; takes env shapes and
action specs (``fastrl.envs.spaces``) as given."""
