"""Plan and deploy: the memory plan per node type, the serving plan, KServe manifests, readiness."""
