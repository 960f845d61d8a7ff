"""fedskew's benchmarks and the scripts that make its docs' tables (docs/performance.md). A regular package, so
that ``import benchmarks`` from the repository root finds these files before any installed package of the same
name (Opacus ships one)."""
