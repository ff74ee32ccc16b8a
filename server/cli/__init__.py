"""The ``xpufleet`` command line (SPEC §9): one module per group of commands; ``main.py`` lists them."""
