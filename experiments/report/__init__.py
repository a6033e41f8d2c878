"""Reporting: per-run CSVs from point artifacts (:mod:`.aggregate`), the analyses the figures
and claims share (:mod:`.analysis`), notebook input/output (:mod:`.figure_io`), headless
notebook rendering (:mod:`.render`) and the claims report (:mod:`.claims`)."""
