"""LightningModules: thin wiring of models, losses, optimisers, logging and exact resume."""
