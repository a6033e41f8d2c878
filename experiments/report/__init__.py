"""Reporting: per-run CSVs from point artifacts (:mod:`.aggregate`), the analyses the figures
and claims share (:mod:`.analysis`), notebook input/output (:mod:`.figure_io`), headless
notebook rendering (:mod:`.render`), the claims report (:mod:`.claims`) and Markdown as HTML
pages for ``snakemake --report`` (:mod:`.html_page`)."""
