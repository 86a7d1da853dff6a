"""`python -m nmt_cli ...` (also what `torchrun -m nmt_cli train ...` runs)."""

from nmt_cli.cli import main

if __name__ == "__main__":
    main()
