"""What every experiment writes: the layout of ``artifacts/`` (:mod:`.paths`), one measured
point's command line and JSON artifact (:mod:`.point`), the environment it ran in
(:mod:`.environment`), atomic writes (:mod:`.atomic`) and the record of a pipeline run
(:mod:`.run_record`). Importing :mod:`.paths` is cheap (no torch): the Snakefile imports it
when it is parsed."""
