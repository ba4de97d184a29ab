"""``python -m adopter``: the same entry point as the ``adopter`` console script."""

from .launcher import main

main()
