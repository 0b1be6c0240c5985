"""The pipeline's stages, each beside the command that runs it (``python -m methods.cli <command>``,
which the Snakemake rules call): the base policy (:mod:`.base`), the experience bank and the test
bed (:mod:`.bank`), cold starts and training runs (:mod:`.train`), real models (:mod:`.models`) and
the verl backend's jobs (:mod:`.verl`).  The training kernel they drive is :mod:`methods.core`."""
