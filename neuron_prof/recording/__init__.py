"""The recording API: what a collector may know of a capture (``api``: the Recorder protocol a
session implements, the Collector protocol collectors implement, framework frames), how to hand
torch a callback without changing what torch does (``torchhooks``), and the post-import hooks
(``imports``) that record's bootstrap shares with them. It sits below the collectors and the
session both, so a collector never imports the session that starts it.

May import: store.
"""
