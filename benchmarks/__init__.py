"""Benchmarks and the scripts that regenerate the docs' measured tables (run as files: python benchmarks/NAME.py).

A regular package, so that ``from benchmarks import structure`` (the tests) finds this folder and not the
top-level ``benchmarks`` package Opacus installs beside itself (the ``privacy`` extra)."""
