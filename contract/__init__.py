"""The workstation <-> instance contract: result records, results layout, spec and status.

Both sides import this package; it imports nothing else of ours.
"""
