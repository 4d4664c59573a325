"""The acceptance run for a machine with a GPU: ``python -m lyre.gpucheck``.

One command, stage by stage, each timed and reported pass/fail with the reason, stopping at the
first failure; one report file (``REPORT.md``) to read or attach to an issue. Kept light: setup.sh
runs :mod:`lyre.gpucheck.prereqs` before anything is installed.
"""
