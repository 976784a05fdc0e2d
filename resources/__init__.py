"""HOW we talk to the world: object stores, the NVMe cache, quantizer, evaluator, engine."""
