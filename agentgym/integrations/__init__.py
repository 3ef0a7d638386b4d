"""Adapters that let other RL libraries train on agentgym envs.

Each adapter lives in its own module and imports its library only when used, so
``import agentgym`` never imports them; using an adapter without its library raises one line
naming the extra to install.

- :mod:`agentgym.integrations.trl`: TRL's ``GRPOTrainer``, through ``environment_factory``
  (:class:`~agentgym.integrations.trl.AgentGymEnvironment`, the env's actions as tools) or
  ``rollout_func`` (:class:`~agentgym.integrations.trl.GroupRollout`, multi-turn episodes played
  by the engine, :class:`~agentgym.engine.RolloutEngine`). Extra: ``pip install "agentgym-envs[trl]"``.
- :mod:`agentgym.integrations.openenv`: any id served over OpenEnv's protocol (``agentgym serve
  ID``, :mod:`~agentgym.integrations.openenv_server`) for OpenEnv clients such as
  :class:`~agentgym.integrations.openenv.AgentGymEnvClient`. Extra: ``pip install
  "agentgym-envs[openenv]"``.
- :mod:`agentgym.integrations.verl`: verl's agent loop (``agentgym_agent``, multi-turn episodes
  with env tokens masked out) and a GiGPO advantage estimator (``agentgym_gigpo``). Extra:
  ``pip install "agentgym-envs[verl]"``.
"""
