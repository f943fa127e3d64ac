"""Helpers shared by the tests: models, emulators, the fault proxy, isolated jobs."""
