# The verl backend (docs/verl.md): a profile with `backend: verl` trains each run with verl's main_ppo
# instead of the suite's loop, and turns verl's records into the same run files (summary.json,
# metrics.jsonl), so that Table 1 and every analysis read them unchanged. verl's processes import the
# suite's plugin through VERL_USE_EXTERNAL_MODULES (the entry point works only where the suite is
# installed), with the checkout on PYTHONPATH. UNTESTED on a GPU so far.
if BACKEND == "verl":
    from methods.verl_backend import check_profile

    check_profile(config)  # every selected method has a verl path, before any job starts

    rule verl_data:
        """A domain's training split and held-out tasks as verl's RL parquet files."""
        output:
            train=f"{OUT}/verl/data/{{domain}}/train.parquet",
            test=f"{OUT}/verl/data/{{domain}}/test.parquet",
        log:
            f"{OUT}/logs/verl_data/{{domain}}.log",
        conda:
            "../envs/suite.yaml"
        threads: 1
        params:
            job=lambda w: job_json(w.domain),
            out=lambda w: f"{OUT}/verl/data/{w.domain}",
        shell:
            "python -m methods.core.forkserver methods.cli export-verl --job {params.job} --out {params.out} > {log} 2>&1"

    rule verl_train:
        """One method on one domain and seed through verl's main_ppo (its config generated from the job and
        checked by verl's validation), then the suite's run files from verl's log and validation dumps."""
        input:
            ws=f"{OUT}/warmstart/{{domain}}/eval.json",
            data=rules.verl_data.output,
            bank=lambda w: [f"{OUT}/bank/{w.domain}/bank.pt"] if uses_bank(config, w.method) else [],
        output:
            f"{OUT}/runs/{{domain}}/{{method}}/seed{{seed}}/summary.json",
        log:
            f"{OUT}/logs/train/{{domain}}/{{method}}/seed{{seed}}.log",
        wildcard_constraints:
            seed=r"\d+",
        conda:
            "../envs/verl.yaml"
        threads: 1
        resources:
            # every method's teacher lives on the student's GPUs (methods/verl_backend/launch.py); locally, pass
            # --resources gpu=N so that no more runs start at once than the machine has GPUs for
            gpu=BACKEND_OPTIONS.get("gpus", 1),
        params:
            job=lambda w: job_json(w.domain, w.method),
            model=lambda w: f"{OUT}/warmstart/{w.domain}/model",
            data=lambda w: f"{OUT}/verl/data/{w.domain}",
            run=lambda w: f"{OUT}/verl/runs/{w.domain}/{w.method}/seed{w.seed}",
            out=lambda w: f"{OUT}/runs/{w.domain}/{w.method}/seed{w.seed}",
            gpus=BACKEND_OPTIONS.get("gpus", 1),
            bank=lambda w: f"--bank {OUT}/bank/{w.domain}/bank.pt" if uses_bank(config, w.method) else "",
        shell:
            "python -m methods.core.forkserver methods.cli verl-config --job {params.job} --seed {wildcards.seed} --model {params.model} "
            "--data {params.data} --run {params.run} --gpus {params.gpus} {params.bank} "
            "--out {params.run}/main_ppo.yaml > {log} 2>&1 && "
            "PYTHONPATH=$(pwd):${{PYTHONPATH:-}} VERL_USE_EXTERNAL_MODULES=methods.verl_backend.plugin "
            "VERL_FILE_LOGGER_PATH={params.run}/verl.$(date +%s).jsonl python -m verl.trainer.main_ppo "
            "--config-path $(realpath {params.run}) --config-name main_ppo >> {log} 2>&1 && "
            "python -m methods.core.forkserver methods.cli verl-run-files --job {params.job} --method {wildcards.method} --seed {wildcards.seed} "
            "--verl-log {params.run}/verl.*.jsonl --val-dir {params.run}/val "
            "{params.bank} --out {params.out} >> {log} 2>&1"
