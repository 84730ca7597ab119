"""`python -m specdec_ref.training`: train the tiny pair, measure it, write its card."""

from .train import main

main()
