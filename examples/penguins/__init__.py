"""The penguins-report example workflow: the task functions live in ``tasks``."""
