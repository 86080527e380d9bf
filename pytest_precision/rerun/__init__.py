"""Rerun: one recorded call resolved to the op it names and run again from its recorded
arguments (in float64, or on another device), under an allowlist of ops that only compute.

The machinery under ``compare`` (was this output what a correct op gives?) and ``replay``
(``replay_op``); it has no public names of its own.
"""
