"""The payload: the lock (uv, hashes, layer plan, lock-time checks) and what a built image carries."""
