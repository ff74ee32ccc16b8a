"""The ``xpufleet`` command line (docs/sidecar.md): one module per group of commands; ``main.py`` lists them."""
