"""``record``'s bootstrap: ``sitecustomize``, put first on every recorded Python process's path.
It imports only the standard library (and ``recording/imports.py`` by its path) until torch is
imported, then starts a capture through the public API (the package face), as a user's script
would: part of ``capture``, and like it above the collectors.
"""
