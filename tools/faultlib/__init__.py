"""Fault campaign parts for tools/faults.py and the `faults`-marked tests.

Each part runs a number of injected faults and returns a figure: a dict with `fault`,
`how` (what was done), `count`, `ok` (how many ended as they should) and `notes`.
"""
