"""Experience: the bank of the agent's own successful training trajectories, and retrieval from it.

Shared by retrieval RL (:mod:`methods.retrieval_rl`, the student reads the
retrieved trajectories as text) and LOPD (a composer compresses them into
latent tokens for the teacher).  ``docs/methods.md`` ("Experience
bank", under "Pieces several methods share"):

* only *training-split* successes enter (tool use: reward >= threshold,
  default 1.0; code: all tests pass), as task text plus a compact
  action -> result trace (:func:`tasks.base.format_trace`);
* retrieval is dense: documents embed task + trajectory, queries embed the task
  alone (the paper's version), with all-MiniLM-L6-v2
  (:mod:`.encoder`), over a FAISS inner-product index of unit vectors
  (:mod:`.index`);
* a task never retrieves its own trajectories (``allow_self_retrieval`` is an
  opt-in flag for reproducing the reference code, default off);
* the bank grows with a run's own successes, is saved with the run's
  checkpoint, and is frozen for test-time retrieval.
"""

from .bank import BankConfig, Experience, ExperienceBank, LeakError

__all__ = ["BankConfig", "Experience", "ExperienceBank", "LeakError"]
