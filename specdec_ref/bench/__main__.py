"""`python -m specdec_ref.bench`: run the benchmark, print its table, write its JSON report."""

from .run import main

main()
