"""The verl backend: the suite's methods on verl (0.9.1) for runs larger than one device.

What exists so far (``docs/verl.md`` tracks the rest):

* :mod:`.plugin` -- the suite's GRPO advantage (with its zero-variance-group handling), its PPO
  loss and its sampled-token reverse KL, registered in verl's own registries.  verl imports the
  module in each of its processes through the ``verl.plugins`` entry point (``pyproject.toml``).
* :mod:`.export` -- a domain's train and test splits as verl's RL parquet files, each row naming
  the suite task it renders, so that verl's dataset and the suite's episode see the same task.
* :mod:`.agent_loop` -- the suite's episode as a verl agent loop.
* :mod:`.bank` and :mod:`.trainer` -- retrieval RL: the experience bank as a Ray actor that the
  agent loops query and stage into, and verl's synchronous trainer that grows it after each step.
* :mod:`.distill` -- a teacher that reads a privileged prompt (OPSD and SDFT: the reference
  solution; Skill-SD: a skill, with :mod:`.skills`, the skill library as a Ray actor, and the
  trainer's Skill-SD variant, whose teacher is the student on the rollout servers).
* :mod:`.ema` -- OPSD's and SDFT's teacher: verl's reference model in the actor worker, an EMA of
  the student (SDFT) or the frozen base policy (OPSD, rate 0), scored by the trainer's EMA-teacher
  variant after each step's rollouts.
* :mod:`.adapters` -- each method's verl path: its settings, trainer, agent-loop manager and
  run-file fields, one adapter per method in one registry.
* :mod:`.launch` and :mod:`.metrics` -- a job's ``main_ppo`` config, and the suite's run files
  from a finished verl run.

Nothing here imports verl at package import: ``methods.verl_backend.export`` runs without it.
"""

from methods.verl_backend.adapters import supported_methods

#: methods with a verl path, one adapter each (:mod:`.adapters`; a ``backend: verl`` profile accepts
#: only these; ``docs/verl.md``)
SUPPORTED_METHODS = supported_methods()


def check_profile(config: dict) -> None:
    """Refuse a ``backend: verl`` profile that selects a method without a verl path (its adapter);
    ``rules/verl.smk`` runs this at parse time, before any job starts (the kernel's own validation
    knows nothing of the backend)."""
    from methods.core.config import profile_methods, profile_section, run_entries

    if profile_section(config).get("backend") != "verl":
        raise ValueError(f"profiles.{config.get('profile')}: check_profile is for backend: verl profiles")
    entries = run_entries(config)
    missing = [m for m in profile_methods(config) if (entries[m][1] or {}).get("method", m) not in SUPPORTED_METHODS]
    if missing:
        raise ValueError(
            f"profiles.{config.get('profile')}: backend verl runs {list(SUPPORTED_METHODS)} so far, not {missing} "
            "(select methods: with the profile's methods:, see docs/verl.md)"
        )
