"""The run on disk: the tables' schema (``schema``), the writer of a rank's append-only Arrow
streams and manifest (``writer``), the one door every reader goes through (``reader``: checksums,
schemas, the step ring), the run as pandas tables (``run``), the JSON documents, safe file access,
string and stack interning, compound keys and the join of host events to the op open at the time.
Everything above reads and writes runs through here; nothing here knows who captured the run.

May import: the root's helpers only.
"""
