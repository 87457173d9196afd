"""kraft benchmarks: ``python -m bench [--quick] [name …]`` runs ``bench/<name>.py:main()`` for each.

Every benchmark module has a ``main()`` that parses its own ``sys.argv`` options and writes
``bench/results/<name>.json`` (returning the results dict instead also works: the runner then writes
it).  Add a new benchmark by adding its module name to :data:`bench.__main__.BENCHMARKS`.
"""
