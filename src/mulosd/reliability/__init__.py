"""The reliability battery: DESIGN §9's promises, each tested by counting (python -m mulosd.reliability)."""
