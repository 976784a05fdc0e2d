"""Several models on one GPU node: placement, its picture, and what it renders to."""
