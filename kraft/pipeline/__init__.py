"""PySpark jobs over kraft logs: the ``kraft-log`` reader, exact compaction, the metadata report.

Needs the ``pipeline`` extra (pyspark, pyarrow, pandas, matplotlib) and a JRE; nothing outside this
package and ``kraft.cli.pipeline`` imports it.  API notes: ``docs/internals/pipeline.md``.
"""
