"""Fetch and cache: the model catalog, checkpoint manifests and checksums, discovery in a bucket, performance twins."""
