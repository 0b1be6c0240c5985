"""A job's tasks as verl's RL parquet files (the rows ``verl.utils.dataset.RLHFDataset`` reads).

The suite's loop trains on ``domain.tasks("train")`` and evaluates on the held-out domain's
``tasks("test", eval_episodes)``; a verl run must see exactly those tasks.  Each row carries the
chat messages verl's agent loop will template (the domain's system message, if any, and the task's
prompt: the same messages the suite's rollout engine encodes, :func:`methods.core.rollout.initial_prompt_ids`)
and, in ``extra_info``, what the suite's episode needs to rebuild the task: the domain's name,
version, seed and options, and the task's id.  A task's private payload (hidden tests, initial
state) is not written: the domain regenerates it from the seed, and the version check refuses a
domain whose generator has changed.

Columns (verl's RL dataset format): ``data_source``, ``prompt`` (list of ``{role, content}``),
``ability``, ``reward_model`` (``style``, ``ground_truth``), ``agent_name``, ``extra_info``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from tasks.base import Task, TaskDomain, get_domain

__all__ = ["AGENT_NAME", "task_rows", "export_job", "task_of_row"]

#: the agent loop (``agent_name`` column) that plays a row as a suite episode
AGENT_NAME = "lopd_bench_episode"


def _messages(domain: TaskDomain, task: Task) -> list[dict[str, str]]:
    system = domain.system_message()
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": task.prompt}]


def task_rows(domain: TaskDomain, tasks: Sequence[Task], split: str) -> list[dict]:
    """One verl row per task, in order (``extra_info.index`` is the position)."""
    options = json.dumps(domain.options, sort_keys=True)
    return [
        {
            "data_source": f"lopd_bench/{domain.name}",
            "prompt": _messages(domain, task),
            "ability": domain.name,
            "reward_model": {"style": "rule", "ground_truth": task.reference},
            "agent_name": AGENT_NAME,
            "extra_info": {
                "split": split,
                "index": i,
                "split_size": len(tasks),  # tasks(split, n) is deterministic in n: the rows rebuild the same list
                "task_id": task.task_id,
                "domain": domain.name,
                "domain_version": domain.version,
                "domain_seed": domain.seed,
                "domain_options": options,
                "max_turns": task.max_turns,
            },
        }
        for i, task in enumerate(tasks)
    ]


def _write(rows: list[dict], path: Path) -> None:
    """Write atomically: a crash leaves the previous file or none, never half of one."""
    tmp = path.with_name(path.name + ".partial")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    os.replace(tmp, path)


def export_job(job: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write ``train.parquet`` (the job's training split) and ``test.parquet`` (its held-out tasks:
    the evaluation-only benchmark where the profile names one) under ``out_dir``."""
    from methods.core.loop import TrainConfig
    from methods.core.registry import make_config

    eval_episodes = make_config(TrainConfig, job["train"], "train").eval_episodes
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    domain = get_domain(job["domain"], seed=job["task_seed"], **job["domain_options"])
    heldout = get_domain(job["heldout_domain"]) if job.get("heldout_domain") else domain
    try:
        paths = {"train": out / "train.parquet", "test": out / "test.parquet"}
        _write(task_rows(domain, domain.tasks("train"), "train"), paths["train"])
        _write(task_rows(heldout, heldout.tasks("test", eval_episodes), "test"), paths["test"])
    finally:
        domain.close()
        if heldout is not domain:
            heldout.close()
    return paths


def task_of_row(extra_info: dict, cache: dict | None = None) -> tuple[TaskDomain, Task]:
    """The domain and task a row names (``extra_info`` as :func:`task_rows` wrote it).  ``cache``
    (a dict the caller keeps) holds the built domains and their task indexes across rows.  A domain
    whose version differs from the row's is an error: its generator changed since the export, so
    the task id may name another task."""
    cache = cache if cache is not None else {}
    key = (extra_info["domain"], extra_info["domain_seed"], extra_info["domain_options"])
    if key not in cache:
        cache[key] = (get_domain(key[0], seed=key[1], **json.loads(key[2])), {})
    domain, indexes = cache[key]
    if domain.version != extra_info["domain_version"]:
        raise ValueError(
            f"{domain.name} is at version {domain.version}, the row was exported at {extra_info['domain_version']}: "
            "export the tasks again"
        )
    split = extra_info["split"], extra_info["split_size"]
    if split not in indexes:
        indexes[split] = {t.task_id: t for t in domain.tasks(*split)}
    task = indexes[split].get(extra_info["task_id"])
    if task is None:
        raise KeyError(f"{domain.name} has no {split[0]} task {extra_info['task_id']!r}")
    return domain, task
