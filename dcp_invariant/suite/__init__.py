"""The torch-running suite: the runner, its worker pool, the scenario drivers and the tasks their
workers run, the torchrun launcher and its guard, the registered fixture, and the benchmark.

The runner process itself never imports torch; only workers do.
"""
