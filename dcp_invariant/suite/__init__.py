"""The torch-running suite: the runner, its worker pool, the scenario drivers and the tasks their
workers run, the torchrun launcher and its guard, and the registered fixture.

The runner process itself never imports torch; only workers do.
"""
