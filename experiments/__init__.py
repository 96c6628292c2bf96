"""The paper's findings and the project's benchmarks at small scale, one module per experiment.

Each runs from the repository root as `python -m experiments.<name>`; shared pieces
(`stages`, `pixel_baselines`) are imported as `from experiments import ...`.
"""
